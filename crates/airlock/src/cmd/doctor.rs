//! `airlock doctor`: which backends and isolation features work on this
//! host, and why not.

use std::process::ExitCode;

pub fn run() -> ExitCode {
    println!("Backends");
    for name in ["namespace", "process"] {
        match airlock_sandbox::select(name) {
            Ok(b) => match b.check() {
                Ok(()) => println!(
                    "  ✓ {name:<10} works{}",
                    if b.isolates() {
                        ""
                    } else {
                        " (isolates NOTHING)"
                    }
                ),
                Err(why) => println!("  ✗ {name:<10} {}", why.0),
            },
            Err(e) => println!("  ✗ {name:<10} {e}"),
        }
    }
    match airlock_sandbox::select("auto") {
        Ok(b) => println!("  → RUN_ADAPTER=auto picks {}", b.name()),
        Err(e) => println!("  → RUN_ADAPTER=auto: {e}"),
    }
    println!("Isolation features");
    for d in airlock_sandbox::diagnose() {
        println!(
            "  {} {:<28} {}",
            if d.works { "✓" } else { "✗" },
            d.feature,
            d.detail
        );
    }
    ExitCode::SUCCESS
}
