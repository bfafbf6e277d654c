//! Core contracts of fastensor: tensor descriptors, memory kinds and buffers, the transfer
//! context, the [`Backend`] trait every I/O path implements, the [`Registry`], one
//! [`Error`] type, and the contract of stream-ordered device copies
//! ([`device_copies`]). This crate does no I/O and knows no CUDA.
#![deny(missing_docs)]

/// `Display` for a type that names itself with a method returning `&str` (`as_str`).
macro_rules! display_as_str {
    ($ty:ty, $name:ident) => {
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.$name())
            }
        }
    };
}

/// `impl Debug for $ty`, printed as the struct `$name` with the given fields, each the value
/// of an expression of `$s` (the value printed), the rest elided.
#[macro_export]
#[doc(hidden)]
macro_rules! debug_fields {
    ($ty:ty, $name:literal, |$s:ident| { $($field:ident: $value:expr),* $(,)? }) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let $s = self;
                f.debug_struct($name)
                    $(.field(stringify!($field), &$value))*
                    .finish_non_exhaustive()
            }
        }
    };
}

pub mod align;
mod backend;
mod capabilities;
mod clock;
mod context;
pub mod device_copies;
mod dtype;
mod error;
mod handle;
pub mod knobs;
mod layer;
pub mod location;
mod memory;
pub mod parallel;
pub mod policy;
mod registry;
pub mod size;
mod tensor;

pub use backend::{
    readable_len, unsupported_memory, write_end, Availability, Backend, BackendFile,
    BackendFileExt, Commit, FileOpener, OpenMode, Place, ReadJob, ReadRequest, SharedBackend,
    WriteRequest,
};
pub use capabilities::Capabilities;
pub use clock::{Clock, ClockReading};
pub use context::{CacheState, Direction, FileLocation, Purpose, TransferContext};
pub use dtype::DType;
pub use error::{kind_of_io, Error, ErrorKind, Result};
pub use handle::KnownLen;
pub use knobs::{KnobSpec, Knobs};
pub use layer::{open_inner, LayeredBackend, LayeredFile};
pub use location::{Location, ObjectUrl};
pub use memory::{
    DeviceRange, DeviceSlice, DeviceSliceMut, HostBuffer, MemMut, MemRef, MemoryKind, PAGE_ALIGN,
};
pub use registry::{BackendRegistration, Entry, Origin, Registry};
pub use tensor::TensorDesc;

#[doc(hidden)]
pub use inventory;
