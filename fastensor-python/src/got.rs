//! Redirecting a loaded library's imports, and undoing it: the entries of its global offset
//! table (GOT) that the dynamic linker filled with the addresses of functions it imports
//! (`free`, `posix_memalign`, ...) are overwritten with other functions, so that the
//! library's own calls go to them; no other library's calls change. This is how memory
//! profilers hook an allocator at run time. Linux with glibc, ELF64 (x86-64 and aarch64)
//! only. It serves torch's caching allocator ([`crate::torch_alloc`]) alone, which is why
//! it lives here and not in the OS layer every crate shares.
//!
//! Contract of a redirection: each slot is written with one aligned 8-byte store (a thread
//! calling through it at that moment sees the old function or the new one, never a torn
//! address); the slot's page is made writable for the store and then given back the
//! protection the dynamic linker left it with (read-only in the part of `PT_GNU_RELRO` that
//! glibc protects, read-write elsewhere); the original addresses are kept so that
//! [`restore`] puts back exactly what was there, with the same page protection. A slot that
//! someone else rewrote in between is left alone by [`restore`] (theirs now).

use std::ffi::{c_int, c_void, CStr};
use std::io::{Error, ErrorKind, Result};
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

/// One GOT slot of a loaded library that imports a symbol. Only this module makes one (from
/// the library's relocations), which is what lets [`Slot::value`] read it safely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    symbol: String,
    address: usize,
    protection: c_int,
}

impl Slot {
    /// The imported symbol.
    pub fn symbol(&self) -> &str {
        &self.symbol
    }

    /// The slot's address.
    pub fn address(&self) -> usize {
        self.address
    }

    /// Whether the dynamic linker left the slot's page read-only (RELRO): `mprotect`ed
    /// `PROT_READ` after relocation, as it is again between writes.
    pub fn read_only(&self) -> bool {
        self.protection == libc::PROT_READ
    }

    /// The address the slot holds now (one aligned load, as a call through it reads it).
    pub fn value(&self) -> usize {
        // SAFETY: `address` is an aligned GOT entry of a library that stays loaded (the
        // libraries redirected here are never unloaded: see `redirect`'s contract), always
        // mapped readable; writers store it with aligned atomic stores.
        unsafe { AtomicUsize::from_ptr(self.address as *mut usize) }.load(Ordering::SeqCst)
    }
}

/// One GOT slot that was redirected: the slot, the address it held before (the function
/// calls went to) and the address written in its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirected {
    slot: Slot,
    previous: usize,
    value: usize,
}

impl Redirected {
    /// The slot written.
    pub fn slot(&self) -> &Slot {
        &self.slot
    }
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

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the running system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// The GOT slots of `object` that hold the address of one of `symbols`, ordered by the
/// symbol's position in `symbols`, then by address.
///
/// # Safety
/// `object` must describe an object that stays loaded while the result is used.
unsafe fn slots_of(object: &Object, symbols: &[&str]) -> Vec<Slot> {
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
    // glibc's `_dl_protect_relro`: the pages from the one holding the RELRO start up to
    // (not including) the one holding its end are made read-only after relocation; the
    // last, partial page stays writable (it shares its page with writable data).
    let page = page_size();
    let relro: Vec<(usize, usize)> = object
        .phdrs
        .iter()
        .filter(|p| p.p_type == PT_GNU_RELRO)
        .map(|p| {
            let start = base + p.p_vaddr as usize;
            let end = start + p.p_memsz as usize;
            (start & !(page - 1), end & !(page - 1))
        })
        .collect();
    let mut out: Vec<(usize, Slot)> = Vec::new();
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
                let address = base + r.offset as usize;
                let read_only = relro.iter().any(|&(s, e)| address >= s && address < e);
                let protection = if read_only {
                    libc::PROT_READ
                } else {
                    libc::PROT_READ | libc::PROT_WRITE
                };
                out.push((
                    i,
                    Slot {
                        symbol: name.to_string(),
                        address,
                        protection,
                    },
                ));
            }
        }
    }
    out.sort_by_key(|(i, s)| (*i, s.address));
    out.into_iter().map(|(_, s)| s).collect()
}

/// The loaded objects named `library` (see [`find_loaded`]); an error naming it if none.
fn objects_named(library: &str) -> Result<Vec<Object>> {
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
    Ok(objects)
}

/// The GOT slots through which `library` (see [`redirect`]) calls each of `symbols`, in the
/// order of `symbols`; symbols it does not import have none. Reads nothing but the
/// library's dynamic section and relocations; writes nothing.
pub fn slots(library: &str, symbols: &[&str]) -> Result<Vec<Slot>> {
    let mut out = Vec::new();
    for object in objects_named(library)? {
        // SAFETY: the object is loaded (it was just listed) and the slots are only read
        // while it is: the libraries given here (libc10) are never unloaded by Python.
        out.extend(unsafe { slots_of(&object, symbols) });
    }
    Ok(out)
}

/// Redirects the calls `library` (a loaded object whose path ends with `/library`; `""`
/// for the main program) makes to each `(symbol, function)` of `redirect` to `function`.
/// Every slot of a symbol is written (a function called through the PLT and whose address is
/// taken has two), in the order of `redirect`. Returns the slots written, in order; symbols
/// the library does not import are skipped. Fails when no such library is loaded or a slot
/// cannot be made writable; the slots written before the failure are restored then.
///
/// # Safety
/// Each `function` must be callable with the symbol's signature and ABI from any thread,
/// for as long as the redirection stays and for as long as a thread may still be calling
/// through a slot it read before [`restore`] (in practice: forever, code that is never
/// unloaded), and must behave as the library expects of the symbol. The library must stay
/// loaded while redirected. Redirections and restores of the same slots must not race.
pub unsafe fn redirect(library: &str, redirect: &[(&str, usize)]) -> Result<Vec<Redirected>> {
    let symbols: Vec<&str> = redirect.iter().map(|(s, _)| *s).collect();
    let mut slots = slots(library, &symbols)?;
    // In the order given: a caller redirects `free` before the allocation that feeds it.
    slots.sort_by_key(|s| symbols.iter().position(|n| *n == s.symbol));
    let mut done: Vec<Redirected> = Vec::new();
    for slot in slots {
        let Some(&(_, value)) = redirect.iter().find(|(s, _)| *s == slot.symbol) else {
            continue;
        };
        // SAFETY: `slot` is an aligned GOT entry of a loaded object (from its relocations);
        // the caller guarantees the function fits the symbol.
        match unsafe { write_slot(&slot, None, value) } {
            Ok(previous) => done.push(Redirected {
                slot,
                previous,
                value,
            }),
            Err(e) => {
                // SAFETY: the slots in `done` were written just above, by this call.
                let undone = unsafe { restore(&done) };
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "cannot redirect `{}` in {library}: {e} (the {} slots written before \
                         restored: {undone:?})",
                        slot.symbol,
                        done.len()
                    ),
                ));
            }
        }
    }
    Ok(done)
}

/// Writes `value` into `slot` (only if it holds `expected`, when given) and returns what it
/// held; the page is made writable for the store and given back `slot.protection` after it.
///
/// # Safety
/// `slot` must be an aligned, mapped GOT entry that callers read as a function address, and
/// `value` a function of the symbol's signature (see [`redirect`]).
unsafe fn write_slot(slot: &Slot, expected: Option<usize>, value: usize) -> Result<usize> {
    let page = page_size();
    let start = slot.address & !(page - 1);
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: `start` is the page holding the slot, mapped (the object is loaded); making it
    // writable changes no byte.
    if unsafe { libc::mprotect(start as *mut c_void, page, rw) } != 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: the slot is aligned for a usize and now writable; concurrent readers (calls
    // through the slot) read it with plain aligned loads, which a single aligned store
    // cannot tear.
    let cell = unsafe { AtomicUsize::from_ptr(slot.address as *mut usize) };
    let previous = match expected {
        None => cell.swap(value, Ordering::SeqCst),
        Some(e) => match cell.compare_exchange(e, value, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(p) | Err(p) => p,
        },
    };
    if slot.protection != rw {
        // SAFETY: as above; back to the protection the dynamic linker gave the page.
        if unsafe { libc::mprotect(start as *mut c_void, page, slot.protection) } != 0 {
            // The slot is written; the page stays writable, which weakens a hardening but
            // breaks nothing. Reported so the caller can say so.
            return Err(Error::other(format!(
                "slot written, but its page stays writable: {}",
                Error::last_os_error()
            )));
        }
    }
    Ok(previous)
}

/// Puts back what [`redirect`] wrote, in reverse order: each slot that still holds the
/// function written there gets its previous address again, and its page its protection.
/// Returns the symbols of the slots someone else rewrote since, which are left as they are.
///
/// # Safety
/// The slots must still belong to loaded objects, and nothing may still depend on the
/// redirection (memory handed out by a redirected allocator must no longer reach the
/// original `free`). A thread that read a slot just before the restore may still call the
/// redirected function once after it (see [`redirect`]).
pub unsafe fn restore(redirected: &[Redirected]) -> Result<Vec<String>> {
    let mut foreign = Vec::new();
    for r in redirected.iter().rev() {
        // SAFETY: the caller's contract; the slot was a GOT entry written by `redirect`, and
        // `previous` the function it held.
        let held = unsafe { write_slot(&r.slot, Some(r.value), r.previous) }.map_err(|e| {
            Error::new(e.kind(), format!("cannot restore `{}`: {e}", r.slot.symbol))
        })?;
        if held != r.value {
            foreign.push(r.slot.symbol.clone());
        }
    }
    Ok(foreign)
}
