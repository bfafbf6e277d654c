//! Whether host memory may be written: a write into a read-only mapping (a read-only
//! `np.memmap`, a tensor made from one) would be a segmentation fault, so destinations are
//! checked before a transfer.
//!
//! A few pages are probed through the kernel, which answers `EFAULT` where user space would
//! fault: each page's first byte is read and written back unchanged with
//! `process_vm_readv`/`process_vm_writev` on this process (two system calls in all; nothing
//! changes). Larger destinations, or where those calls are refused (a seccomp profile), are
//! checked against `/proc/self/maps` (one read of it; its cost: docs/lab/loads.md).

use super::Region;
use fastensor::sys::populate::byte_iovecs;
use fastensor::{Error, ErrorKind, Result};

/// The most pages probed through the kernel; beyond, the mappings are read.
const PROBE_PAGES: usize = 64;

const PAGE: usize = 4096;

/// Refuses any region not wholly inside writable mappings of this process.
pub fn check(regions: &[Region]) -> Result<()> {
    if regions.is_empty() {
        return Ok(());
    }
    let firsts = page_firsts(regions);
    if firsts.len() <= PROBE_PAGES {
        match probe(&firsts) {
            Probe::Writable => return Ok(()),
            Probe::NotWritable => return Err(not_writable(regions)),
            Probe::Unknown => {}
        }
    }
    check_maps(regions)
}

/// The first byte of every page each region spans (stops counting past the probe limit).
fn page_firsts(regions: &[Region]) -> Vec<usize> {
    let mut out = Vec::new();
    for r in regions {
        let (start, end) = (r.addr(), r.addr() + r.len());
        let mut at = start;
        while at < end {
            out.push(at);
            if out.len() > PROBE_PAGES {
                return out;
            }
            at = (at / PAGE + 1) * PAGE;
        }
    }
    out
}

enum Probe {
    Writable,
    NotWritable,
    /// The kernel refused the calls themselves.
    Unknown,
}

/// Reads the byte at each address and writes it back through the kernel.
fn probe(addrs: &[usize]) -> Probe {
    let mut bytes = vec![0u8; addrs.len()];
    let local = byte_iovecs(bytes.iter_mut().map(|b| b as *mut u8));
    let remote = byte_iovecs(addrs.iter().map(|&a| a as *mut u8));
    let n = local.len();
    // SAFETY: `local` describes `bytes`, live and ours; the kernel checks `remote` (this
    // process's own addresses) and reports what it cannot reach instead of faulting.
    let got = unsafe {
        libc::process_vm_readv(
            libc::getpid(),
            local.as_ptr(),
            n as libc::c_ulong,
            remote.as_ptr(),
            n as libc::c_ulong,
            0,
        )
    };
    if let Some(answer) = answer(got, n) {
        return answer;
    }
    // SAFETY: as above; each byte written back is the one just read from that address, and
    // the caller owns the destinations for the transfer (nobody else writes them).
    let put = unsafe {
        libc::process_vm_writev(
            libc::getpid(),
            local.as_ptr(),
            n as libc::c_ulong,
            remote.as_ptr(),
            n as libc::c_ulong,
            0,
        )
    };
    answer(put, n).unwrap_or(Probe::Writable)
}

/// What a `process_vm_*` result says, or `None` when it moved every byte.
fn answer(rc: isize, n: usize) -> Option<Probe> {
    if rc >= 0 {
        return (rc as usize != n).then_some(Probe::NotWritable);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EFAULT) => Some(Probe::NotWritable),
        _ => Some(Probe::Unknown),
    }
}

/// Checks the regions against the writable mappings of `/proc/self/maps`.
fn check_maps(regions: &[Region]) -> Result<()> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Ok(()); // no procfs: nothing to check against
    };
    let mut writable: Vec<(usize, usize)> = Vec::new();
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let (Some(range), Some(perms)) = (parts.next(), parts.next()) else {
            continue;
        };
        if perms.as_bytes().get(1) != Some(&b'w') {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
            match writable.last_mut() {
                Some(last) if last.1 == a => last.1 = b,
                _ => writable.push((a, b)),
            }
        }
    }
    for r in regions {
        let (start, end) = (r.addr(), r.addr() + r.len());
        let i = writable.partition_point(|&(_, b)| b <= start);
        if !writable
            .get(i)
            .is_some_and(|&(a, b)| a <= start && end <= b)
        {
            return Err(not_writable(std::slice::from_ref(r)));
        }
    }
    Ok(())
}

fn not_writable(regions: &[Region]) -> Error {
    let bytes: usize = regions.iter().map(Region::len).sum();
    Error::new(
        ErrorKind::InvalidInput,
        format!(
            "a destination ({bytes} bytes in all) is not writable memory (a read-only \
             mapping, such as a read-only np.memmap or a tensor made from one)"
        ),
    )
}
