//! A dictionary rendered for people: the table `fastensor tune` and engine reports print.

use fastensor_select::{
    human_bytes, CandidateState, ContextKey, ContextRecord, Dictionary, Objective,
};
use std::fmt;

/// Renders a [`Dictionary`] as a table: one line per context with the choice and every
/// candidate's median throughput (GB/s, wall clock), CPU cost, and sample count.
#[derive(Debug, Clone, Copy)]
pub struct Table<'a>(pub &'a Dictionary);

impl fmt::Display for Table<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dict = self.0;
        write_machine(f, dict)?;
        let objective = dict.objective();
        let mut rows = vec![[
            "dir".to_string(),
            "mem".into(),
            "size".into(),
            "qd".into(),
            "cache".into(),
            "fs@dev".into(),
            "choice".into(),
            "candidates: GB/s, cpu ns/B, samples (x = dropped)".into(),
        ]];
        rows.extend(
            dict.contexts
                .iter()
                .filter_map(|c| context_row(c, objective)),
        );
        write_columns(f, &rows)
    }
}

/// The dictionary's first lines: its version, objective and kernel, and one line per device.
fn write_machine(f: &mut fmt::Formatter<'_>, dict: &Dictionary) -> fmt::Result {
    writeln!(
        f,
        "fastensor dictionary v{}  objective {}  kernel {}",
        dict.version,
        dict.objective,
        if dict.fingerprint.kernel.is_empty() {
            "?"
        } else {
            &dict.fingerprint.kernel
        }
    )?;
    for d in &dict.fingerprint.devices {
        writeln!(
            f,
            "device {} {} {}",
            d.device,
            if d.fs_type.is_empty() {
                "?"
            } else {
                &d.fs_type
            },
            if d.model.is_empty() {
                "(no model)"
            } else {
                &d.model
            }
        )?;
    }
    Ok(())
}

/// The row of one context (`None` for a key this build cannot read): its key, choice, and
/// candidates cheapest first under `objective`.
fn context_row(c: &ContextRecord, objective: Objective) -> Option<[String; 8]> {
    let key = c.key().ok()?;
    let state = c.state();
    let mut cands: Vec<(f64, String)> = state
        .candidates
        .iter()
        .map(|(name, cs)| {
            let cost = cs
                .samples
                .estimate(objective)
                .map_or(f64::INFINITY, |e| e.median);
            (cost, candidate_cell(name, cs))
        })
        .collect();
    cands.sort_by(|a, b| a.0.total_cmp(&b.0));
    let qd = 1u32 << key.in_flight;
    Some([
        key.direction.to_string(),
        key.memory.to_string(),
        human_bytes(key.size_class_start()),
        if key.in_flight >= ContextKey::MAX_IN_FLIGHT_CLASS {
            format!("{qd}+")
        } else {
            qd.to_string()
        },
        key.cache_label().to_string(),
        format!("{}@{}", key.fs_type, key.device),
        c.choice.clone().unwrap_or_else(|| "(exploring)".into()),
        cands
            .into_iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>()
            .join(" | "),
    ])
}

/// One candidate: `name GB/s cpu-ns/B nSAMPLES`, ` x` when dropped.
fn candidate_cell(name: &str, cs: &CandidateState) -> String {
    let n = cs.samples.len();
    let dropped = if cs.is_dropped() { " x" } else { "" };
    let time = cs.samples.estimate(Objective::Time);
    let cpu = cs.samples.estimate(Objective::Cpu);
    match (time, cpu) {
        (Some(t), Some(p)) => format!(
            "{name} {:.3} {:.3} n{n}{dropped}",
            if t.median > 0.0 {
                1.0 / t.median
            } else {
                f64::INFINITY
            },
            p.median,
        ),
        _ => format!("{name} - n0{dropped}"),
    }
}

/// The rows in columns as wide as their widest cell (the last column left as it is).
fn write_columns(f: &mut fmt::Formatter<'_>, rows: &[[String; 8]]) -> fmt::Result {
    let widths: Vec<usize> = (0..8)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        writeln!(f, "{}", line.trim_end())?;
    }
    Ok(())
}
