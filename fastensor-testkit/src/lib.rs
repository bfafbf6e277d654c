//! The conformance suite every fastensor backend passes, as plain public functions so that
//! third-party plugin authors can run it on their backends, plus reference backends for tests:
//! an in-memory backend, a throttled wrapper with known costs, and a fault-injecting wrapper.
//!
//! ```no_run
//! # use fastensor_core::Backend;
//! # fn my_backend() -> Box<dyn Backend> { Box::new(fastensor_testkit::MemoryBackend::new()) }
//! fastensor_testkit::conformance::assert_conformance(my_backend().as_ref());
//! ```
#![deny(missing_docs)]

mod cdylib;
pub mod conformance;
pub mod data;
pub mod faulty;
mod memory_backend;
pub mod skip;
pub mod stub;
pub mod test_memory;
pub mod throttled;

pub use cdylib::cdylib;
pub use memory_backend::{MemoryBackend, MEMORY};
