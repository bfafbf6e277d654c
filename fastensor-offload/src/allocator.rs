//! The extent allocator of a swap file: first fit over a free list kept sorted by offset,
//! with neighbours coalesced on free. Every extent starts and ends on a 4096-byte boundary
//! so direct I/O applies to it.

use std::collections::BTreeMap;

/// Granularity of extents (bytes): one page, what `O_DIRECT` needs on common file systems.
pub const EXTENT_ALIGN: u64 = 4096;

/// Rounds `len` up to a multiple of [`EXTENT_ALIGN`] (at least one page).
pub fn round_up(len: u64) -> u64 {
    len.max(1).div_ceil(EXTENT_ALIGN) * EXTENT_ALIGN
}

/// A range `[offset, offset + len)` of the swap file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Start, a multiple of [`EXTENT_ALIGN`].
    pub offset: u64,
    /// Length, a multiple of [`EXTENT_ALIGN`].
    pub len: u64,
}

impl Extent {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// First-fit allocator over a file that grows when no free extent fits.
#[derive(Debug, Default)]
pub struct ExtentAllocator {
    /// Free extents: offset -> length, never adjacent (coalesced).
    free: BTreeMap<u64, u64>,
    /// The file's capacity: every byte below it is free or allocated.
    capacity: u64,
    /// Bytes allocated now.
    allocated: u64,
}

impl ExtentAllocator {
    /// An allocator over an empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// The file's capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes allocated now.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// The number of free extents (fragmentation).
    pub fn free_extents(&self) -> usize {
        self.free.len()
    }

    /// Adds `[capacity, new_capacity)` to the free space (no-op when not larger).
    pub fn grow_to(&mut self, new_capacity: u64) {
        let new_capacity = round_up(new_capacity);
        if new_capacity <= self.capacity {
            return;
        }
        let old = self.capacity;
        self.capacity = new_capacity;
        self.insert_free(old, new_capacity - old);
    }

    /// Allocates an extent of at least `len` bytes. When nothing fits, returns the capacity
    /// the file needs (the caller grows the file, calls [`ExtentAllocator::grow_to`] and
    /// retries) as `Err(needed_capacity)`.
    pub fn alloc(&mut self, len: u64) -> Result<Extent, u64> {
        let len = round_up(len);
        let hit = self
            .free
            .iter()
            .find(|(_, &l)| l >= len)
            .map(|(&o, &l)| (o, l));
        match hit {
            Some((offset, free_len)) => {
                self.free.remove(&offset);
                if free_len > len {
                    self.free.insert(offset + len, free_len - len);
                }
                self.allocated += len;
                Ok(Extent { offset, len })
            }
            None => {
                // Reuse a free tail that touches the end of the file.
                let tail = self
                    .free
                    .iter()
                    .next_back()
                    .filter(|(&o, &l)| o + l == self.capacity)
                    .map_or(0, |(_, &l)| l);
                Err(self.capacity + (len - tail))
            }
        }
    }

    /// Returns an extent to the free list, merging it with free neighbours.
    pub fn free(&mut self, extent: Extent) {
        debug_assert!(extent.end() <= self.capacity);
        self.allocated -= extent.len;
        self.insert_free(extent.offset, extent.len);
    }

    fn insert_free(&mut self, mut offset: u64, mut len: u64) {
        if let Some((&po, &pl)) = self.free.range(..offset).next_back() {
            debug_assert!(po + pl <= offset, "double free");
            if po + pl == offset {
                self.free.remove(&po);
                offset = po;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(offset + len)) {
            self.free.remove(&(offset + len));
            len += nl;
        }
        self.free.insert(offset, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(a: &mut ExtentAllocator, len: u64) -> Extent {
        match a.alloc(len) {
            Ok(e) => e,
            Err(need) => {
                a.grow_to(need);
                a.alloc(len).expect("fits after growth")
            }
        }
    }

    #[test]
    fn first_fit_coalesce_and_reuse() {
        let mut a = ExtentAllocator::new();
        let x = alloc(&mut a, 1);
        let y = alloc(&mut a, 5000);
        let z = alloc(&mut a, 4096);
        assert_eq!((x.offset, x.len), (0, 4096));
        assert_eq!((y.offset, y.len), (4096, 8192));
        assert_eq!(z.offset, 12288);
        assert_eq!(a.capacity(), 16384);
        a.free(x);
        a.free(z);
        assert_eq!(a.free_extents(), 2);
        a.free(y);
        assert_eq!(a.free_extents(), 1, "coalesced into one");
        assert_eq!(a.allocated(), 0);
        let w = alloc(&mut a, 16384);
        assert_eq!(
            (w.offset, a.capacity()),
            (0, 16384),
            "space reused, no growth"
        );
    }

    #[test]
    fn growth_uses_free_tail() {
        let mut a = ExtentAllocator::new();
        let x = alloc(&mut a, 4096);
        let y = alloc(&mut a, 4096);
        a.free(y);
        assert_eq!(a.alloc(12288), Err(16384));
        a.grow_to(16384);
        assert_eq!(a.alloc(12288).unwrap().offset, 4096);
        a.free(x);
        assert_eq!(a.alloc(4096).unwrap().offset, 0);
    }
}
