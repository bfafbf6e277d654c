//! Embedding fastensor with a chosen set of I/O paths.
//!
//! The facade's cargo features pick the backend crates that are compiled in, and so what
//! [`fastensor::registry`] finds:
//!
//! ```toml
//! # Only the POSIX backends: no io_uring, no CUDA code in the binary.
//! fastensor = { version = "0.1", default-features = false, features = ["posix"] }
//! # ... plus dynamic plugins listed in FASTENSOR_PLUGINS (`fastensor::plugin`, which is
//! # the fastensor-plugin crate with its libloading-based `load` feature):
//! fastensor = { version = "0.1", default-features = false, features = ["posix", "plugins"] }
//! ```
//!
//! ```sh
//! cargo run --example embed --no-default-features --features posix
//! cargo build -p fastensor-example-plugin
//! FASTENSOR_PLUGINS=target/debug/libfastensor_example_plugin.so \
//!     cargo run --example embed --no-default-features --features posix,plugins
//! ```

use fastensor::{Engine, HostBuffer, OpenMode, Registry};

fn main() -> fastensor::Result<()> {
    // Every backend this build links (per the features), then any dynamic plugins.
    let registry: Registry = fastensor::registry();
    #[cfg(feature = "plugins")]
    let registry = {
        use fastensor::plugin::RegistryExt;
        let mut registry = registry;
        for result in registry.load_env_plugins() {
            if let Err(e) = result {
                eprintln!("warning: plugin not loaded: {e}");
            }
        }
        registry
    };
    for entry in registry.entries() {
        println!(
            "{:<16} {:<40} {}",
            entry.backend.name(),
            entry.origin.to_string(),
            entry.backend.probe()
        );
    }

    // An engine over those backends picks the fastest path per transfer.
    let engine = Engine::builder().registry(registry).build()?;
    let path = std::env::temp_dir().join(format!("fastensor-embed-{}.bin", std::process::id()));
    let file = engine.open(&path, OpenMode::Truncate)?;
    let mut tensor = HostBuffer::new(1 << 20)?;
    for (i, b) in tensor.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    file.write_at(0, &tensor)?;
    let mut back = HostBuffer::new(tensor.len())?;
    let n = file.read_at(0, &mut back)?;
    assert_eq!(n, tensor.len());
    assert_eq!(&back[..], &tensor[..]);
    drop(file);
    let _ = std::fs::remove_file(&path);
    println!(
        "wrote and read back {n} bytes through {:?}",
        engine.backend_names()
    );
    Ok(())
}
