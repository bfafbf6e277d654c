//! The process's memory as the kernel counts it.

/// The process's resident memory now (bytes; `/proc/self/statm`, anonymous and file pages
/// together), as the kernel counts it; `None` where it cannot be read.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * crate::page_size())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_grows_with_pages_touched() {
        let before = resident_bytes().unwrap();
        let mut v = vec![0u8; 64 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        let after = resident_bytes().unwrap();
        assert!(after >= before + (32 << 20), "{before} -> {after}");
        drop(v);
    }
}
