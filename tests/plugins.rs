//! Plugins seen through the facade: a compiled-in plugin crate shows up in
//! [`fastensor::registry`] with its origin, and (with the `plugins` feature) a dynamic plugin
//! listed in `FASTENSOR_PLUGINS` is loaded, listed with its file, and drives an engine.

use fastensor::{Origin, Registry};

#[test]
fn compiled_in_plugin_is_listed_with_its_origin() {
    checksum_plugin::link();
    let registry: Registry = fastensor::registry();
    let entry = registry.entry(checksum_plugin::CHECKSUM_POSIX).unwrap();
    assert_eq!(
        entry.origin,
        Origin::CompiledInPlugin {
            module: "checksum_plugin"
        }
    );
    for entry in registry.entries() {
        if entry.backend.name() != checksum_plugin::CHECKSUM_POSIX {
            assert_eq!(entry.origin, Origin::BuiltIn, "{}", entry.backend.name());
        }
    }
}

#[cfg(feature = "plugins")]
mod dynamic {
    use fastensor::plugin::{RegistryExt, PLUGINS_ENV};
    use fastensor::{Engine, HostBuffer, OpenMode, Origin};
    use std::path::PathBuf;

    /// The example plugin's `cdylib`, built by cargo with this test (a dev-dependency).
    fn example_plugin() -> PathBuf {
        fastensor_testkit::cdylib("fastensor_example_plugin")
    }

    #[test]
    fn env_plugins_join_the_registry_and_serve_an_engine() {
        let plugin = example_plugin();
        let list = std::env::join_paths([plugin.clone()]).unwrap();
        // The only test of this binary that touches the variable.
        std::env::set_var(PLUGINS_ENV, list);
        let mut registry = fastensor::registry();
        let results = registry.load_env_plugins();
        std::env::remove_var(PLUGINS_ENV);
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].as_ref().unwrap(), "example-stdfs");
        let entry = registry.entry("example-stdfs").unwrap();
        assert_eq!(
            entry.origin,
            Origin::DynamicPlugin {
                path: plugin.clone()
            }
        );
        assert!(entry.origin.to_string().starts_with("dynamic plugin ("));

        // The engine, pinned to the plugin, moves a tensor through it.
        let engine = Engine::builder()
            .registry(registry)
            .pin("example-stdfs")
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        let f = engine.open(&path, OpenMode::Truncate).unwrap();
        let data = HostBuffer::from_slice(&[7u8; 10_000]).unwrap();
        f.write_at(0, &data).unwrap();
        let mut back = HostBuffer::new(10_000).unwrap();
        assert_eq!(f.read_at(0, &mut back).unwrap(), 10_000);
        assert_eq!(&back[..], &data[..]);
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 10_000]);
    }
}
