//! Which machine a dictionary was measured on.

use fastensor_core::FileLocation;
use serde::{Deserialize, Serialize};

/// The machine a dictionary belongs to: kernel release, and the model and file system of
/// every block device its contexts name. Measurements from another machine are not reused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Kernel release (`/proc/sys/kernel/osrelease`), empty when unknown.
    #[serde(default)]
    pub kernel: String,
    /// The devices measured on.
    #[serde(default)]
    pub devices: Vec<DeviceInfo>,
}

/// One block device of a [`Fingerprint`].
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `major:minor`.
    pub device: String,
    /// File system type seen on it.
    #[serde(default)]
    pub fs_type: String,
    /// Device model from sysfs (empty for virtual devices).
    #[serde(default)]
    pub model: String,
}

/// The facts of a machine a [`Fingerprint`] records. The selector does no I/O: the caller
/// (the `fastensor` facade) reads them from the system and passes them in.
pub trait MachineFacts {
    /// The kernel release (`/proc/sys/kernel/osrelease`), empty when unknown.
    fn kernel_release(&self) -> String;
    /// The model of block device `major:minor` (a partition reports its disk's model), empty
    /// when unknown.
    fn device_model(&self, device: &str) -> String;
}

impl Fingerprint {
    /// The fingerprint of the machine `facts` describe, with no device yet.
    pub fn of_machine(facts: &dyn MachineFacts) -> Self {
        Fingerprint::default().current(facts)
    }

    /// Adds the device of `location` (once), its model taken from `facts`.
    pub fn add_location(&mut self, location: &FileLocation, facts: &dyn MachineFacts) {
        if location.device.is_empty() || self.devices.iter().any(|d| d.device == location.device) {
            return;
        }
        self.devices.push(DeviceInfo {
            device: location.device.clone(),
            fs_type: location.fs_type.clone(),
            model: facts.device_model(&location.device),
        });
        self.devices.sort();
    }

    /// The machine `facts` describe as it is now, for the devices this fingerprint names.
    pub fn current(&self, facts: &dyn MachineFacts) -> Fingerprint {
        Fingerprint {
            kernel: facts.kernel_release(),
            devices: self
                .devices
                .iter()
                .map(|d| DeviceInfo {
                    device: d.device.clone(),
                    fs_type: d.fs_type.clone(),
                    model: facts.device_model(&d.device),
                })
                .collect(),
        }
    }

    /// How `current` differs from `self` (the kernel, or the model of a device both name);
    /// `None` when the measurements still apply.
    pub fn mismatch(&self, current: &Fingerprint) -> Option<String> {
        if self.kernel != current.kernel {
            return Some(format!(
                "measured under kernel `{}`, this is kernel `{}`",
                self.kernel, current.kernel
            ));
        }
        for saved in &self.devices {
            if let Some(now) = current.devices.iter().find(|d| d.device == saved.device) {
                if now.model != saved.model {
                    return Some(format!(
                        "device {} was `{}`, it is now `{}`",
                        saved.device, saved.model, now.model
                    ));
                }
            }
        }
        None
    }
}
