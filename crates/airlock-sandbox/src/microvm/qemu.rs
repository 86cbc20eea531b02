//! The QEMU driver: the command line of one guest, built from the run's
//! limits and disks (pure, unit-tested), and whether KVM can be used.

use std::path::{Path, PathBuf};

use super::image::GuestImage;
use super::kernel::KernelKind;

/// The QEMU binary: `MICROVM_QEMU`, else `qemu-system-x86_64` on `PATH`.
pub const ENV_MICROVM_QEMU: &str = "MICROVM_QEMU";
pub const DEFAULT_QEMU: &str = "qemu-system-x86_64";

/// How the guest's instructions run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Accel {
    /// Hardware virtualization (`/dev/kvm`).
    Kvm,
    /// QEMU's emulator: slow, and said loudly.
    Tcg,
}

/// What TCG costs an operator, said once per platform.
pub const TCG_WARNING: &str = "the microVM backend runs its guests under QEMU's emulator (TCG): no usable KVM here (/dev/kvm missing, not writable, or a PVM host without VMX/SVM), so each guest boots in seconds and runs several times slower than on a KVM host; the isolation is the same";

/// KVM where `/dev/kvm` opens for writing and the CPU has hardware
/// virtualization (a PVM guest's `/dev/kvm` lacks it and boots no stock guest).
pub fn accel() -> Accel {
    let kvm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    let hw = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| {
        c.lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
    });
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    if kvm && hw && !pvm {
        Accel::Kvm
    } else {
        Accel::Tcg
    }
}

/// The host's TSC rate in kHz (the guest's, under TCG), from
/// `/proc/cpuinfo`; the guest's kernel takes it instead of calibrating
/// against timers a microvm machine does not have.
pub fn tsc_khz() -> u64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("cpu MHz")?
                    .split(':')
                    .nth(1)?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
        })
        .map_or(2_000_000, |mhz| crate::whole(mhz * 1000.0, 100_000_000))
}

/// The `-M` of a guest booting `kernel`: a microvm machine without option
/// ROMs, its devices in ACPI tables for Debian's kernel, or (`acpi=off`) on
/// the kernel's command line, which QEMU appends (`virtio_mmio.device=…`),
/// for the minimal kernel, which has no ACPI.
pub fn machine(kernel: KernelKind) -> String {
    let acpi = if kernel.acpi() { "on" } else { "off" };
    format!("microvm,x-option-roms=off,pit=on,pic=on,rtc=on,acpi={acpi}")
}

/// The guest kernel's command line (QEMU appends the virtio-mmio devices
/// to it for the minimal kernel). Beyond the console, the initramfs's
/// `/init`, and a panic or a restart ending the VM (`reboot=t`, QEMU's
/// `-no-reboot`), only what shortens the boot and changes no confinement
/// (`docs/performance.md`, "where the boot goes"):
/// - the minimal kernel: no legacy BSD ptys (`pty.legacy_count=0`; its
///   fragment keeps `CONFIG_LEGACY_PTYS`, whose 256 devices took ~0.1 s of
///   TCG to register; Unix98 ptys, `/dev/ptmx`, are untouched);
/// - under TCG, whose TSC is the host's: its rate given
///   (`tsc_early_khz`, no calibration against timers a microvm machine does
///   not have), and trusted (`tsc=reliable`: the watchdog, measuring it
///   against emulated timer ticks that run late on a loaded host, would
///   switch the guest's clock to jiffies mid-boot) and the IO-APIC timer
///   not re-checked (`no_timer_check`); for the minimal kernel (a periodic
///   tick, no tickless idle) the local APIC timer neither calibrated nor
///   used (`noapictimer`: its calibration spins for 25 ticks, ~0.1 s; the
///   PIT drives the tick instead, at the same HZ). Debian's kernel (tickless
///   idle) hangs at its first idle without the local APIC timer, so it keeps
///   it. Under KVM (`-cpu host`) the TSC-deadline timer needs no
///   calibration and none of these is given.
pub fn kernel_args(accel: Accel, kernel: KernelKind, tsc_khz: u64) -> String {
    let mut append = String::from("console=ttyS0 rdinit=/init quiet reboot=t panic=-1");
    if kernel == KernelKind::Minimal {
        append.push_str(" pty.legacy_count=0");
    }
    if accel == Accel::Tcg {
        append.push_str(&format!(
            " tsc_early_khz={tsc_khz} tsc=reliable no_timer_check"
        ));
        if kernel == KernelKind::Minimal {
            append.push_str(" noapictimer");
        }
    }
    append
}

/// The root disk's virtio serial, which the guest's stage 1 looks for.
pub const ROOT_SERIAL: &str = "airlock-root";

/// One guest's machine.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct QemuPlan {
    /// `airlock-<run id>`: the VMM's `-name`, which boot reclaim and tests
    /// find it by.
    pub name: String,
    pub qemu: PathBuf,
    pub accel: Accel,
    pub tsc_khz: u64,
    pub image: GuestImage,
    pub memory_mb: u64,
    pub vcpus: u64,
    /// Read-only disks after the root (serial `agent<i>`): host files the
    /// helper opens and hands the VMM as descriptors (the VMM's uid could
    /// not reach them in the run's private directory).
    pub disks: Vec<PathBuf>,
}

/// The descriptors the VMM inherits: its end of the channel, and one per disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fds<'a> {
    pub channel: i32,
    pub disks: &'a [i32],
}

impl QemuPlan {
    /// The command line: a microvm machine with no network device, no
    /// default devices, no firmware tables beyond ACPI's, QEMU's own
    /// seccomp filter on, the root and the agent's disks read-only, the
    /// channel one virtio-serial port, the serial console on stdout.
    pub fn argv(&self, fds: Fds<'_>) -> Vec<String> {
        let append = kernel_args(self.accel, self.image.kind, self.tsc_khz);
        let (accel, cpu) = match self.accel {
            Accel::Kvm => ("kvm", "host"),
            Accel::Tcg => ("tcg", "max"),
        };
        let mut a: Vec<String> = vec![
            self.qemu.display().to_string(),
            "-name".into(),
            self.name.clone(),
            "-M".into(),
            machine(self.image.kind),
            "-accel".into(),
            accel.into(),
            "-cpu".into(),
            cpu.into(),
            "-m".into(),
            format!("{}M", self.memory_mb.max(128)),
            "-smp".into(),
            self.vcpus.clamp(1, 64).to_string(),
            "-nodefaults".into(),
            "-no-user-config".into(),
            "-nographic".into(),
            "-nic".into(),
            "none".into(),
            "-no-reboot".into(),
            "-sandbox".into(),
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
            "-serial".into(),
            "stdio".into(),
            "-kernel".into(),
            self.image.kernel.display().to_string(),
            "-initrd".into(),
            self.image.initrd.display().to_string(),
            "-append".into(),
            append,
        ];
        let disk = |a: &mut Vec<String>, id: String, file: String, serial: Option<String>| {
            a.push("-drive".into());
            a.push(format!(
                "id={id},file={file},format=raw,if=none,readonly=on"
            ));
            a.push("-device".into());
            a.push(match serial {
                Some(s) => format!("virtio-blk-device,drive={id},serial={s}"),
                None => format!("virtio-blk-device,drive={id}"),
            });
        };
        disk(
            &mut a,
            "root".into(),
            self.image.root.display().to_string(),
            Some(ROOT_SERIAL.into()),
        );
        for (i, fd) in fds.disks.iter().enumerate() {
            a.push("-add-fd".into());
            a.push(format!("fd={fd},set={}", i + 1));
            disk(
                &mut a,
                format!("a{i}"),
                format!("/dev/fdset/{}", i + 1),
                Some(format!("agent{i}")),
            );
        }
        a.extend([
            "-device".into(),
            // Port 0 is the console's (unused), port 1 the channel: the
            // guest's driver sets up two ports' queues, not the default 31's.
            "virtio-serial-device,max_ports=2".into(),
            "-chardev".into(),
            format!("socket,id=c0,fd={}", fds.channel),
            "-device".into(),
            format!(
                "virtserialport,chardev=c0,name={}",
                airlock_platform_api::channel::PORT_NAME
            ),
        ]);
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(accel: Accel) -> QemuPlan {
        QemuPlan {
            name: "airlock-run_1".into(),
            qemu: "/usr/bin/qemu-system-x86_64".into(),
            accel,
            tsc_khz: 2_500_000,
            image: GuestImage {
                kind: KernelKind::Debian,
                kernel: "/i/kernel-6".into(),
                initrd: "/i/initrd-6.cpio".into(),
                root: "/i/root-t.ext4".into(),
            },
            memory_mb: 1024,
            vcpus: 2,
            disks: vec!["/run/x/agent0.ext4".into()],
        }
    }

    /// No network device, QEMU's sandbox on, every disk read-only, the
    /// limits as given, the channel the one port; the emulator's clock rate
    /// only under TCG.
    #[test]
    fn the_machine_has_no_network_and_read_only_disks() {
        let fds = Fds {
            channel: 3,
            disks: &[4],
        };
        let a = plan(Accel::Tcg).argv(fds);
        let joined = a.join(" ");
        assert!(joined.contains("-nic none"), "{joined}");
        assert!(joined.contains("-nodefaults"));
        assert!(!joined.contains("netdev") && !joined.contains("virtio-net"));
        assert!(joined.contains("-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny"));
        assert_eq!(a.iter().filter(|s| s.starts_with("id=")).count(), 2);
        assert!(
            a.iter()
                .filter(|s| s.starts_with("id="))
                .all(|s| s.ends_with("readonly=on"))
        );
        assert!(joined.contains("-m 1024M -smp 2"));
        assert!(joined.contains("-accel tcg") && joined.contains("tsc_early_khz=2500000"));
        assert!(joined.contains(" tsc=reliable no_timer_check"));
        assert!(
            !joined.contains("pty.legacy_count") && !joined.contains("noapictimer"),
            "Debian's kernel is not given the minimal one's arguments"
        );
        assert!(joined.contains("virtio-serial-device,max_ports=2"));
        assert!(joined.contains("-add-fd fd=4,set=1"));
        assert!(joined.contains("file=/dev/fdset/1,") && joined.contains("serial=agent0"));
        assert!(joined.contains("socket,id=c0,fd=3"));
        assert!(joined.contains("virtserialport,chardev=c0,name=airlock.0"));
        let k = plan(Accel::Kvm).argv(fds).join(" ");
        assert!(k.contains("-accel kvm -cpu host") && !k.contains("tsc_early_khz"));
        assert!(!k.contains("noapictimer") && !k.contains("tsc=reliable"));
        assert!(
            joined.contains(",acpi=on "),
            "Debian's kernel finds its devices by ACPI"
        );
        let mut minimal = plan(Accel::Tcg);
        minimal.image.kind = KernelKind::Minimal;
        let m = minimal.argv(fds).join(" ");
        assert!(
            m.contains(",acpi=off "),
            "the minimal kernel has no ACPI: {m}"
        );
        assert!(
            m.contains(" pty.legacy_count=0") && m.contains(" noapictimer"),
            "{m}"
        );
    }
}
