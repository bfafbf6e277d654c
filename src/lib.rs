//! fastensor moves tensors between SSD files and host or GPU memory through the fastest I/O
//! path the machine offers.
//!
//! This facade re-exports the core contracts and links the backend crates its cargo features
//! enable, so that [`registry`] finds them.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub use fastensor_sys as sys;
pub use fastensor_sys::atomic;
pub use fastensor_sys::fork;
pub mod engine;
pub mod profile;

pub use fastensor_core as core;
pub use fastensor_core::{
    Availability, Backend, BackendFile, BackendFileExt, Capabilities, DType, Direction, Error,
    ErrorKind, HostBuffer, MemMut, MemRef, MemoryKind, OpenMode, Origin, Purpose, Registry, Result,
    TensorDesc,
};

pub use engine::{Engine, EngineBuilder, EngineFile, Report};
pub use fastensor_checkpoint as checkpoint;
pub use fastensor_offload as offload;
pub use fastensor_select as select;
pub use fastensor_select::{Dictionary, Objective, SelectorConfig};

/// Dynamic plugins (the `plugins` feature): load backends from shared libraries with
/// [`plugin::RegistryExt`] (`registry.load_plugin(path)`, `registry.load_env_plugins()` for
/// `FASTENSOR_PLUGINS`), or [`plugin::DynamicBackend::load`].
#[cfg(feature = "plugins")]
pub use fastensor_plugin as plugin;

#[cfg(feature = "gds")]
pub use fastensor_gds as gds;
/// Object storage (`s3://`): the stores the engine opens objects through (feature `s3`).
#[cfg(feature = "s3")]
pub use fastensor_object as object;
#[cfg(feature = "posix")]
pub use fastensor_posix as posix;
#[cfg(all(feature = "uring", target_os = "linux"))]
pub use fastensor_uring as uring;

/// Every backend compiled into this build (per the enabled cargo features), by name.
pub fn registry() -> Registry {
    #[cfg(feature = "posix")]
    fastensor_posix::link();
    #[cfg(all(feature = "uring", target_os = "linux"))]
    fastensor_uring::link();
    #[cfg(feature = "gds")]
    fastensor_gds::link();
    Registry::compiled_in()
}
