//! fastensor's context-aware backend selection. It knows no backend: it sees backend names,
//! transfer contexts and observations only.
//!
//! * **Context** ([`ContextKey`]): direction, memory kind, power-of-two size class, requests
//!   in flight (bucketed), the file's file system and device, and page-cache residency.
//! * **Exploration** ([`Selector::choose`] / [`Selector::record`]): every candidate is
//!   measured [`SelectorConfig::min_samples`] times per context and summarised robustly
//!   (median, MAD); candidates clearly worse than the leader are dropped early (successive
//!   elimination). Unseen contexts are seeded from the other size classes of the same
//!   context through a per-candidate cost model (`latency + bytes * per_byte`).
//! * **Objective** ([`Objective`]): wall time per byte by default, CPU time or a weighted mix.
//! * **Exploitation** ([`Phase::Exploiting`]): the choice is watched for drift (explored
//!   again), gives way only to a clearly better leader, and dropped candidates near it are
//!   looked at again on a doubling schedule. Every number these rules use is in one place
//!   (`selector/config.rs`), each with its reason.
//! * **Dictionary** ([`Dictionary`]): TOML text ([`Dictionary::to_toml`],
//!   [`Dictionary::parse`]) with a format version and a machine [`Fingerprint`]; text that
//!   is no dictionary is an [`ErrorKind::Corrupt`](fastensor_core::ErrorKind) error. The
//!   crate does no I/O: the `fastensor` facade reads and saves dictionaries by path, gathers
//!   the [`MachineFacts`] a fingerprint records, and turns another machine's or version's
//!   dictionary into a warning and a fresh start.
//!
//! ```
//! use fastensor_core::{CacheState, Direction, FileLocation, MemoryKind, Purpose, TransferContext};
//! use fastensor_select::{Observation, Selector, SelectorConfig};
//! use std::time::Duration;
//!
//! let mut selector = Selector::new(SelectorConfig::default());
//! let ctx = TransferContext {
//!     direction: Direction::Read, bytes: 1 << 20, memory: MemoryKind::Host,
//!     location: Default::default(), in_flight: 1, purpose: Purpose::General,
//!     cache: CacheState::Cold,
//! };
//! for _ in 0..10 {
//!     let choice = selector.choose(&ctx, &["fast", "slow"]).unwrap();
//!     let micros = if choice.backend == "fast" { 100 } else { 300 };
//!     let obs = Observation { bytes: 1 << 20, wall: Duration::from_micros(micros), cpu: Duration::ZERO };
//!     selector.record(&ctx, &choice.backend, obs);
//! }
//! assert_eq!(selector.choose(&ctx, &["fast", "slow"]).unwrap().backend, "fast");
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod dictionary;
mod estimate;
mod fingerprint;
mod key;
mod objective;
mod reuse;
mod selector;

pub use dictionary::{CandidateRecord, ContextRecord, Dictionary, FORMAT_VERSION};
pub use estimate::{Estimate, Samples};
pub use fingerprint::{DeviceInfo, Fingerprint, MachineFacts};
pub use key::{human_bytes, in_flight_class, size_class, ContextKey, KeyShape};
pub use objective::{Objective, Observation, Sample};
pub use reuse::Reuse;
pub use selector::{
    CandidateState, Choice, Epochs, KeyState, Phase, Selector, SelectorConfig, SelectorStats,
    Status,
};
