//! Backends from outside the program: the versioned C ABI of dynamic fastensor plugins.
//!
//! There are two ways to add a backend that fastensor does not ship:
//!
//! * **Compiled in**: a crate implements [`Backend`](fastensor_core::Backend) and registers
//!   it with [`register_backend!`](fastensor_core::register_backend). Once the crate is
//!   linked into the program,
//!   [`Registry::compiled_in`](fastensor_core::Registry::compiled_in) lists it with
//!   [`Origin::CompiledInPlugin`](fastensor_core::Origin::CompiledInPlugin). That needs
//!   only `fastensor-core`, not this crate.
//! * **Dynamic**: a `cdylib` crate turns its backend into a plugin with
//!   [`export_plugin!`], and a program loads the library at run time with
//!   `RegistryExt::load_plugin`, or from the `FASTENSOR_PLUGINS` variable (colon-separated
//!   paths) with `RegistryExt::load_env_plugins`. Both, and `DynamicBackend`, need the `load`
//!   cargo feature of this crate, which pulls in `libloading`; plugin libraries leave it off.
//!   The backend is listed with
//!   [`Origin::DynamicPlugin`](fastensor_core::Origin::DynamicPlugin).
//!
//! This crate depends on `fastensor-core` (for the traits and the registry), never the
//! reverse: the core knows nothing of shared libraries.
//!
//! # The ABI (version [`ABI_VERSION`])
//!
//! A plugin library exports one symbol, [`ENTRY_SYMBOL`] (`fastensor_plugin`), an
//! `extern "C" fn() -> *const PluginV1`. The returned table lives as long as the library; its
//! first two fields, `abi_version` and `struct_size` (the [`PluginHeader`]), never change
//! place, so a host can refuse a plugin built for another version before it reads anything
//! else. Every other field is an `extern "C"` function:
//!
//! * `create` makes one backend instance (an opaque pointer), `destroy` frees it;
//! * `name`, `probe` and `capabilities` describe the instance;
//! * `open` makes an opaque file handle; `read_at`, `write_at`, `sync`, `len` and `set_len`
//!   act on it; `close` frees it;
//! * `last_error` copies the message, [error kind code](ErrorCode) and OS error code of the
//!   last call that failed on the calling thread.
//!
//! Every function but `destroy`, `close` and `last_error` returns a status: `0` for success,
//! otherwise an [`ErrorCode`]; the details are then fetched with `last_error` on the same
//! thread, before any other call. Memory is freed on the side that allocated it: the plugin
//! frees its instances and handles in `destroy` and `close`, strings it hands out stay owned
//! by it (the host copies them at once), and the host passes its own buffers for data and
//! messages. Only host memory crosses the boundary: the host refuses device memory with
//! [`ErrorKind::Unsupported`](fastensor_core::ErrorKind::Unsupported) before calling the
//! plugin. No panic crosses it either: every exported function runs under `catch_unwind` and
//! turns a panic into an error. Instances and handles must be usable from several threads at
//! once, as the [`Backend`](fastensor_core::Backend) and
//! [`BackendFile`](fastensor_core::BackendFile) traits require.
//!
//! The host keeps the library loaded while any backend or file handle from it lives.
#![deny(missing_docs)]

mod abi;
#[doc(hidden)]
pub mod export;
#[cfg(feature = "load")]
mod load;
#[cfg(feature = "load")]
mod registry;

pub use abi::{
    mode_code, mode_of_code, open_mode, EntryFn, ErrorCode, FfiCapabilities, PluginHeader,
    PluginV1, Status, ABI_VERSION, ENTRY_SYMBOL, STATUS_OK,
};
#[cfg(feature = "load")]
pub use load::DynamicBackend;
#[cfg(feature = "load")]
pub use registry::{RegistryExt, PLUGINS_ENV};

/// Turns a [`Backend`](fastensor_core::Backend) into a dynamic plugin: exports the
/// [`ENTRY_SYMBOL`] function of the plugin ABI from a `cdylib` crate.
///
/// The argument is an expression that makes one backend value; it is evaluated each time a
/// host loads the plugin (once per `RegistryExt::load_plugin` or `DynamicBackend::load`).
/// Use it once per library, at the crate root:
///
/// ```ignore
/// // Cargo.toml: [lib] crate-type = ["cdylib", "rlib"]
/// //             [dependencies] fastensor-core = "0.1", fastensor-plugin = "0.1"
/// fastensor_plugin::export_plugin!(MyBackend::default());
/// ```
///
/// Every exported function catches panics, and errors keep their
/// [`ErrorKind`](fastensor_core::ErrorKind) across the boundary.
#[macro_export]
macro_rules! export_plugin {
    ($create:expr) => {
        #[doc(hidden)]
        struct __FastensorPluginConstructor;

        impl $crate::export::Constructor for __FastensorPluginConstructor {
            fn construct() -> $crate::export::SharedBackend {
                $crate::export::shared($create)
            }
        }

        /// The fastensor plugin entry point: returns this library's function table.
        #[no_mangle]
        pub extern "C" fn fastensor_plugin() -> *const $crate::PluginV1 {
            static TABLE: $crate::PluginV1 =
                $crate::export::table::<__FastensorPluginConstructor>();
            &TABLE
        }
    };
}
