//! Test fixture: exports the fastensor plugin entry point, but with a table header that says
//! ABI version 999. Hosts must refuse it after reading the header alone.
#![deny(missing_docs)]

/// The ABI version this fixture claims.
pub const BAD_VERSION: u32 = 999;

/// A header of a plugin table: version, then size.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    abi_version: u32,
    struct_size: u32,
}

static HEADER: Header = Header {
    abi_version: BAD_VERSION,
    struct_size: 8,
};

/// The plugin entry point, returning a table of an unknown version.
#[no_mangle]
pub extern "C" fn fastensor_plugin() -> *const Header {
    &HEADER
}
