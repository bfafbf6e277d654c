//! torch's CPU allocator slot (`c10::SetCPUAllocator`, the C++ API torch offers for a CPU
//! allocator of one's own), filled with an allocator object built here.
//!
//! `c10::Allocator` is a C++ class: torch calls it through its virtual table. Rather than
//! declare that class against one torch version's headers, the object is built at run time
//! from what the loaded `libc10.so` itself exports, and checked before use:
//! - the virtual tables of `c10::Allocator` and `c10::DefaultCPUAllocator` (their symbols,
//!   with their sizes): the slots must read `[dtor, dtor, allocate (pure), is_simple_data_ptr,
//!   raw_deleter, copy_data (pure)]`, the two pure virtual slots found where the base class
//!   holds the same entry twice and `is_simple_data_ptr` by its exported symbol;
//! - the layout of the `DataPtr` that `allocate` returns, read off one call of the default
//!   allocator: the data pointer and its context (the same address), the deleter (the
//!   function `raw_deleter` returns) and the device, each a word of a 32-byte value.
//!
//! The object here is a copy of the default allocator's virtual table with `allocate` and
//! `raw_deleter` replaced; every other entry (`copy_data`, `is_simple_data_ptr`, the
//! destructors, never called) is the default allocator's own. Anything that does not match
//! is refused with the reason, and torch keeps its allocator.
//!
//! ABI: a `DataPtr` is returned through a hidden pointer (it has a destructor), as a C
//! struct of 32 bytes is on x86-64 and aarch64, so the functions here return
//! [`RawDataPtr`] by value with the C ABI; `allocate` may throw (torch's out-of-memory
//! error), which unwinds through the `C-unwind` frames here.

use std::ffi::{c_void, CStr};

/// A `c10::DataPtr` as bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawDataPtr([u64; 4]);

/// `DataPtr (Allocator::*)(size_t) const`.
pub type AllocateFn = unsafe extern "C-unwind" fn(*const c_void, usize) -> RawDataPtr;
/// `DeleterFnPtr (Allocator::*)() const`.
pub type RawDeleterFn = unsafe extern "C" fn(*const c_void) -> DeleterFn;
/// `void (*)(void*)`.
pub type DeleterFn = unsafe extern "C" fn(*mut c_void);
/// `void c10::SetCPUAllocator(Allocator*, uint8_t)`.
type SetFn = unsafe extern "C" fn(*mut c_void, u8);
/// `Allocator* c10::GetCPUAllocator()`.
type GetFn = unsafe extern "C" fn() -> *mut c_void;

/// The library, and the symbols read from it.
const LIBRARY: &CStr = c"libc10.so";
const SET: &CStr = c"_ZN3c1015SetCPUAllocatorEPNS_9AllocatorEh";
const GET: &CStr = c"_ZN3c1015GetCPUAllocatorEv";
const BASE_VTABLE: &CStr = c"_ZTVN3c109AllocatorE";
const DEFAULT_VTABLE: &CStr = c"_ZTVN3c1019DefaultCPUAllocatorE";
const IS_SIMPLE: &CStr = c"_ZNK3c109Allocator18is_simple_data_ptrERKNS_7DataPtrE";

/// Virtual slots (after the two words before them: offset to top, type info).
const SLOTS: usize = 6;
const ALLOCATE: usize = 2;
const IS_SIMPLE_SLOT: usize = 3;
const RAW_DELETER: usize = 4;
const COPY_DATA: usize = 5;

/// Where the words of a `DataPtr` are, and what the default allocator puts in them.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// A `DataPtr` of the default allocator, its pointers cleared.
    template: RawDataPtr,
    /// The words holding the data pointer and its context.
    pointers: [usize; 2],
    /// The word holding the deleter.
    deleter: usize,
}

/// torch's CPU allocator and what replacing it needs; made once per process.
pub struct Torch {
    set: SetFn,
    get: GetFn,
    /// The allocator torch had when this was made.
    pub original: *mut c_void,
    /// Its `allocate` and its deleter.
    pub original_allocate: AllocateFn,
    pub original_deleter: DeleterFn,
    layout: Layout,
    /// The replacement object (a pointer to its virtual table) and that table.
    object: Box<*const usize>,
    _vtable: Box<[usize]>,
}

// SAFETY: the pointers are to torch's allocator objects and functions, which live as long
// as the process and are used from any thread by torch itself; the boxes are never changed.
unsafe impl Send for Torch {}
// SAFETY: as above: read only.
unsafe impl Sync for Torch {}

impl Torch {
    /// Reads torch's allocator from the loaded `libc10.so` and builds the replacement whose
    /// `allocate` and `raw_deleter` are the functions given. Fails with the reason where
    /// `libc10.so` is not loaded or is not laid out as described in the module docs.
    pub fn find(allocate: AllocateFn, raw_deleter: RawDeleterFn) -> Result<Torch, String> {
        // SAFETY: RTLD_NOLOAD only looks the library up among those loaded; the handle is
        // never closed (torch keeps the library loaded for the process's life).
        let lib = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if lib.is_null() {
            return Err("libc10.so is not loaded (import torch first)".into());
        }
        let sym = |name: &CStr| -> Result<*mut c_void, String> {
            // SAFETY: a lookup in a loaded library by a NUL-terminated name.
            let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
            if p.is_null() {
                Err(format!("libc10.so exports no {}", name.to_string_lossy()))
            } else {
                Ok(p)
            }
        };
        let (set, get) = (sym(SET)?, sym(GET)?);
        let base = vtable(sym(BASE_VTABLE)?)?;
        let default = vtable(sym(DEFAULT_VTABLE)?)?;
        let is_simple = sym(IS_SIMPLE)? as usize;
        let pure = base[2 + ALLOCATE];
        let expected = base[2 + COPY_DATA] == pure
            && (0..SLOTS).filter(|&i| base[2 + i] == pure).count() == 2
            && base[2 + IS_SIMPLE_SLOT] == is_simple
            && default[2 + ALLOCATE] != pure
            && default[2 + COPY_DATA] != pure;
        if !expected {
            return Err("torch's c10::Allocator has a layout this fastensor does not know".into());
        }
        // SAFETY: `get` is c10::GetCPUAllocator, which takes nothing and returns the
        // registered CPU allocator.
        let original = unsafe { std::mem::transmute::<*mut c_void, GetFn>(get)() };
        if original.is_null() {
            return Err("torch has no CPU allocator".into());
        }
        // The allocator torch uses now, through its own table (it may not be the default).
        // SAFETY: `original` is a live c10::Allocator object, whose first word is its vtable
        // pointer; its slots are laid out as the default allocator's (checked above through
        // the class's own table).
        let table = unsafe { *(original as *const *const usize) };
        // SAFETY: the table has SLOTS function pointers (checked through the symbols'
        // sizes for the classes above; a derived class's table is at least as long).
        let (alloc_slot, deleter_slot) = unsafe { (*table.add(ALLOCATE), *table.add(RAW_DELETER)) };
        // SAFETY: slot ALLOCATE of a c10::Allocator vtable is `DataPtr allocate(size_t) const`
        // and slot RAW_DELETER `DeleterFnPtr raw_deleter() const`, whose ABI the types above
        // spell out (see the module docs).
        let (original_allocate, original_raw_deleter) = unsafe {
            (
                std::mem::transmute::<usize, AllocateFn>(alloc_slot),
                std::mem::transmute::<usize, RawDeleterFn>(deleter_slot),
            )
        };
        // SAFETY: a const member function called on its own live object.
        let original_deleter = unsafe { original_raw_deleter(original) };
        let layout = read_layout(original, original_allocate, original_deleter)?;
        let mut table: Box<[usize]> = default.into();
        table[2 + ALLOCATE] = allocate as usize;
        table[2 + RAW_DELETER] = raw_deleter as usize;
        let object = Box::new(table.as_ptr().wrapping_add(2));
        // SAFETY: the symbols are c10::SetCPUAllocator and c10::GetCPUAllocator, of these
        // signatures.
        let (set, get) = unsafe {
            (
                std::mem::transmute::<*mut c_void, SetFn>(set),
                std::mem::transmute::<*mut c_void, GetFn>(get),
            )
        };
        Ok(Torch {
            set,
            get,
            original,
            original_allocate,
            original_deleter,
            layout,
            object,
            _vtable: table,
        })
    }

    /// The replacement allocator object (a `c10::Allocator*` for torch).
    pub fn object(&self) -> *mut c_void {
        &*self.object as *const *const usize as *mut c_void
    }

    /// The CPU allocator torch uses now.
    pub fn current(&self) -> *mut c_void {
        // SAFETY: c10::GetCPUAllocator takes nothing.
        unsafe { (self.get)() }
    }

    /// Makes `allocator` torch's CPU allocator (priority 0, the default allocator's).
    /// Returns whether torch took it (an allocator registered with a higher priority keeps
    /// its place).
    pub fn set(&self, allocator: *mut c_void) -> bool {
        // SAFETY: `allocator` is the original allocator or the replacement object, both
        // live for the process's life; SetCPUAllocator only stores the pointer.
        unsafe { (self.set)(allocator, 0) };
        self.current() == allocator
    }

    /// A `DataPtr` of the memory at `data` (its own context), deleted by `deleter`.
    pub fn data_ptr(&self, data: *mut c_void, deleter: DeleterFn) -> RawDataPtr {
        let mut out = self.layout.template;
        for w in self.layout.pointers {
            out.0[w] = data as u64;
        }
        out.0[self.layout.deleter] = deleter as usize as u64;
        out
    }
}

/// The slots of the virtual table whose symbol is at `sym` (its `SLOTS` entries after the
/// two leading words), checked against the symbol's size.
fn vtable(sym: *mut c_void) -> Result<Vec<usize>, String> {
    // SAFETY: Dl_info is plain data (pointers), valid when zeroed.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut entry: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 fills `info` and `entry` (a pointer to the symbol's ELF entry) for an
    // address inside a loaded object; RTLD_DL_SYMENT = 1.
    let ok = unsafe { libc::dladdr1(sym, &mut info, &mut entry, 1) };
    if ok == 0 || entry.is_null() {
        return Err("cannot read the size of torch's allocator vtables".into());
    }
    // SAFETY: with RTLD_DL_SYMENT, `entry` points to the symbol's ElfW(Sym) entry.
    let size = unsafe { (*(entry as *const libc::Elf64_Sym)).st_size } as usize;
    let words = size / std::mem::size_of::<usize>();
    if words != 2 + SLOTS {
        return Err(format!(
            "torch's c10::Allocator has {} virtual functions, not the {SLOTS} this fastensor knows",
            words.saturating_sub(2)
        ));
    }
    // SAFETY: the symbol is `words` words of read-only data (its size, read above).
    Ok(unsafe { std::slice::from_raw_parts(sym as *const usize, words) }.to_vec())
}

/// Reads the layout of a `DataPtr` off one allocation of the default allocator (given back
/// at once).
fn read_layout(
    original: *mut c_void,
    allocate: AllocateFn,
    deleter: DeleterFn,
) -> Result<Layout, String> {
    // SAFETY: `allocate` is the allocator's own `allocate`, called on its object; it throws
    // only when out of memory (64 bytes).
    let got = unsafe { allocate(original, 64) };
    let words = got.0;
    let d = deleter as usize as u64;
    let deleters: Vec<usize> = (0..4).filter(|&i| words[i] == d).collect();
    let pointers: Vec<usize> = (0..4)
        .filter(|&i| {
            words[i] != d && words[i] != 0 && (0..4).any(|j| j != i && words[j] == words[i])
        })
        .collect();
    let (Ok([deleter_word]), Ok([a, b])) = (
        <[usize; 1]>::try_from(deleters),
        <[usize; 2]>::try_from(pointers),
    ) else {
        return Err("torch's c10::DataPtr has a layout this fastensor does not know".into());
    };
    // Given back through its own deleter.
    // SAFETY: the memory `allocate` returned above, with the deleter it came with.
    unsafe { deleter(words[a] as *mut c_void) };
    let mut template = got;
    template.0[a] = 0;
    template.0[b] = 0;
    Ok(Layout {
        template,
        pointers: [a, b],
        deleter: deleter_word,
    })
}
