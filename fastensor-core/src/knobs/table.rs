//! A backend's knobs as a table: each row names a knob, its candidates and help, and the
//! field of the backend's settings it sets. [`specs`] gives what
//! [`Backend::knobs`](crate::Backend::knobs) returns and [`apply`] what
//! [`Backend::with_knobs`](crate::Backend::with_knobs) builds from, so a backend states each
//! knob once. [`knob_table!`](crate::knob_table) writes the rows.

use super::{KnobSpec, Knobs};
use crate::size::format_size;
use crate::Result;

/// The field of settings `C` that a knob sets, and how its value is parsed and shown.
#[derive(Debug)]
pub enum KnobField<C> {
    /// A count ([`Knobs::count`]; at least 1).
    Count(fn(&mut C) -> &mut usize),
    /// A count held as `u32` ([`Knobs::count`]; larger values saturate at `u32::MAX`).
    Count32(fn(&mut C) -> &mut u32),
    /// A byte size ([`Knobs::size`]; at least 1), shown as [`format_size`] writes it.
    Size(fn(&mut C) -> &mut usize),
    /// A flag ([`Knobs::flag`]).
    Flag(fn(&mut C) -> &mut bool),
}

impl<C> KnobField<C> {
    /// The value of this field in `config`, as a knob value.
    fn show(&self, config: &mut C) -> String {
        match self {
            KnobField::Count(f) => f(config).to_string(),
            KnobField::Count32(f) => f(config).to_string(),
            KnobField::Size(f) => format_size(*f(config) as u64),
            KnobField::Flag(f) => f(config).to_string(),
        }
    }

    /// Sets this field of `config` to knob `name`'s value in `knobs`, when it is set there.
    fn set(&self, config: &mut C, knobs: &Knobs, name: &str) -> Result<()> {
        match self {
            KnobField::Count(f) => set_if(f(config), knobs.count(name)?),
            KnobField::Count32(f) => set_if(
                f(config),
                knobs
                    .count(name)?
                    .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
            ),
            KnobField::Size(f) => set_if(f(config), knobs.size(name)?),
            KnobField::Flag(f) => set_if(f(config), knobs.flag(name)?),
        }
        Ok(())
    }
}

fn set_if<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

/// One knob of a backend whose settings are `C`.
#[derive(Debug)]
pub struct Knob<C> {
    name: &'static str,
    candidates: &'static [&'static str],
    help: &'static str,
    field: KnobField<C>,
}

impl<C> Knob<C> {
    /// Knob `name`, worth trying at `candidates`, doing what `help` says, setting `field`.
    pub const fn new(
        name: &'static str,
        candidates: &'static [&'static str],
        help: &'static str,
        field: KnobField<C>,
    ) -> Self {
        Knob {
            name,
            candidates,
            help,
            field,
        }
    }
}

/// The specs of the knobs of `table`, in its order, their defaults read from `defaults`.
pub fn specs<C>(table: &[Knob<C>], mut defaults: C) -> Vec<KnobSpec> {
    table
        .iter()
        .map(|k| KnobSpec::new(k.name, &k.field.show(&mut defaults), k.candidates, k.help))
        .collect()
}

/// `config` with `knobs` applied, in the order of `table`. A name not in `table`, or a value
/// its knob cannot parse, is an [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput)
/// error (see [`Knobs::check_names`]).
pub fn apply<C: Clone>(backend: &str, table: &[Knob<C>], config: &C, knobs: &Knobs) -> Result<C> {
    knobs.check_names(backend, &specs(table, config.clone()))?;
    let mut config = config.clone();
    for k in table {
        k.field.set(&mut config, knobs, k.name)?;
    }
    Ok(config)
}

/// The rows of a backend's knob table, an array of [`Knob`]s: one row a knob, written
/// `"name", ["candidate", ...], "help", Kind(field);` where `Kind` is a [`KnobField`] variant
/// and `field` the field of the settings it sets.
#[macro_export]
macro_rules! knob_table {
    ($($name:literal, [$($candidate:literal),*], $help:literal, $kind:ident($field:ident);)*) => {
        [$($crate::knobs::Knob::new(
            $name,
            &[$($candidate),*],
            $help,
            $crate::knobs::KnobField::$kind(|c| &mut c.$field),
        ),)*]
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Settings {
        threads: usize,
        depth: u32,
        chunk: usize,
        on: bool,
    }

    const KNOBS: &[Knob<Settings>] = &crate::knob_table![
        "threads", ["1", "4"], "threads", Count(threads);
        "qd", ["16"], "depth", Count32(depth);
        "chunk", ["1M"], "bytes per request", Size(chunk);
        "on", ["true"], "a flag", Flag(on);
    ];

    fn settings() -> Settings {
        Settings {
            threads: 2,
            depth: 8,
            chunk: 4 << 20,
            on: false,
        }
    }

    #[test]
    fn specs_show_the_defaults_and_apply_sets_the_fields() {
        let specs = specs(KNOBS, settings());
        let shown: Vec<(&str, &str)> = specs
            .iter()
            .map(|s| (s.name.as_str(), s.default.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("threads", "2"),
                ("qd", "8"),
                ("chunk", "4M"),
                ("on", "false")
            ]
        );
        assert_eq!(specs[0].candidates, ["1", "4"]);
        assert_eq!(specs[2].help, "bytes per request");

        let mut knobs = Knobs::new();
        knobs
            .set("qd", "99999999999")
            .set("chunk", "512K")
            .set("on", "yes");
        let set = apply("x", KNOBS, &settings(), &knobs).unwrap();
        assert_eq!(
            set,
            Settings {
                threads: 2,
                depth: u32::MAX,
                chunk: 512 << 10,
                on: true,
            }
        );
        knobs.set("nope", "1");
        assert!(apply("x", KNOBS, &settings(), &knobs).is_err());
        let mut bad = Knobs::new();
        bad.set("threads", "0");
        assert!(apply("x", KNOBS, &settings(), &bad).is_err());
    }
}
