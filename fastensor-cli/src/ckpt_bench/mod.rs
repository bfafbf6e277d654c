//! `fastensor ckpt bench`: durable save and cold load of a GPT-2-medium-shaped state dict
//! (about 1.4 GB of f32, 292 tensors) through fastensor (`posix-direct`, and the `Engine`
//! choosing per transfer), the reference `safetensors` crate, and plain buffered I/O, next to
//! the disk's limit measured in the same run.
//!
//! Every save is durable (fsync of the file and its directory); the page cache is dropped
//! before every load. Each round runs the rows in its own shuffled order, so no path always
//! runs after the same one (the device's state after a row's writes, and the memory a row
//! hands back, change the next row's time). The `safetensors` crate saves with `serialize_to_file` followed by an
//! fsync, and loads through a memory map, copying each tensor into an owned buffer (what a
//! framework does when it loads a state dict).

use crate::scratch::Scratch;
mod rows;

use fastensor::posix::DirectBackend;
use fastensor::{Error, MemRef, Result};
use rows::{self as bench, Row};
use safetensors::tensor::{Dtype, SafeTensors, TensorView as StView};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Runs `rounds` rounds at `scale` (1.0: the full 1.4 GB state dict) in `dir`.
pub fn run(dir: &Path, scale: f64, rounds: usize) -> Result<()> {
    check_args(dir, scale)?;
    let rounds = rounds.max(1);
    let descs = bench::gpt2_medium(scale);
    let bufs = bench::state_dict(&descs)?;
    let views = bench::views(&descs, &bufs);
    let bytes = bench::tensor_bytes(&views);
    println!(
        "state dict: {} tensors, {:.1} MiB (scale {scale}), dir {}",
        views.len(),
        bytes as f64 / (1 << 20) as f64,
        dir.display()
    );
    let mut subjects = Subjects {
        views,
        bytes,
        // The memory a model's parameters already occupy: loads "into existing" fill it.
        dests: bench::state_dict(&descs)?,
        backend: DirectBackend::default(),
        engine: fastensor::Engine::builder().build()?,
    };
    let mut all: Vec<Row> = Vec::new();
    for round in 0..rounds {
        all.extend(run_round(dir, round, rounds, &mut subjects)?);
    }
    if rounds > 1 {
        println!("best of {rounds} rounds:");
        println!(
            "{}",
            bench::format_rows(&best_rows(&all), SAFETENSORS, DISK)
        );
    }
    Ok(())
}

/// Refuses a `dir` that is not a directory and a `scale` outside (0, 4].
fn check_args(dir: &Path, scale: f64) -> Result<()> {
    if !dir.is_dir() {
        return Err(Error::new(
            fastensor::ErrorKind::NotFound,
            "the bench directory does not exist",
        )
        .with_path(dir));
    }
    if !(scale > 0.0 && scale <= 4.0) {
        return Err(Error::new(
            fastensor::ErrorKind::InvalidInput,
            format!("--scale {scale} is outside (0, 4]"),
        ));
    }
    Ok(())
}

/// What every round measures: the state dict (its views and bytes), the memory loads
/// "into existing" fill, and the fastensor paths.
struct Subjects<'v> {
    views: Vec<fastensor::checkpoint::TensorView<'v>>,
    bytes: u64,
    dests: Vec<fastensor::HostBuffer>,
    backend: DirectBackend,
    engine: fastensor::Engine,
}

/// Row producers run each round, in an order of the round's own (the first yields two rows).
const ROWS: usize = 7;

/// One round: every row once, in an order of the round's own, printed; returns the rows.
fn run_round(dir: &Path, round: usize, rounds: usize, s: &mut Subjects<'_>) -> Result<Vec<Row>> {
    let path = |name: &str| dir.join(format!("ckpt_bench.{name}"));
    // Removed at the end of the round, or on a signal.
    let scratch: Vec<Scratch> = SCRATCH_NAMES
        .iter()
        .map(|name| Scratch::new(path(name)))
        .collect();
    // A row's time depends on what ran before it (the device's write cache, memory
    // handed back by the previous row): each round runs the rows in its own shuffled
    // order, so no path always follows the same one.
    let order = shuffled(ROWS, round as u64);
    let mut rows: Vec<(usize, Row)> = Vec::with_capacity(ROWS + 1);
    let mut fresh_memory: Option<bench::DiskLimit> = None;
    for &i in &order {
        let row = if i == 0 {
            let limit = bench::disk_limit(&path("raw"), s.bytes)?;
            fresh_memory = Some(limit.clone());
            rows.push((i, limit.device));
            limit.fresh
        } else {
            run_row(i, &path, s)?
        };
        rows.push((i, row));
    }
    rows.sort_by_key(|(i, _)| *i);
    let rows: Vec<Row> = rows.into_iter().map(|(_, r)| r).collect();
    // Every row wrote a file of its own; they go only now, so that no row pays for
    // freeing another's blocks (online discard makes that slow), and the device gets
    // to finish those discards before the next round.
    drop(scratch);
    bench::quiesce(std::time::Duration::from_secs(3));
    if rounds > 1 {
        let names: Vec<String> = order.iter().map(|i| (i + 1).to_string()).collect();
        println!(
            "\nround {} (rows run in the order {})",
            round + 1,
            names.join(", ")
        );
    }
    println!("{}", bench::format_rows(&rows, SAFETENSORS, DISK));
    if let Some(l) = &fresh_memory {
        println!(
            "limit into fresh memory: {} threads faulted in {:.1} MiB of fresh memory in {:.3} s while the raw loop read the file in {:.3} s",
            l.threads,
            l.fresh.bytes as f64 / (1u64 << 20) as f64,
            l.fault_in_s,
            l.read_s
        );
    }
    Ok(rows)
}

/// Row `i` (1 to 6; row 0, the device's limits, is two rows: see [`run_round`]).
fn run_row(i: usize, path: &dyn Fn(&str) -> PathBuf, s: &mut Subjects<'_>) -> Result<Row> {
    let views = &s.views;
    Ok(match i {
        1 => bench::fastensor_row(&s.backend, &path("fastensor.safetensors"), views)?,
        2 => {
            let mut r = bench::fastensor_row(&s.engine, &path("engine.safetensors"), views)?;
            r.label = "fastensor via Engine".into();
            r
        }
        3 => safetensors_row(&path("st.safetensors"), views)?,
        4 => bench::fastensor_into_row(
            &s.backend,
            &path("fastensor-into.safetensors"),
            views,
            &mut s.dests,
        )?,
        5 => safetensors_into_row(&path("st-into.safetensors"), views, &mut s.dests)?,
        _ => bench::buffered_row(&path("plain"), &[], views)?,
    })
}

/// Each row's best save and best load over the rounds.
fn best_rows(all: &[Row]) -> Vec<Row> {
    [
        DISK,
        bench::DISK_FRESH_LABEL,
        "fastensor",
        "fastensor via Engine",
        SAFETENSORS,
        INTO,
        SAFETENSORS_INTO,
        "plain buffered + fsync",
    ]
    .iter()
    .filter_map(|l| {
        let mine: Vec<&Row> = all.iter().filter(|r| r.label == *l).collect();
        let mut b = (*mine.first()?).clone();
        for r in mine {
            if r.save.wall_s < b.save.wall_s {
                b.save = r.save;
            }
            if r.load.wall_s < b.load.wall_s {
                b.load = r.load;
            }
        }
        Some(b)
    })
    .collect()
}

/// `0..n` in an order fixed by `seed` (a Fisher-Yates shuffle driven by splitmix64).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed.wrapping_mul(0x2545_F491_4F6C_DD1D);
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// The files of a round (`DIR/ckpt_bench.NAME`).
const SCRATCH_NAMES: [&str; 7] = [
    "raw",
    "fastensor.safetensors",
    "engine.safetensors",
    "st.safetensors",
    "fastensor-into.safetensors",
    "st-into.safetensors",
    "plain",
];

const SAFETENSORS: &str = "safetensors crate (mmap)";
const INTO: &str = "fastensor, into existing";
const SAFETENSORS_INTO: &str = "safetensors, into existing";
const DISK: &str = bench::DISK_LABEL;

fn st_err(e: safetensors::SafeTensorError) -> Error {
    Error::new(fastensor::ErrorKind::Other, format!("safetensors: {e}"))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(e, "safetensors bench").with_path(path)
}

/// `serialize_to_file` + fsync of the file and its directory; load through mmap, copying
/// every tensor into an owned buffer.
fn safetensors_row(path: &Path, views: &[fastensor::checkpoint::TensorView<'_>]) -> Result<Row> {
    safetensors_measure(SAFETENSORS, path, views, |st| {
        let owned: Vec<Vec<u8>> = st
            .tensors()
            .into_iter()
            .map(|(_, t)| t.data().to_vec())
            .collect();
        assert_eq!(owned.len(), views.len());
    })
}

/// As [`safetensors_row`], but the load copies every tensor from the map into existing,
/// already written buffers (a model's parameters), so it pays no fresh page faults.
fn safetensors_into_row(
    path: &Path,
    views: &[fastensor::checkpoint::TensorView<'_>],
    dests: &mut [fastensor::HostBuffer],
) -> Result<Row> {
    safetensors_measure(SAFETENSORS_INTO, path, views, |st| {
        for (v, d) in views.iter().zip(dests.iter_mut()) {
            let t = st.tensor(&v.desc.name).expect("saved above");
            d.copy_from_slice(t.data());
        }
    })
}

/// The safetensors crate's save (see [`safetensors_row`]) and a load through a memory map
/// that hands the parsed file to `consume`.
fn safetensors_measure(
    label: &str,
    path: &Path,
    views: &[fastensor::checkpoint::TensorView<'_>],
    consume: impl FnOnce(&SafeTensors<'_>),
) -> Result<Row> {
    bench::measure(
        label,
        bench::tensor_bytes(views),
        path,
        || {
            let st: Vec<(String, StView<'_>)> = views
                .iter()
                .map(|t| {
                    let dtype: Dtype =
                        serde_json::from_str(&format!("\"{}\"", t.desc.dtype.name()))
                            .expect("a dtype safetensors knows");
                    let shape = t.desc.shape.iter().map(|&d| d as usize).collect();
                    let MemRef::Host(data) = t.data else {
                        unreachable!("host tensors")
                    };
                    (
                        t.desc.name.clone(),
                        StView::new(dtype, shape, data).expect("valid view"),
                    )
                })
                .collect();
            safetensors::serialize_to_file(st, None, path).map_err(st_err)?;
            File::open(path)
                .and_then(|f| f.sync_all())
                .map_err(io(path))?;
            let dir = path.parent().unwrap_or(Path::new("."));
            File::open(dir).and_then(|d| d.sync_all()).map_err(io(path))
        },
        || {
            let file = File::open(path).map_err(io(path))?;
            // SAFETY: the benchmark owns the file in its own directory and nothing modifies it
            // while it is mapped.
            #[allow(unsafe_code)]
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(path))?;
            let st = SafeTensors::deserialize(&map).map_err(st_err)?;
            consume(&st);
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::shuffled;

    #[test]
    fn every_round_runs_every_row_once_in_its_own_order() {
        let orders: Vec<Vec<usize>> = (0..7).map(|r| shuffled(7, r)).collect();
        for o in &orders {
            let mut sorted = o.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..7).collect::<Vec<_>>());
        }
        assert_eq!(shuffled(7, 3), orders[3], "deterministic");
        let distinct: std::collections::BTreeSet<&Vec<usize>> = orders.iter().collect();
        assert!(distinct.len() >= 6, "{orders:?}");
    }
}
