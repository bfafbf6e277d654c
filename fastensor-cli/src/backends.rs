//! `fastensor backends`.

use crate::table::Table;
use fastensor::Availability;

/// Prints one row per backend: the compiled-in ones and, with the `plugins` feature, the
/// dynamic plugins listed in `FASTENSOR_PLUGINS` (a plugin that cannot be loaded is a warning
/// on standard error, not a failure).
pub fn run() -> fastensor::Result<()> {
    let registry = fastensor::registry();
    #[cfg(feature = "plugins")]
    let registry = {
        use fastensor::plugin::RegistryExt;
        let mut registry = registry;
        for result in registry.load_env_plugins() {
            if let Err(e) = result {
                eprintln!("fastensor: warning: plugin not loaded: {e}");
            }
        }
        registry
    };
    let mut table = Table::new(&["backend", "status", "origin", "capabilities"]);
    for entry in registry.entries() {
        let b = &entry.backend;
        let status = match b.probe() {
            Availability::Available => match b.detail() {
                Some(detail) => format!("available: {detail}"),
                None => "available".to_string(),
            },
            Availability::Unavailable { reason } => format!("unavailable: {reason}"),
        };
        table.row(vec![
            b.name().to_string(),
            status,
            entry.origin.to_string(),
            b.capabilities().summary(),
        ]);
    }
    print!("{table}");
    Ok(())
}
