//! Redirecting a loaded library's imports: the entries of its global offset table (GOT) that
//! the dynamic linker filled with the addresses of functions it imports (`free`,
//! `posix_memalign`, ...) are overwritten with other functions, so that the library's own
//! calls go to them; no other library's calls change. This is how memory profilers hook an
//! allocator at run time. Linux with glibc, ELF64 (x86-64 and aarch64) only.
//!
//! Contract of a redirection: each slot is written with one aligned 8-byte store (a thread
//! calling through it at that moment sees the old function or the new one, never a torn
//! address), the slot's page is made writable for the store and read-only again where it
//! lies in the library's `PT_GNU_RELRO` range, and the original address is returned so the
//! caller can restore it. The new function must keep the old one's signature and ABI.

use fastensor_core::{Error, ErrorKind, Result};
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Relocation types that fill a GOT slot with a symbol's address (x86-64 and aarch64).
#[cfg(target_arch = "x86_64")]
const SLOT_RELOCATIONS: [u32; 2] = [
    6, /* R_X86_64_GLOB_DAT */
    7, /* R_X86_64_JUMP_SLOT */
];
#[cfg(target_arch = "aarch64")]
const SLOT_RELOCATIONS: [u32; 2] = [
    1025, /* R_AARCH64_GLOB_DAT */
    1026, /* R_AARCH64_JUMP_SLOT */
];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const SLOT_RELOCATIONS: [u32; 0] = [];

const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;
const PT_DYNAMIC: u32 = 2;
const PT_GNU_RELRO: u32 = 0x6474_e552;

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Rela {
    offset: u64,
    info: u64,
    _addend: i64,
}

#[repr(C)]
struct Sym {
    name: u32,
    _info: u8,
    _other: u8,
    _shndx: u16,
    _value: u64,
    _size: u64,
}

/// One GOT slot that was redirected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirected {
    /// The imported symbol.
    pub symbol: String,
    /// The slot's address.
    pub slot: usize,
    /// The address the slot held before (the function calls went to).
    pub previous: usize,
    /// The slot lies in the library's `PT_GNU_RELRO` range (read-only between writes).
    pub read_only: bool,
}

/// A loaded object: its path as the dynamic linker knows it (empty for the main program),
/// its load base, and its program headers.
struct Object {
    name: String,
    base: usize,
    phdrs: Vec<libc::Elf64_Phdr>,
}

/// Every object loaded in the process now.
fn loaded_objects() -> Vec<Object> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: the dynamic linker passes a valid `dl_phdr_info` for the duration of the
        // call, and `data` is the `Vec<Object>` passed to `dl_iterate_phdr` below.
        unsafe {
            let info = &*info;
            let out = &mut *data.cast::<Vec<Object>>();
            let name = if info.dlpi_name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(info.dlpi_name)
                    .to_string_lossy()
                    .into_owned()
            };
            let phdrs = if info.dlpi_phdr.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)).to_vec()
            };
            out.push(Object {
                name,
                base: info.dlpi_addr as usize,
                phdrs,
            });
        }
        0
    }
    let mut out: Vec<Object> = Vec::new();
    // SAFETY: `each` matches the callback type and only touches `out` through `data`, which
    // outlives the call.
    unsafe {
        libc::dl_iterate_phdr(Some(each), (&mut out as *mut Vec<Object>).cast());
    }
    out
}

/// The file names of the loaded objects whose path ends with `/name` (or is `name`), e.g.
/// `libc10.so`.
pub fn find_loaded(name: &str) -> Vec<String> {
    loaded_objects()
        .into_iter()
        .filter(|o| matches_name(&o.name, name))
        .map(|o| o.name)
        .collect()
}

fn matches_name(path: &str, name: &str) -> bool {
    if name.is_empty() {
        return path.is_empty();
    }
    path == name || path.ends_with(&format!("/{name}"))
}

/// The GOT slots of `object` that hold the address of one of `symbols`, as
/// `(symbol index in symbols, slot address)`.
///
/// # Safety
/// `object` must describe an object that stays loaded while the result is used.
unsafe fn slots_of(object: &Object, symbols: &[&str]) -> Vec<(usize, usize)> {
    let base = object.base;
    let Some(dynamic) = object.phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) else {
        return Vec::new();
    };
    // Addresses in the dynamic section are relocated in place by glibc on most targets;
    // where they are not, they are offsets from the load base.
    let absolute = |v: u64| -> usize {
        let v = v as usize;
        if v < base {
            base + v
        } else {
            v
        }
    };
    let (mut symtab, mut strtab) = (0usize, 0usize);
    let (mut rela, mut rela_size, mut jmprel, mut jmprel_size) = (0usize, 0usize, 0usize, 0usize);
    // SAFETY: PT_DYNAMIC of a loaded object points to its dynamic section, an array ended
    // by DT_NULL.
    unsafe {
        let mut d = (base + dynamic.p_vaddr as usize) as *const Dyn;
        while (*d).tag != DT_NULL {
            let val = (*d).val;
            match (*d).tag {
                DT_SYMTAB => symtab = absolute(val),
                DT_STRTAB => strtab = absolute(val),
                DT_RELA => rela = absolute(val),
                DT_RELASZ => rela_size = val as usize,
                DT_JMPREL => jmprel = absolute(val),
                DT_PLTRELSZ => jmprel_size = val as usize,
                _ => {}
            }
            d = d.add(1);
        }
    }
    if symtab == 0 || strtab == 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (table, size) in [(rela, rela_size), (jmprel, jmprel_size)] {
        if table == 0 {
            continue;
        }
        let count = size / std::mem::size_of::<Rela>();
        // SAFETY: DT_RELA/DT_JMPREL and their sizes describe arrays of Elf64_Rela in the
        // loaded object.
        let relocations = unsafe { std::slice::from_raw_parts(table as *const Rela, count) };
        for r in relocations {
            let kind = (r.info & 0xffff_ffff) as u32;
            if !SLOT_RELOCATIONS.contains(&kind) {
                continue;
            }
            let index = (r.info >> 32) as usize;
            // SAFETY: a relocation's symbol index is an entry of the object's symbol table,
            // whose name is an offset into its string table.
            let name = unsafe {
                let sym = &*((symtab as *const Sym).add(index));
                CStr::from_ptr((strtab + sym.name as usize) as *const libc::c_char)
            };
            let Ok(name) = name.to_str() else { continue };
            if let Some(i) = symbols.iter().position(|s| *s == name) {
                out.push((i, base + r.offset as usize));
            }
        }
    }
    out
}

/// Redirects the calls `library` (a loaded object whose path ends with `/library`; `""`
/// for the main program) makes to each `(symbol, function)` of `redirect` to `function`.
/// Every slot of a symbol is written (a function called through the PLT and whose address is
/// taken has two). Returns the slots written, in order; symbols the library does not import
/// are skipped. Fails when no such library is loaded or a slot cannot be made writable
/// (slots written before stay written, and are in the error's message).
///
/// # Safety
/// Each `function` must be callable with the symbol's signature and ABI from any thread,
/// forever (the library may call it at any time after this returns), and must behave as
/// the library expects of the symbol. Redirections of the same slots must not race.
pub unsafe fn redirect(library: &str, redirect: &[(&str, usize)]) -> Result<Vec<Redirected>> {
    let objects: Vec<Object> = loaded_objects()
        .into_iter()
        .filter(|o| matches_name(&o.name, library))
        .collect();
    if objects.is_empty() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("no loaded library is named {library}"),
        ));
    }
    let symbols: Vec<&str> = redirect.iter().map(|(s, _)| *s).collect();
    let mut done = Vec::new();
    for object in &objects {
        let relro: Vec<(usize, usize)> = object
            .phdrs
            .iter()
            .filter(|p| p.p_type == PT_GNU_RELRO)
            .map(|p| {
                let start = object.base + p.p_vaddr as usize;
                (start, start + p.p_memsz as usize)
            })
            .collect();
        // SAFETY: the object is loaded (it was just listed) and libraries are not unloaded
        // by this process while their functions are redirected (the caller's contract).
        let mut slots = unsafe { slots_of(object, &symbols) };
        // In the order given: a caller redirects `free` before the allocation that feeds it.
        slots.sort_by_key(|&(i, slot)| (i, slot));
        for (i, slot) in slots {
            let read_only = relro.iter().any(|&(s, e)| slot >= s && slot < e);
            // SAFETY: `slot` is an aligned GOT entry of a loaded object (from its
            // relocations); the caller guarantees the function fits the symbol.
            let previous = unsafe { write_slot(slot, redirect[i].1, read_only) }.map_err(|e| {
                Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "cannot redirect `{}` in {}: {e} (redirected before: {:?})",
                        symbols[i], object.name, done
                    ),
                )
            })?;
            done.push(Redirected {
                symbol: symbols[i].to_string(),
                slot,
                previous,
                read_only,
            });
        }
    }
    Ok(done)
}

/// Writes `value` into the GOT slot at `slot` and returns what it held; the page is made
/// writable for the store and, when `read_only`, read-only again after it.
///
/// # Safety
/// `slot` must be an aligned, mapped GOT entry that callers read as a function address.
unsafe fn write_slot(
    slot: usize,
    value: usize,
    read_only: bool,
) -> std::result::Result<usize, std::io::Error> {
    let page = crate::page_size() as usize;
    let start = slot & !(page - 1);
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: `start` is the page holding the slot, mapped (the object is loaded); making it
    // writable changes no byte.
    if unsafe { libc::mprotect(start as *mut c_void, page, rw) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the slot is aligned for a usize and now writable; concurrent readers (calls
    // through the slot) read it with plain aligned loads, which a single aligned store
    // cannot tear.
    let previous =
        unsafe { AtomicUsize::from_ptr(slot as *mut usize) }.swap(value, Ordering::SeqCst);
    if read_only {
        // SAFETY: as above; back to the protection RELRO gave it. A failure leaves the page
        // writable, which weakens a hardening but breaks nothing.
        unsafe {
            libc::mprotect(start as *mut c_void, page, libc::PROT_READ);
        }
    }
    Ok(previous)
}

/// Puts back what [`redirect`] wrote: each slot gets its previous address again.
///
/// # Safety
/// The slots must still belong to loaded objects, and nothing may still depend on the
/// redirection (memory handed out by a redirected allocator must no longer reach the
/// original `free`).
pub unsafe fn restore(redirected: &[Redirected]) -> Result<()> {
    for r in redirected.iter().rev() {
        // SAFETY: the caller's contract; `slot` was a GOT entry written by `redirect`.
        unsafe { write_slot(r.slot, r.previous, r.read_only) }
            .map_err(|e| Error::io(e, format!("cannot restore `{}`", r.symbol)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn fake_getppid() -> libc::pid_t {
        424_242
    }

    #[test]
    fn a_redirected_import_of_the_main_program_calls_the_new_function_until_restored() {
        let real = std::os::unix::process::parent_id();
        // SAFETY: `fake_getppid` has getppid's signature; only this test calls getppid, and
        // it restores the slot before returning.
        let done =
            unsafe { redirect("", &[("getppid", fake_getppid as *const () as usize)]) }.unwrap();
        if done.is_empty() {
            // A build that calls getppid without a GOT slot (statically resolved): nothing
            // to redirect, nothing to check.
            return;
        }
        assert!(done
            .iter()
            .all(|r| r.symbol == "getppid" && r.previous != 0));
        assert_eq!(std::os::unix::process::parent_id(), 424_242);
        // SAFETY: the slots were written just above and still belong to this program.
        unsafe { restore(&done) }.unwrap();
        assert_eq!(std::os::unix::process::parent_id(), real);
    }

    #[test]
    fn a_library_that_is_not_loaded_is_an_error_naming_it() {
        // SAFETY: nothing is written when the library is missing.
        let err = unsafe { redirect("libdoes-not-exist.so", &[("free", 0)]) }.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(err.to_string().contains("libdoes-not-exist.so"));
    }

    #[test]
    fn loaded_libraries_are_found_by_file_name() {
        assert!(!find_loaded("").is_empty(), "the main program is listed");
        let libc_paths: Vec<String> = loaded_objects()
            .into_iter()
            .map(|o| o.name)
            .filter(|n| n.contains("libc.so"))
            .collect();
        let name = libc_paths[0].rsplit('/').next().unwrap().to_string();
        assert_eq!(find_loaded(&name), libc_paths[..1].to_vec());
        assert!(find_loaded("c.so.6x").is_empty());
    }
}
