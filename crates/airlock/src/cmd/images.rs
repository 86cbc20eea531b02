//! `airlock images build|check|prune`: the docker backend's two images, made on
//! this machine without a registry (see `airlock_sandbox::docker::images`).

use std::process::ExitCode;

use airlock_sandbox::docker::{self, DockerConfig, images};
use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum ImagesCommand {
    /// Build the agent and sidecar images (and the agent's base, if missing).
    Build {
        /// Build the microVM backend's guest instead (kernel, initramfs and root
        /// image, in MICROVM_IMAGES_DIR; no docker needed).
        #[arg(long)]
        microvm: bool,
    },
    /// Say whether both images are present and keep the tag contract.
    Check,
    /// Remove the images other builds of Airlock made (unless a container uses them).
    Prune {
        /// Prune the microVM guests instead (MICROVM_IMAGES_DIR): other builds'
        /// roots and kernels no guest of this build boots; no docker needed.
        #[arg(long)]
        microvm: bool,
    },
}

pub fn run(c: ImagesCommand) -> ExitCode {
    crate::logging::init_quiet();
    let rt = match super::current_thread_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(images_async(c)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {}", super::out::error_line(&e));
            ExitCode::from(2)
        }
    }
}

async fn images_async(c: ImagesCommand) -> Result<bool> {
    match c {
        ImagesCommand::Build { microvm: true } => return build_guest(),
        ImagesCommand::Prune { microvm: true } => return prune_guests(),
        _ => {}
    }
    let cfg = DockerConfig::from_env()?;
    let d = docker::connect(&cfg.host).await?;
    let say = |s: &str| eprintln!("▸ {s}");
    match c {
        ImagesCommand::Build { .. } => {
            let t0 = std::time::Instant::now();
            images::build_all(&d, &cfg.images, &say).await?;
            super::out::outln!("{}", cfg.images.agent);
            super::out::outln!("{}", cfg.images.sidecar);
            eprintln!("▸ both images built in {:.1} s", t0.elapsed().as_secs_f64());
            Ok(true)
        }
        ImagesCommand::Check => {
            let mut all = true;
            for image in [&cfg.images.agent, &cfg.images.sidecar] {
                let here = images::present(&d, image).await?;
                super::out::outln!("{} {image}", if here { "✓" } else { "✗ missing:" });
                all &= here;
            }
            Ok(all)
        }
        ImagesCommand::Prune { .. } => {
            let p = images::prune(&d, &cfg.images).await?;
            for tag in &p.removed {
                super::out::outln!("removed {tag}");
            }
            for tag in &p.in_use {
                super::out::outln!("kept {tag} (a container uses it)");
            }
            eprintln!(
                "▸ {} removed, {} in use, kept: {} and {}",
                p.removed.len(),
                p.in_use.len(),
                cfg.images.agent,
                cfg.images.sidecar
            );
            Ok(true)
        }
    }
}

/// `airlock images prune --microvm`: what no guest of this build boots,
/// each file removed printed.
fn prune_guests() -> Result<bool> {
    use airlock_sandbox::microvm::image;
    let dir = image::images_dir()?;
    let p = image::prune(&dir, &std::env::current_exe()?)
        .map_err(|e| anyhow::anyhow!("pruning {}: {e}", dir.display()))?;
    for path in &p.removed {
        super::out::outln!("removed {}", path.display());
    }
    eprintln!(
        "▸ {} removed ({} MB) from {}",
        p.removed.len(),
        p.bytes >> 20,
        dir.display()
    );
    Ok(true)
}

/// `airlock images build --microvm`: the guest of this build (what is
/// missing of it), its three files printed.
fn build_guest() -> Result<bool> {
    use airlock_sandbox::microvm::image;
    let t0 = std::time::Instant::now();
    let exe = std::env::current_exe()?;
    let dir = image::images_dir()?;
    let say = |s: &str| eprintln!("▸ {s}");
    let choice = airlock_sandbox::microvm::kernel::KernelChoice::from_env()?;
    let g = image::GuestImage::build(&dir, &exe, choice, &say)?;
    for p in [&g.kernel, &g.initrd, &g.root] {
        super::out::outln!("{}", p.display());
    }
    eprintln!(
        "▸ the microVM guest built in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(true)
}
