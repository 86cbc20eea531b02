//! Files in and out of a run through `airlock serve`: input files placed in
//! the workspace, artifacts the agent leaves in its output directory stored
//! within the run's and the organization's quota and downloaded by signed
//! URL; and the attacks: another organization's run, a tampered, moved or
//! expired signature, `../` and absolute paths (from a tenant and from the
//! agent itself), symlinks left pointing outside, an over-quota agent.

use serde_json::{Value, json};

use crate::support::serve::{Server, base_env, create_org, wait_for};

const SIGNING: &str = "test-upload-signing-secret-0123456789";

/// Reads its input, writes its outputs (the last one as large as the
/// prompt says), leaves two symlinks pointing outside, and tries to store
/// artifacts by path itself through its sidecar.
const AGENT: &str = r#"import os, urllib.request
ws = os.environ['AIRLOCK_WORKSPACE']
out = os.environ['AIRLOCK_OUTPUT_DIR']
n = int(open(os.environ['AIRLOCK_PROMPT_FILE']).read())
text = open(os.path.join(ws, 'data/in.txt')).read()
os.makedirs(os.path.join(out, 'sub'), exist_ok=True)
open(os.path.join(out, 'report.txt'), 'w').write(text.upper())
open(os.path.join(out, 'sub/b.bin'), 'wb').write(b'\x00\x01\x02')
open(os.path.join(out, 'zz-big.txt'), 'w').write('x' * n)
os.symlink('/etc/passwd', os.path.join(out, 'leak'))
os.symlink('..', os.path.join(out, 'updir'))
base = os.environ['AIRLOCK_MCP_URL'].rsplit('/mcp', 1)[0]
for p in ['..%2F..%2Fescape', '%2Fabs', 'ok%2F..%2F..%2Fx']:
    req = urllib.request.Request(base + '/artifacts', data=b'evil', method='POST',
                                 headers={'x-airlock-artifact-path': p})
    try:
        urllib.request.urlopen(req)
        print('stored', p, flush=True)
    except Exception as e:
        print('refused', p, getattr(e, 'code', e), flush=True)
"#;

fn agent() -> Value {
    json!({
        "manifest": "[agent]\nname = \"filer\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 60\noutputs = \"out\"\n\n[network]\negress = \"none\"\n",
        "files": { "agent.py": AGENT },
    })
}

/// Runs `filer` with `big` bytes in its last output; the run's artifacts.
fn run_and_list(s: &Server, key: &str, big: usize) -> (String, Value) {
    let (st, run) = s.call(
        "POST",
        "/v1/runs",
        Some(key),
        Some(&json!({"agent": "filer", "prompt": big.to_string(), "files": {"data/in.txt": "hello from input"}})),
    );
    assert_eq!(st, 202, "{run}");
    let id = run["id"].as_str().unwrap().to_owned();
    let done = wait_for(s, &format!("/v1/runs/{id}"), key, 90, |v| {
        v["ended_at"].as_i64().is_some()
    });
    assert_eq!(done["status"], "succeeded", "{done}\n{}", s.log_text());
    let logs = s
        .call(
            "GET",
            &format!("/v1/runs/{id}/logs?after=0"),
            Some(key),
            None,
        )
        .1
        .to_string();
    for p in ["..%2F..%2Fescape", "%2Fabs", "ok%2F..%2F..%2Fx"] {
        assert!(logs.contains(&format!("refused {p} 400")), "{p}: {logs}");
    }
    let (st, list) = s.call("GET", &format!("/v1/runs/{id}/artifacts"), Some(key), None);
    assert_eq!(st, 200, "{list}");
    (id, list)
}

/// `(path, refused)` of each listed artifact.
fn seen(list: &Value) -> Vec<(String, Option<String>)> {
    list["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["path"].as_str().unwrap().to_owned(),
                a["refused"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

fn artifact<'a>(list: &'a Value, path: &str) -> &'a Value {
    list["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["path"] == path)
        .unwrap()
}

#[test]
fn inputs_reach_the_workspace_and_artifacts_come_back_by_signed_url_within_quota_and_no_further() {
    if !crate::support::namespace_available() {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("airlock-serve-")
        .tempdir()
        .unwrap();
    let mut env = base_env(home.path(), None);
    env.push(("UPLOAD_SIGNING_SECRET".into(), SIGNING.into()));
    env.push(("RUN_MAX_ARTIFACT_BYTES".into(), "3000".into()));
    env.push(("ORG_MAX_ARTIFACT_BYTES".into(), "5000".into()));
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, key) = create_org(&env, "Acme", &[]);
    let (_, other) = create_org(&env, "Other", &[]);
    let k = Some(key.as_str());
    assert_eq!(s.call("POST", "/v1/agents", k, Some(&agent())).0, 201);

    // Input paths are checked as a bundle's, sizes within their caps.
    for bad in [
        "../x",
        "/etc/passwd",
        "a/../../b",
        "a//b",
        ".airlock/prompt.txt",
    ] {
        let (st, v) = s.call(
            "POST",
            "/v1/runs",
            k,
            Some(&json!({"agent": "filer", "files": {bad: "x"}})),
        );
        assert_eq!(
            (st, v["error"]["code"].as_str()),
            (422, Some("invalid")),
            "{bad}: {v}"
        );
    }
    let (st, v) = s.call(
        "POST",
        "/v1/runs",
        k,
        Some(&json!({"agent": "filer", "files": {"big": "x".repeat((1 << 20) + 1)}})),
    );
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (413, Some("too_large")),
        "{v}"
    );

    // Over the run's quota: what fits is stored, the rest recorded refused.
    let (_, list) = run_and_list(&s, &key, 3500);
    let refused = |r: &str| Some(r.to_owned());
    assert_eq!(
        seen(&list),
        [
            ("leak".into(), refused("symlink")),
            ("report.txt".into(), None),
            ("sub/b.bin".into(), None),
            ("updir".into(), refused("symlink")),
            ("zz-big.txt".into(), refused("run_quota")),
        ],
        "{list}"
    );
    assert!(artifact(&list, "leak")["download_url"].is_null());

    // Within it: all stored; downloaded without a key by its signed URL.
    let (run2, list2) = run_and_list(&s, &key, 2900);
    let report = artifact(&list2, "report.txt");
    let url = report["download_url"].as_str().unwrap().to_owned();
    let (st, headers, body) = s.raw("GET", &url, None, None, "");
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body, b"HELLO FROM INPUT");
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "x-content-type-options" && v == "nosniff")
    );
    let (st, _, bin) = s.raw(
        "GET",
        artifact(&list2, "sub/b.bin")["download_url"]
            .as_str()
            .unwrap(),
        None,
        None,
        "",
    );
    assert_eq!((st, bin.as_slice()), (200, &[0u8, 1, 2][..]));

    // The organization's quota: the third run's large file no longer fits.
    let (_, list3) = run_and_list(&s, &key, 2900);
    assert_eq!(
        artifact(&list3, "zz-big.txt")["refused"],
        "org_quota",
        "{list3}"
    );
    assert!(artifact(&list3, "report.txt")["refused"].is_null());

    // Another organization sees no such run, and its key lists nothing.
    let (st, v) = s.call(
        "GET",
        &format!("/v1/runs/{run2}/artifacts"),
        Some(&other),
        None,
    );
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );

    // The signature binds the run, the path and the expiry.
    let signature = url.rsplit_once("signature=").unwrap().1.to_owned();
    let expires = report["download_expires_at"].as_i64().unwrap();
    let download = |run: &str, path: &str, expires: i64, sig: &str| {
        let (st, v) = s.call(
            "GET",
            &format!(
                "/v1/runs/{run}/artifacts/download?path={path}&expires={expires}&signature={sig}"
            ),
            None,
            None,
        );
        (st, v["error"]["code"].as_str().map(str::to_owned))
    };
    let invalid = (403, Some("signature_invalid".to_owned()));
    let mut flipped = signature.clone().into_bytes();
    flipped[10] = if flipped[10] == b'a' { b'b' } else { b'a' };
    let flipped = String::from_utf8(flipped).unwrap();
    assert_eq!(download(&run2, "report.txt", expires, &flipped), invalid);
    assert_eq!(download(&run2, "zz-big.txt", expires, &signature), invalid);
    assert_eq!(
        download(&run2, "report.txt", expires + 60, &signature),
        invalid
    );
    assert_eq!(
        download("run_0000000000000000", "report.txt", expires, &signature),
        invalid
    );
    assert_eq!(
        download(&run2, "..%2F..%2Fetc%2Fpasswd", expires, &signature),
        invalid
    );
    assert_eq!(download(&run2, "report.txt", expires, "not-hex"), invalid);
    // An expired URL, validly signed, is refused as expired.
    let signer = airlock_vault::UrlSigner::new(
        airlock_vault::SigningKeyring::parse("UPLOAD_SIGNING_SECRET", SIGNING).unwrap(),
    );
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    let old = signer.sign(&format!("{run2}/report.txt"), now - 100, 10);
    assert_eq!(
        download(&run2, "report.txt", old.expires, &old.signature),
        (403, Some("signature_expired".to_owned()))
    );
    // A fresh signature of ours is what the server made.
    let fresh = signer.sign(&format!("{run2}/report.txt"), now, 60);
    assert_eq!(
        download(&run2, "report.txt", fresh.expires, &fresh.signature).0,
        200
    );
}
