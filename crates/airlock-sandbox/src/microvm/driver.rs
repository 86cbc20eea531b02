//! Which VMM runs a microVM run's guest: QEMU (`-M microvm`, the default)
//! or Firecracker (under its jailer). `RUN_ADAPTER=microvm` takes
//! [`ENV_MICROVM_DRIVER`]; `RUN_ADAPTER=firecracker`, the spec's name, is
//! the firecracker driver.

use serde::{Deserialize, Serialize};

/// `qemu` (default) or `firecracker`.
pub const ENV_MICROVM_DRIVER: &str = "MICROVM_DRIVER";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Driver {
    Qemu,
    Firecracker,
}

/// A driver setting that is not one, or that contradicts the adapter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DriverError(pub String);

impl Driver {
    /// The driver of `adapter` (`microvm` or `firecracker`) with
    /// [`ENV_MICROVM_DRIVER`] set to `setting` (empty: unset).
    pub fn select(adapter: &str, setting: Option<&str>) -> Result<Driver, DriverError> {
        let setting = setting.filter(|s| !s.is_empty());
        let named = match setting {
            None => None,
            Some("qemu") => Some(Driver::Qemu),
            Some("firecracker") => Some(Driver::Firecracker),
            Some(other) => {
                return Err(DriverError(format!("{other:?} is not qemu or firecracker")));
            }
        };
        match (adapter, named) {
            ("firecracker", Some(Driver::Qemu)) => Err(DriverError(
                "RUN_ADAPTER=firecracker is the firecracker driver; unset MICROVM_DRIVER=qemu or use RUN_ADAPTER=microvm"
                    .into(),
            )),
            ("firecracker", _) => Ok(Driver::Firecracker),
            (_, named) => Ok(named.unwrap_or(Driver::Qemu)),
        }
    }

    /// The backend's name on a run's record.
    pub fn backend_name(self) -> &'static str {
        match self {
            Driver::Qemu => "microvm",
            Driver::Firecracker => "firecracker",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_adapter_and_the_setting_pick_the_driver() {
        assert_eq!(Driver::select("microvm", None), Ok(Driver::Qemu));
        assert_eq!(Driver::select("microvm", Some("")), Ok(Driver::Qemu));
        assert_eq!(
            Driver::select("microvm", Some("firecracker")),
            Ok(Driver::Firecracker)
        );
        assert_eq!(Driver::select("firecracker", None), Ok(Driver::Firecracker));
        assert_eq!(
            Driver::select("firecracker", Some("firecracker")),
            Ok(Driver::Firecracker)
        );
        assert!(Driver::select("firecracker", Some("qemu")).is_err());
        let e = Driver::select("microvm", Some("kvmtool")).unwrap_err();
        assert!(e.0.contains("\"kvmtool\""), "{e}");
    }
}
