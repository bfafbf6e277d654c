//! Test fixture: exports the fastensor plugin entry point, but with a table header that says
//! ABI version 999. Hosts must refuse it after reading the header alone.
#![deny(missing_docs)]

use fastensor_plugin::PluginHeader;

/// The ABI version this fixture claims.
pub const BAD_VERSION: u32 = 999;

/// The real header layout of a plugin table (version, then size), with a version no host
/// speaks, and no table after it.
static HEADER: PluginHeader = PluginHeader {
    abi_version: BAD_VERSION,
    struct_size: std::mem::size_of::<PluginHeader>() as u32,
};

/// The plugin entry point, returning a table of an unknown version.
#[no_mangle]
pub extern "C" fn fastensor_plugin() -> *const PluginHeader {
    &HEADER
}
