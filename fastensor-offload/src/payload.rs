//! What a `put` hands the store: a buffer it owns, or memory that stays owned elsewhere (a
//! framework's tensor) and is written from in place, without a copy.

use fastensor_core::device_copies::PinnedBytes;
use fastensor_core::HostBuffer;
use std::fmt;
use std::ops::Deref;

/// Memory owned by someone else (a PyTorch tensor, say) that the store writes from in place.
/// The store keeps the value until the tensor's write has finished (or its handle is
/// dropped), then drops it: dropping gives the memory back to its owner.
pub trait ForeignBytes: Send + Sync {
    /// The bytes; the same slice, unchanged, for as long as the value lives.
    fn bytes(&self) -> &[u8];
}

/// Host bytes of a tensor: handed to [`OffloadStore::put`](super::OffloadStore::put), or
/// held by the store (written from, kept, read back into).
pub enum Payload {
    /// A buffer the store owns (and may keep in memory after its write, as a prefetch).
    Owned(HostBuffer),
    /// Memory owned elsewhere, written in place and given back once written.
    Foreign(Box<dyn ForeignBytes>),
    /// A block of a GPU's pinned pool (a GPU tensor on its way to or from the disk).
    Pinned(Box<dyn PinnedBytes>),
}

impl Payload {
    /// Memory owned elsewhere (see [`ForeignBytes`]).
    pub fn foreign(bytes: impl ForeignBytes + 'static) -> Self {
        Payload::Foreign(Box::new(bytes))
    }
}

impl From<HostBuffer> for Payload {
    fn from(b: HostBuffer) -> Self {
        Payload::Owned(b)
    }
}

impl Deref for Payload {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Payload::Owned(b) => b,
            Payload::Foreign(f) => f.bytes(),
            Payload::Pinned(b) => b.bytes(),
        }
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            Payload::Owned(_) => "Owned",
            Payload::Foreign(_) => "Foreign",
            Payload::Pinned(_) => "Pinned",
        };
        write!(f, "Payload::{kind}({} bytes)", self.len())
    }
}
