//! Whether io_uring can run here, and a clear reason when it cannot.

use fastensor_core::Availability;
use fastensor_sys::fork::ForkOnceLock;
use io_uring::{opcode, IoUring, Probe};
use std::io;

/// Where the kernel says whether io_uring is disabled (Linux 6.6 and later).
pub const DISABLED_SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";

/// Probes this machine once per process: reads [`DISABLED_SYSCTL`] and sets up a small ring.
/// A child made by `fork` keeps its parent's answer when the parent had one.
pub fn probe() -> Availability {
    static CACHED: ForkOnceLock<Availability> = ForkOnceLock::new();
    CACHED
        .get_or_init(|| {
            let sysctl = std::fs::read_to_string(DISABLED_SYSCTL).ok();
            probe_with(setup_test_ring, sysctl.as_deref())
        })
        .clone()
}

/// Decides availability from the content of `kernel.io_uring_disabled` (`None` when the file
/// does not exist) and the outcome of `setup`, which tries to set up a ring. Never panics.
///
/// With the sysctl at 2 io_uring is off for everyone and `setup` is not even tried; otherwise
/// the setup's error decides, and the reason names the errno and its likely cause.
pub fn probe_with(
    setup: impl FnOnce() -> io::Result<()>,
    disabled_sysctl: Option<&str>,
) -> Availability {
    let disabled = disabled_sysctl.map(str::trim);
    if disabled == Some("2") {
        return Availability::Unavailable {
            reason: "io_uring is disabled for all processes (kernel.io_uring_disabled = 2)".into(),
        };
    }
    match setup() {
        Ok(()) => Availability::Available,
        Err(e) => Availability::Unavailable {
            reason: setup_failure_reason(&e, disabled),
        },
    }
}

/// A human-readable reason for a failed ring setup.
pub(crate) fn setup_failure_reason(err: &io::Error, disabled_sysctl: Option<&str>) -> String {
    const ENOSYS: i32 = rustix::io::Errno::NOSYS.raw_os_error();
    const EPERM: i32 = rustix::io::Errno::PERM.raw_os_error();
    const ENOMEM: i32 = rustix::io::Errno::NOMEM.raw_os_error();
    const EINVAL: i32 = rustix::io::Errno::INVAL.raw_os_error();
    match err.raw_os_error() {
        Some(ENOSYS) => "io_uring is not supported by this kernel (ENOSYS)".into(),
        Some(EPERM) if disabled_sysctl == Some("1") => "io_uring is restricted to privileged \
             processes and members of kernel.io_uring_group (kernel.io_uring_disabled = 1), \
             and this process is not permitted (EPERM)"
            .into(),
        Some(EPERM) => "io_uring setup was refused (EPERM); a seccomp filter or container \
             policy may block it"
            .into(),
        Some(ENOMEM) => "cannot set up an io_uring ring: out of memory or locked memory \
             (ENOMEM; see RLIMIT_MEMLOCK)"
            .into(),
        Some(EINVAL) => "io_uring setup was refused as invalid (EINVAL); the kernel may be \
             too old"
            .into(),
        _ => format!("io_uring setup failed: {err}"),
    }
}

/// Sets up a two-entry ring and checks the kernel knows the opcodes the backend uses.
fn setup_test_ring() -> io::Result<()> {
    let ring = IoUring::new(2)?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    let needed = [
        (opcode::Read::CODE, "READ"),
        (opcode::Write::CODE, "WRITE"),
        (opcode::ReadFixed::CODE, "READ_FIXED"),
        (opcode::WriteFixed::CODE, "WRITE_FIXED"),
    ];
    for (code, name) in needed {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the kernel's io_uring lacks IORING_OP_{name}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(a: Availability) -> String {
        match a {
            Availability::Unavailable { reason } => reason,
            Availability::Available => panic!("expected unavailable"),
        }
    }

    #[test]
    fn simulated_enosys_gives_a_clear_reason() {
        let a = probe_with(|| Err(io::Error::from_raw_os_error(38)), Some("0\n"));
        assert_eq!(
            reason(a),
            "io_uring is not supported by this kernel (ENOSYS)"
        );
    }

    #[test]
    fn simulated_eperm_names_the_sysctl_when_restricted() {
        let r = reason(probe_with(
            || Err(io::Error::from_raw_os_error(1)),
            Some("1\n"),
        ));
        assert!(
            r.contains("kernel.io_uring_disabled = 1") && r.contains("EPERM"),
            "{r}"
        );
        let r = reason(probe_with(|| Err(io::Error::from_raw_os_error(1)), None));
        assert!(r.contains("EPERM") && r.contains("seccomp"), "{r}");
    }

    #[test]
    fn disabled_sysctl_2_skips_setup() {
        let r = reason(probe_with(|| panic!("setup must not run"), Some("2\n")));
        assert!(r.contains("kernel.io_uring_disabled = 2"), "{r}");
    }

    #[test]
    fn other_errors_and_success() {
        let r = reason(probe_with(|| Err(io::Error::from_raw_os_error(12)), None));
        assert!(r.contains("ENOMEM"), "{r}");
        let r = reason(probe_with(|| Err(io::Error::from_raw_os_error(5)), None));
        assert!(r.starts_with("io_uring setup failed:"), "{r}");
        assert_eq!(probe_with(|| Ok(()), Some("0")), Availability::Available);
        assert_eq!(probe_with(|| Ok(()), Some("1")), Availability::Available);
    }

    #[test]
    fn this_machine_probes_without_panicking() {
        // Either outcome is fine; it must not panic and must explain itself.
        if let Availability::Unavailable { reason } = probe() {
            assert!(!reason.is_empty());
        }
    }
}
