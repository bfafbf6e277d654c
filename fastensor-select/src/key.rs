//! The context key: what two transfers must share for one choice of backend to serve both.

use fastensor_core::{CacheState, Direction, MemoryKind, TransferContext};
use std::fmt;

/// The selector's view of a transfer: the fields of a [`TransferContext`] that decide which
/// backend is fastest, with the byte count and the requests in flight bucketed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContextKey {
    /// Read or write.
    pub direction: Direction,
    /// Where the memory side lives.
    pub memory: MemoryKind,
    /// `floor(log2(bytes))`: class `k` holds transfers of `2^k ..= 2^(k+1) - 1` bytes (class
    /// 0 also holds empty transfers).
    pub size_class: u8,
    /// `floor(log2(requests in flight))`, capped at [`ContextKey::MAX_IN_FLIGHT_CLASS`]: class
    /// 0 is one request, 1 is two or three, 2 is four to seven, 3 is eight or more.
    pub in_flight: u8,
    /// File system type of the file (e.g. `ext4`), empty when unknown.
    pub fs_type: String,
    /// Block device of the file as `major:minor`, empty when unknown.
    pub device: String,
    /// Whether the bytes of a read are likely in the page cache (`Unknown` for writes).
    pub cache: CacheState,
    /// A write whose purpose needs it on the device ([`Purpose::durable_writes`]), measured
    /// until written back: buffered writes cost far more here than in a plain write's
    /// context, so the two are learned apart. Always false for reads.
    ///
    /// [`Purpose::durable_writes`]: fastensor_core::Purpose::durable_writes
    pub durable: bool,
}

impl ContextKey {
    /// The highest in-flight class.
    pub const MAX_IN_FLIGHT_CLASS: u8 = 3;

    /// The key of a transfer.
    pub fn of(ctx: &TransferContext) -> Self {
        let mut key = ContextKey {
            direction: ctx.direction,
            memory: ctx.memory,
            size_class: 0,
            in_flight: 0,
            fs_type: String::new(),
            device: String::new(),
            cache: CacheState::Unknown,
            durable: false,
        };
        key.set_to(ctx);
        key
    }

    /// Makes this the key of `ctx`, reusing the buffers of its strings.
    pub(crate) fn set_to(&mut self, ctx: &TransferContext) {
        let shape = KeyShape::of(ctx);
        self.direction = shape.direction;
        self.memory = shape.memory;
        self.size_class = shape.size_class;
        self.in_flight = shape.in_flight;
        self.cache = shape.cache;
        self.durable = shape.durable;
        self.fs_type.clone_from(&ctx.location.fs_type);
        self.device.clone_from(&ctx.location.device);
    }

    /// The cache column of tables: `cached`, `cold`, `-`, or `sync` for a durable write.
    pub fn cache_label(&self) -> &'static str {
        if self.durable {
            "sync"
        } else {
            cache_str(self.cache)
        }
    }

    /// True when the keys differ at most in their size class.
    pub fn same_but_size(&self, other: &ContextKey) -> bool {
        self.cache == other.cache && self.same_but_size_and_cache(other)
    }

    /// True when the keys differ at most in their size class and page-cache state.
    pub fn same_but_size_and_cache(&self, other: &ContextKey) -> bool {
        self.direction == other.direction
            && self.memory == other.memory
            && self.in_flight == other.in_flight
            && self.fs_type == other.fs_type
            && self.device == other.device
            && self.durable == other.durable
    }

    /// The smallest byte count of the size class.
    pub fn size_class_start(&self) -> u64 {
        1u64 << self.size_class.min(63)
    }
}

/// The fields of a [`ContextKey`] but the file's location (its file system and device):
/// what varies from one transfer of a file to the next. `Copy`, so that a caller can tell
/// two transfers of one file apart by context without building a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyShape {
    /// See [`ContextKey::direction`].
    pub direction: Direction,
    /// See [`ContextKey::memory`].
    pub memory: MemoryKind,
    /// See [`ContextKey::size_class`].
    pub size_class: u8,
    /// See [`ContextKey::in_flight`].
    pub in_flight: u8,
    /// See [`ContextKey::cache`].
    pub cache: CacheState,
    /// See [`ContextKey::durable`].
    pub durable: bool,
}

impl KeyShape {
    /// The shape of the key of `ctx`.
    pub fn of(ctx: &TransferContext) -> Self {
        let write = ctx.direction == Direction::Write;
        KeyShape {
            direction: ctx.direction,
            memory: ctx.memory,
            size_class: size_class(ctx.bytes),
            in_flight: in_flight_class(ctx.in_flight),
            cache: if write {
                CacheState::Unknown
            } else {
                ctx.cache
            },
            durable: write && ctx.purpose.durable_writes(),
        }
    }
}

/// The size class of a byte count: `floor(log2(bytes))`, 0 for 0 and 1.
pub fn size_class(bytes: u64) -> u8 {
    if bytes <= 1 {
        0
    } else {
        (63 - bytes.leading_zeros()) as u8
    }
}

/// The in-flight class of a request count (see [`ContextKey::in_flight`]).
pub fn in_flight_class(in_flight: u32) -> u8 {
    size_class(u64::from(in_flight.max(1))).min(ContextKey::MAX_IN_FLIGHT_CLASS)
}

/// A byte count as `4 KiB`, `16 MiB`, ... (exact powers of two stay integral).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `cached`, `cold` or `-`.
pub fn cache_str(cache: CacheState) -> &'static str {
    match cache {
        CacheState::Unknown => "-",
        CacheState::Cached => "cached",
        CacheState::Cold => "cold",
    }
}

impl fmt::Display for ContextKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let qd = 1u32 << self.in_flight;
        let qd = if self.in_flight >= Self::MAX_IN_FLIGHT_CLASS {
            format!("{qd}+")
        } else {
            qd.to_string()
        };
        write!(
            f,
            "{} {} >={} qd{} {}",
            self.direction,
            self.memory,
            human_bytes(self.size_class_start()),
            qd,
            self.cache_label()
        )?;
        if !self.fs_type.is_empty() || !self.device.is_empty() {
            write!(f, " {}@{}", self.fs_type, self.device)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(1), 0);
        assert_eq!(size_class(4095), 11);
        assert_eq!(size_class(4096), 12);
        assert_eq!(size_class(u64::MAX), 63);
        assert_eq!(in_flight_class(0), 0);
        assert_eq!(in_flight_class(1), 0);
        assert_eq!(in_flight_class(3), 1);
        assert_eq!(in_flight_class(4), 2);
        assert_eq!(in_flight_class(1000), 3);
        assert_eq!(human_bytes(4096), "4 KiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }
}
