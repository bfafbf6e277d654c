//! fastensor's context-aware backend selection. It knows no backend: it sees backend names,
//! transfer contexts and observations only.
//!
//! * **Context** ([`ContextKey`]): direction, memory kind, power-of-two size class, requests
//!   in flight (bucketed), the file's file system and device, and page-cache residency.
//! * **Exploration** ([`Selector::choose`] / [`Selector::record`]): every candidate is
//!   measured [`SelectorConfig::min_samples`] times per context and summarised robustly
//!   (median, MAD); candidates clearly worse than the leader are dropped early (successive
//!   elimination); every candidate is measured once before any is confirmed, and a cold
//!   read explored from scratch is measured through a path that bypasses the page cache
//!   first (the yardstick that can rule a slow path out on its first reads). Unseen
//!   contexts start from the other size classes of the same context, explored or still
//!   exploring: a per-candidate cost model (`latency + bytes * per_byte`, fitted through
//!   two classes) predicts the new class and skips candidates predicted clearly worse
//!   ([`SelectorConfig::model_margin`]), revising its seeds as the other classes learn.
//! * **Objective** ([`Objective`]): wall time per byte by default, CPU time or a weighted mix.
//! * **Exploitation with drift detection**: when the choice keeps running well above its
//!   estimate (five slow transfers in a row, or two over 3 times its median), the context
//!   is explored again; a choice gives way to another candidate only when that one's
//!   median is more than 5% better (a switch of path is not free); a candidate dropped on
//!   one sample is measured again after 64 transfers of the choice, and every dropped
//!   candidate near the choice after 128, 256, 512, ... more (costs change).
//! * **Dictionary** ([`Dictionary`]): saved atomically as TOML with a format version and a
//!   machine [`Fingerprint`]; another machine's or version's dictionary gives a [`Warning`]
//!   and a fresh start, a corrupt one an [`ErrorKind::Corrupt`](fastensor_core::ErrorKind)
//!   error naming the file.
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

pub use dictionary::{CandidateRecord, ContextRecord, Dictionary, Warning, FORMAT_VERSION};
pub use estimate::{Estimate, Sample, Samples};
pub use fingerprint::{device_model, kernel_release, DeviceInfo, Fingerprint};
pub use key::{human_bytes, in_flight_class, size_class, ContextKey, KeyShape};
pub use objective::{Clock, ClockReading, Objective, Observation};
pub use reuse::Reuse;
pub use selector::{
    CandidateState, Choice, Epochs, KeyState, Phase, Selector, SelectorConfig, SelectorStats,
    Status,
};
