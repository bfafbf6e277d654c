//! What a backend declares it can do: the facts every decision about backends is made from.

use crate::MemoryKind;

/// What a backend can do. One struct drives both run-time checks and which conformance
/// tests run for the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Can read files into memory.
    pub read: bool,
    /// Can write memory into files.
    pub write: bool,
    /// Accepts host memory.
    pub host_memory: bool,
    /// Accepts GPU device memory.
    pub device_memory: bool,
    /// Memory alignment (bytes) for the zero-copy path; 1 when any address is as fast.
    /// Unaligned buffers still work, through a bounce buffer.
    pub memory_alignment: u64,
    /// File offset alignment (bytes) for the zero-copy path; 1 when any offset is as fast.
    pub offset_alignment: u64,
    /// The batch calls submit many requests at once (rather than one after another).
    pub native_batch: bool,
    /// How many requests the backend keeps in flight for one transfer.
    pub queue_depth: u32,
    /// `sync` makes written data durable.
    pub durable_sync: bool,
    /// Reads bypass the page cache (their speed does not depend on what is cached).
    pub bypasses_page_cache: bool,
    /// Its files are the local files at their paths (the bytes the OS would map), not bytes
    /// kept elsewhere: a load into new memory may map such a file instead of reading it.
    pub local_files: bool,
    /// Reads copy out of a memory map of the file (its pages faulted in as they are
    /// touched) rather than through a system call.
    pub maps_file: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            read: true,
            write: true,
            host_memory: true,
            device_memory: false,
            memory_alignment: 1,
            offset_alignment: 1,
            native_batch: false,
            queue_depth: 1,
            durable_sync: true,
            bypasses_page_cache: false,
            local_files: false,
            maps_file: false,
        }
    }
}

impl Capabilities {
    /// A backend of `O_DIRECT` transfers of local files keeping `queue_depth` requests in
    /// flight: page-aligned memory and offsets for the zero-copy path, reads past the page
    /// cache; otherwise the defaults.
    pub fn direct(queue_depth: u32) -> Self {
        Capabilities {
            memory_alignment: 4096,
            offset_alignment: 4096,
            queue_depth,
            bypasses_page_cache: true,
            ..Capabilities::local()
        }
    }

    /// A backend of local files through the page cache, one request at a time: the
    /// defaults, with [`local_files`](Self::local_files).
    pub fn local() -> Self {
        Capabilities {
            local_files: true,
            ..Capabilities::default()
        }
    }

    /// These capabilities for a backend that takes GPU device memory and no host memory.
    pub fn on_device(self) -> Self {
        Capabilities {
            host_memory: false,
            device_memory: true,
            ..self
        }
    }
}

impl Capabilities {
    /// True when the backend accepts memory of this kind.
    pub fn supports_memory(&self, kind: MemoryKind) -> bool {
        match kind {
            MemoryKind::Host => self.host_memory,
            MemoryKind::Device { .. } => self.device_memory,
        }
    }

    /// True when reads go through the page cache (it reads ahead, and what it reads stays
    /// cached).
    pub fn reads_through_page_cache(&self) -> bool {
        self.read && !self.bypasses_page_cache
    }

    /// True when the backend reads local files into host memory through the page cache:
    /// what a load that maps the file instead also reads through.
    pub fn reads_local_page_cache(&self) -> bool {
        self.reads_through_page_cache() && self.host_memory && self.local_files
    }

    /// A one-line summary such as `read write host align=4096 qd=4 batch`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if self.read {
            parts.push("read".to_string());
        }
        if self.write {
            parts.push("write".to_string());
        }
        if self.host_memory {
            parts.push("host".to_string());
        }
        if self.device_memory {
            parts.push("device".to_string());
        }
        if self.offset_alignment > 1 || self.memory_alignment > 1 {
            parts.push(format!(
                "align={}",
                self.offset_alignment.max(self.memory_alignment)
            ));
        }
        parts.push(format!("qd={}", self.queue_depth));
        if self.native_batch {
            parts.push("batch".to_string());
        }
        if self.bypasses_page_cache {
            parts.push("direct".to_string());
        }
        if !self.durable_sync {
            parts.push("no-durable-sync".to_string());
        }
        parts.join(" ")
    }
}
