//! The signing tools of the built binary: `airlock catalog keygen|sign|
//! verify` (and `airlock bundle`), each refusal a failing exit with its
//! reason. Files only: nothing is sent anywhere.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::path::Path;
use std::process::{Command, Output};

use crate::support::AIRLOCK;

fn airlock(home: &Path, args: &[&str]) -> Output {
    Command::new(AIRLOCK)
        .args(args)
        .env("AIRLOCK_HOME", home)
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn refused(o: &Output, why: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(why), "{err}");
}

#[test]
fn catalog_keygen_sign_verify_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let d = |f: &str| dir.path().join(f).to_str().unwrap().to_owned();
    ok(&airlock(dir.path(), &["catalog", "keygen", &d("k")]));
    ok(&airlock(dir.path(), &["catalog", "keygen", &d("other")]));
    // A key is never overwritten.
    refused(
        &airlock(dir.path(), &["catalog", "keygen", &d("k")]),
        "creating",
    );
    let catalog = r#"{"schema_version": 1, "serial": 2, "models": [{"provider": "openai", "id": "gpt-cat", "price_in_per_mtok_usd": 1}]}"#;
    std::fs::write(d("c.json"), catalog).unwrap();
    let out = ok(&airlock(
        dir.path(),
        &["catalog", "sign", "--key", &d("k"), &d("c.json")],
    ));
    assert!(out.contains("serial 2, 1 models"), "{out}");
    let out = ok(&airlock(
        dir.path(),
        &["catalog", "verify", "--trust", &d("k.pub"), &d("c.json")],
    ));
    assert!(out.contains("verifies"), "{out}");
    // Another key's public file does not trust it.
    refused(
        &airlock(
            dir.path(),
            &[
                "catalog",
                "verify",
                "--trust",
                &d("other.pub"),
                &d("c.json"),
            ],
        ),
        "not trusted",
    );
    // Changed after signing.
    std::fs::write(d("c.json"), catalog.replace("gpt-cat", "gpt-dog")).unwrap();
    refused(
        &airlock(
            dir.path(),
            &["catalog", "verify", "--trust", &d("k.pub"), &d("c.json")],
        ),
        "does not verify",
    );
    // A malformed catalog is never signed.
    std::fs::write(
        d("bad.json"),
        r#"{"schema_version": 1, "serial": 0, "models": []}"#,
    )
    .unwrap();
    refused(
        &airlock(
            dir.path(),
            &["catalog", "sign", "--key", &d("k"), &d("bad.json")],
        ),
        "serial",
    );
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(d("k")).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
}

/// `airlock run` of `dir/airlock.toml` on the process backend under
/// `policy`, trusting `trust`.
fn run_under(home: &Path, dir: &Path, policy: &str, trust: &str) -> Output {
    Command::new(AIRLOCK)
        .args(["run", "--backend", "process", "--json", "-f"])
        .arg(dir.join("airlock.toml"))
        .env("AIRLOCK_HOME", home)
        .env("AFPS_SIGNATURE_POLICY", policy)
        .env("AFPS_TRUST_ROOT", trust)
        .env_remove("DATABASE_URL")
        .env_remove("AIRLOCK_SERVER")
        .output()
        .unwrap()
}

#[test]
fn bundle_pack_sign_verify_and_a_run_under_each_policy() {
    let home = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let agent = tempfile::tempdir().unwrap();
    let k = |f: &str| keys.path().join(f).to_str().unwrap().to_owned();
    let a = agent.path().to_str().unwrap().to_owned();
    std::fs::write(
        agent.path().join("airlock.toml"),
        "[agent]\nname = \"signed\"\ncommand = [\"/bin/sh\", \"run.sh\"]\ntimeout = 30\n\n[network]\negress = \"none\"\n",
    )
    .unwrap();
    std::fs::write(agent.path().join("run.sh"), "echo signed-agent-ran\n").unwrap();
    ok(&airlock(home.path(), &["bundle", "keygen", &k("root")]));
    ok(&airlock(home.path(), &["bundle", "keygen", &k("dev")]));
    let out = ok(&airlock(home.path(), &["bundle", "pack", &a]));
    assert!(out.contains("packed 2 files"), "{out}");
    // The developer's key, endorsed by the root key: a chain of one link.
    let link = ok(&airlock(
        home.path(),
        &["bundle", "endorse", "--key", &k("root"), &k("dev.pub")],
    ));
    std::fs::write(k("dev.link"), link).unwrap();
    ok(&airlock(
        home.path(),
        &[
            "bundle",
            "sign",
            "--key",
            &k("dev"),
            "--chain",
            &k("dev.link"),
            &a,
        ],
    ));
    let out = ok(&airlock(
        home.path(),
        &["bundle", "verify", "--trust", &k("root.pub"), &a],
    ));
    assert!(out.contains("every file matches"), "{out}");
    let root_trust = std::fs::read_to_string(k("root.pub")).unwrap();

    // The legitimate signed bundle runs under `required`.
    let o = run_under(home.path(), agent.path(), "required", &root_trust);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains(r#""status":"succeeded""#), "{stdout}");

    // A file changed after signing: refused before anything starts, with its code.
    std::fs::write(agent.path().join("run.sh"), "echo tampered\n").unwrap();
    refused(
        &airlock(
            home.path(),
            &["bundle", "verify", "--trust", &k("root.pub"), &a],
        ),
        "(file_changed)",
    );
    for policy in ["required", "warn"] {
        let o = run_under(home.path(), agent.path(), policy, &root_trust);
        assert_eq!(o.status.code(), Some(2), "{policy}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("agent bundle refused (file_changed)"), "{err}");
        assert!(o.stdout.is_empty(), "{policy}: a run started");
    }
    // Off checks nothing.
    let o = run_under(home.path(), agent.path(), "off", "");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A stale manifest is not signed.
    refused(
        &airlock(home.path(), &["bundle", "sign", "--key", &k("dev"), &a]),
        "pack",
    );

    // Unsigned: required refuses, warn runs.
    std::fs::remove_file(agent.path().join("airlock-bundle.sig")).unwrap();
    let o = run_under(home.path(), agent.path(), "required", &root_trust);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("(unsigned_required)"));
    let o = run_under(home.path(), agent.path(), "warn", "");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Nothing refused was recorded as a run.
    let runs = ok(&airlock(home.path(), &["runs", "list"]));
    assert_eq!(
        runs.lines().filter(|l| l.contains("run_")).count(),
        3,
        "{runs}"
    );
}

/// On `airlock serve`, a bundle refusal is the run's stored failure
/// reason, with its code, and nothing of the run starts.
#[test]
fn a_refused_bundle_is_the_served_runs_failure_reason() {
    use crate::support::serve::{Server, agent_body, base_env, create_org, wait_for};
    let home = tempfile::Builder::new()
        .prefix("airlock-serve-")
        .tempdir()
        .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("k");
    ok(&airlock(
        home.path(),
        &["bundle", "keygen", key.to_str().unwrap()],
    ));
    let trust = std::fs::read_to_string(keys.path().join("k.pub")).unwrap();
    let mut env = base_env(home.path(), None);
    env.push(("AFPS_SIGNATURE_POLICY".into(), "required".into()));
    env.push(("AFPS_TRUST_ROOT".into(), trust));
    let s = Server::start(&env, "process", home.path().join("serve.log"));
    let (_, api_key) = create_org(&env, "Acme", &[]);
    let k = Some(api_key.as_str());
    let body = agent_body("unsigned", "print('must not run', flush=True)\n", 30);
    assert_eq!(s.call("POST", "/v1/agents", k, Some(&body)).0, 201);
    let (st, run) = s.call(
        "POST",
        "/v1/runs",
        k,
        Some(&serde_json::json!({"agent": "unsigned"})),
    );
    assert_eq!(st, 202, "{run}");
    let id = run["id"].as_str().unwrap();
    let done = wait_for(&s, &format!("/v1/runs/{id}"), &api_key, 60, |v| {
        v["ended_at"].as_i64().is_some()
    });
    assert_eq!(done["status"], "failed", "{done}");
    let why = done["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("agent bundle refused (unsigned_required)"),
        "{done}"
    );
}
