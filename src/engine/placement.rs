//! Where a load into new host memory puts its bytes: the file's page-cache pages mapped
//! copy-on-write, or fresh memory read into through a backend. `fastensor tune` measures
//! both on the tuned directory's device (fresh memory's fault and zeroing cost included)
//! and keeps the winner in the profile, under `[knobs.engine] new_loads`.

use super::{evict, Engine};
use crate::checkpoint::{self, TensorView};
use fastensor_core::{DType, Error, ErrorKind, HostBuffer, Result, TensorDesc};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// The profile's section of engine-wide settings (`[knobs.engine]`), beside the backends'.
pub(crate) const SECTION: &str = "engine";
/// Its key for [`NewLoads`].
const KEY: &str = "new_loads";

pub use fastensor_core::policy::NewLoads;

/// The placement a profile's knobs hold (`None`: not measured, or a value this build does
/// not know).
pub(crate) fn from_knobs(knobs: &BTreeMap<String, BTreeMap<String, String>>) -> Option<NewLoads> {
    let value = knobs.get(SECTION)?.get(KEY)?;
    [NewLoads::Mapped, NewLoads::Read]
        .into_iter()
        .find(|p| p.as_str() == value)
}

/// What `measure` found: the median time of a cold load of the same checkpoint each way.
#[derive(Debug, Clone)]
pub struct NewLoadsMeasured {
    /// Bytes of the checkpoint loaded.
    pub bytes: u64,
    /// Mapped, its pages brought in; `None` where the file could not be mapped (no read
    /// lease, a file system that cannot map it: such loads read it).
    pub mapped: Option<Duration>,
    /// Read into fresh memory.
    pub read: Duration,
    /// The winner: reading only when it is faster by more than `READ_MARGIN`.
    pub choice: NewLoads,
}

/// How much faster reading into fresh memory must be to be chosen over mapping: a quarter.
/// A mapping pays no zeroing, reads nothing where the pages are cached already, and its
/// time varies least; fresh memory measured in one process for a short while is cheaper
/// than a new process's (whose memory the kernel, or a hypervisor, may have to find first).
pub const READ_MARGIN: f64 = 0.25;

/// Bytes of each tensor of the checkpoint measured, and how many tensors.
const TENSOR_BYTES: usize = 64 << 20;
const TENSORS: usize = 8;
/// Cold loads each way, interleaved.
const ROUNDS: usize = 3;

impl NewLoadsMeasured {
    /// Stores the choice, and the rates that made it, in a profile's knobs.
    pub(crate) fn store(&self, knobs: &mut BTreeMap<String, BTreeMap<String, String>>) {
        let gb_per_s = |d: Duration| format!("{:.2}", self.bytes as f64 / d.as_secs_f64() / 1e9);
        let section = knobs.entry(SECTION.to_string()).or_default();
        section.insert(KEY.to_string(), self.choice.as_str().to_string());
        if let Some(mapped) = self.mapped {
            section.insert("mapped_gb_per_s".to_string(), gb_per_s(mapped));
        }
        section.insert("read_gb_per_s".to_string(), gb_per_s(self.read));
    }
}

/// Loads a checkpoint of 512 MiB saved in `dir` cold, mapped and read into fresh memory in
/// turn ([`ROUNDS`] times each), and says which placement wins. The file's name is removed
/// as soon as it is open: nothing is left behind however the process ends.
pub(crate) fn measure(engine: &Engine, dir: &Path) -> Result<NewLoadsMeasured> {
    let named = dir.join(format!(
        ".fastensor-tune-loads-{}.safetensors",
        std::process::id()
    ));
    let mut data = HostBuffer::new(TENSOR_BYTES)?;
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1];
    }
    let views: Vec<TensorView<'_>> = (0..TENSORS)
        .map(|i| {
            let desc = TensorDesc::new(format!("t{i}"), DType::U8, vec![TENSOR_BYTES as u64]);
            TensorView::new(desc, &data[..])
        })
        .collect();
    checkpoint::save(engine, &named, &views)?;
    let opened = std::fs::File::open(&named);
    let _ = std::fs::remove_file(&named);
    let file = opened.map_err(|e| Error::io(e, "cannot open the checkpoint").with_path(&named))?;
    let path = crate::atomic::fd_path(&file);
    let (mut mapped, mut read) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 {
            [NewLoads::Mapped, NewLoads::Read]
        } else {
            [NewLoads::Read, NewLoads::Mapped]
        };
        for placement in order {
            evict(&path)?;
            let start = Instant::now();
            let (loaded, ended) = checkpoint::load_placed(engine, &path, placement)?;
            let took = start.elapsed();
            if loaded.len() != TENSORS {
                return Err(
                    Error::new(ErrorKind::Corrupt, "the measured load lost tensors")
                        .with_path(&named),
                );
            }
            drop(loaded);
            // Timed as what it did: a mapping refused here (no read lease, a file system
            // that cannot map) was a read.
            match ended {
                NewLoads::Mapped => mapped.push(took),
                NewLoads::Read => read.push(took),
            }
        }
    }
    let read = median(read);
    let (mapped, choice) = if mapped.is_empty() {
        (None, NewLoads::Read) // nothing maps here
    } else {
        let mapped = median(mapped);
        let faster = read.as_secs_f64() * (1.0 + READ_MARGIN) < mapped.as_secs_f64();
        let choice = if faster {
            NewLoads::Read
        } else {
            NewLoads::Mapped
        };
        (Some(mapped), choice)
    };
    Ok(NewLoadsMeasured {
        bytes: (TENSOR_BYTES * TENSORS) as u64,
        mapped,
        read,
        choice,
    })
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_choice_reads_back() {
        for choice in [NewLoads::Mapped, NewLoads::Read] {
            let measured = NewLoadsMeasured {
                bytes: 1 << 30,
                mapped: Some(Duration::from_millis(500)),
                read: Duration::from_millis(400),
                choice,
            };
            let mut knobs = BTreeMap::new();
            measured.store(&mut knobs);
            assert_eq!(from_knobs(&knobs), Some(choice));
            assert_eq!(knobs[SECTION]["read_gb_per_s"], "2.68");
        }
        assert_eq!(from_knobs(&BTreeMap::new()), None);
    }
}
