//! `AIRLOCK_SIDECAR_BUILD`: a fingerprint of the sources the sidecar is built
//! from (this crate, the crates it is made of, its own binary's `main`, the
//! lock file). The platform compares it with what an `airlock-sidecar`
//! binary beside it reports, so a sidecar binary left from another build is
//! never started in place of the one the platform was built with.

use std::hash::Hasher;
use std::path::{Path, PathBuf};

const SOURCES: &[&str] = &[
    ".",
    "../airlock-egress",
    "../airlock-platform-api",
    "../airlock-tunnel",
    "../airlock/src/bin/airlock-sidecar.rs",
    "../../Cargo.lock",
];

fn files(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let Ok(rd) = std::fs::read_dir(p) else { return };
        for e in rd.flatten() {
            let path = e.path();
            let name = e.file_name();
            if name == "target" || name.to_string_lossy().starts_with('.') {
                continue;
            }
            files(&path, out);
        }
    } else if p
        .extension()
        .is_some_and(|x| x == "rs" || x == "toml" || x == "lock")
    {
        out.push(p.to_owned());
    }
}

fn main() {
    let mut all = Vec::new();
    for s in SOURCES {
        println!("cargo:rerun-if-changed={s}");
        files(Path::new(s), &mut all);
    }
    all.sort();
    // FNV-1a over (path, contents): stable across toolchains and runs.
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 ^= u64::from(*b);
                self.0 = self.0.wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    for f in &all {
        h.write(f.to_string_lossy().as_bytes());
        h.write(&[0]);
        h.write(&std::fs::read(f).unwrap_or_default());
        h.write(&[0]);
    }
    println!(
        "cargo:rustc-env=AIRLOCK_SIDECAR_BUILD={}-{:016x}",
        std::env::var("CARGO_PKG_VERSION").unwrap_or_default(),
        h.finish()
    );
}
