//! The probe reports as JSON (outside a sandbox, here): the escape tests
//! depend on its shape. Also makes `cargo test --workspace` build the probe
//! before the escape tests of `crates/airlock` run.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

#[test]
fn quick_reports_identity_and_capabilities() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_airlock-probe"))
        .arg("--quick")
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["uid"], rustix::process::getuid().as_raw());
    assert!(v["status"]["CapEff"].is_string(), "{v}");
    assert!(
        v.get("pids").is_none(),
        "--quick is only the identity part: {v}"
    );
}
