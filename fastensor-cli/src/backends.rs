//! `fastensor backends`.

use crate::table::Table;
use fastensor::Availability;

/// Prints one row per backend.
pub fn run() -> fastensor::Result<()> {
    let registry = fastensor::registry();
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
