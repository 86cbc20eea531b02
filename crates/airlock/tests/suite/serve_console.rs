//! The operator's console (issue 49): `/console` on `airlock serve`.
//!
//! Over plain HTTP: signing in with an API key makes a strict session
//! cookie that `/v1` does not take; every form is refused without its CSRF
//! token; a revoked key ends its sessions; every page and asset carries a
//! Content-Security-Policy with no inline code; a run's page shows its
//! egress refusals with their code, its model call and its HTML preview
//! in `<iframe sandbox="allow-scripts">`; the preview URL is text at the
//! top level and HTML only as a frame's load, sandboxed either way; the
//! canary connection secret appears in no page.
//!
//! In a browser (`console_in_a_browser`, Playwright for Python driving
//! Debian's chromium, `tests/python/console_browser.py`): sign in, watch a
//! run go to succeeded live, its egress audit, its preview, and every
//! preview attack failing, with the page's network held to the server.

use std::process::Command;
use std::time::Duration;

use airlock_test_support::fake_provider;
use serde_json::{Value, json};

use crate::serve_approval_hooks::CANARY as CANARY_HELD;
use crate::support::python_has;
use crate::support::serve::{Server, base_env, create_org, wait_for};

const CANARY: &str = "CANARY-console-4d2e81";
const SESSION_SECRET: &str = "console-session-secret-0123456789";

/// Prints its prompt's first line, then does what its words say:
/// `refuse` (one `api_call` the guard refuses), `model` (one model call;
/// streamed with `slow`: the fake provider's delay between its events),
/// `html` (its result is an HTML preview: the attacks of
/// `console_browser.py` against the origin named by the word after
/// `html`).
const AGENT: &str = r#"
import json, os, urllib.request
prompt = open(os.environ['AIRLOCK_PROMPT_FILE']).read()
words = prompt.split()
print('agent: starting with ' + ' '.join(w for w in words if w.isalpha()), flush=True)
meta = {'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {}}
def post(url, body, headers):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method='POST')
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()
if 'refuse' in words:
    call = {'jsonrpc': '2.0', 'id': 1, 'method': 'tools/call', 'params': {
        'name': 'open__api_call', 'arguments': {'target': 'https://elsewhere.example/x'}, '_meta': meta}}
    out = post(os.environ['AIRLOCK_MCP_URL'], call, {
        'content-type': 'application/json', 'accept': 'application/json, text/event-stream',
        'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/call', 'mcp-name': 'open__api_call'})
    assert 'not_authorized' in out, out
    print('agent: the guard refused elsewhere.example', flush=True)
if 'model' in words:
    body = {'model': 'gpt-fake', 'messages': [{'role': 'user', 'content': 'hello'}]}
    if 'slow' in words:
        body.update({'stream': True, 'stream_options': {'include_usage': True}})
    out = post(os.environ['OPENAI_BASE_URL'] + '/chat/completions', body,
        {'content-type': 'application/json', 'authorization': 'Bearer ' + os.environ.get('OPENAI_API_KEY', '')})
    assert 'usage' in out, out
    print('agent: one model call', flush=True)
result = {'done': True}
if 'html' in words:
    target = words[words.index('html') + 1]
    page = open('preview.html').read().replace('__DASHBOARD__', target)
    result = {'html': page}
open(os.environ['AIRLOCK_RESULT_FILE'], 'w').write(json.dumps(result))
print('agent: done', flush=True)
"#;

/// The preview an agent publishes: it tries every attack on the console
/// and writes what became of each into its own `#out` (as JSON).
const PREVIEW: &str = include_str!("../python/console_preview.html");

/// Registers the agent `console` ([`AGENT`]) in `key`'s organization: its
/// model served by the fake provider on `port`, whose key (the connection
/// `llm`) holds [`CANARY`].
fn register(s: &Server, key: &str, port: u16) {
    let k = Some(key);
    let (st, v) = s.call(
        "POST",
        "/v1/connections",
        k,
        Some(&json!({"name": "llm", "integration": "llm", "type": "api_key", "fields": {"key": format!("sk-{CANARY}")}})),
    );
    assert_eq!(st, 201, "{v}");
    let manifest = format!(
        "[agent]\nname = \"console\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 60\n\n\
         [network]\negress = \"none\"\n\n\
         [budget]\ntokens = 900000\n\n\
         [model]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\nconnection = \"llm\"\n\n\
         [[integrations]]\nnamespace = \"open\"\nauthorized_uris = [\"https://api.example.test/**\"]\n"
    );
    let (st, v) = s.call(
        "POST",
        "/v1/agents",
        k,
        Some(&json!({"manifest": manifest, "files": {"agent.py": AGENT, "preview.html": PREVIEW}})),
    );
    assert_eq!(st, 201, "{v}");
}

/// Queues a run of `console` with `prompt`; its id.
fn start_run(s: &Server, key: &str, prompt: &str) -> String {
    let (st, v) = s.call(
        "POST",
        "/v1/runs",
        Some(key),
        Some(&json!({"agent": "console", "prompt": prompt})),
    );
    assert_eq!(st, 202, "{v}");
    v["id"].as_str().unwrap().to_owned()
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn all<'a>(h: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    h.iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect()
}

/// A browser of one cookie jar's worth: the cookies it was given.
#[derive(Default)]
struct Jar(Vec<(String, String)>);

impl Jar {
    fn keep(&mut self, h: &[(String, String)]) {
        for c in all(h, "set-cookie") {
            let (pair, _) = c.split_once(';').unwrap_or((c, ""));
            let (k, v) = pair.split_once('=').unwrap();
            self.0.retain(|(n, _)| n != k);
            if !v.is_empty() {
                self.0.push((k.to_owned(), v.to_owned()));
            }
        }
    }
    fn header(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// `method path` with the jar's cookies (and `extra` headers); its
/// cookies kept.
fn visit(
    s: &Server,
    jar: &mut Jar,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    form: &str,
) -> (u16, Vec<(String, String)>, String) {
    let cookie = jar.header();
    let mut headers: Vec<(&str, &str)> = extra.to_vec();
    if !cookie.is_empty() {
        headers.push(("cookie", &cookie));
    }
    if method == "POST" {
        headers.push(("content-type", "application/x-www-form-urlencoded"));
    }
    let (st, h, body) = crate::support::http(s.addr, method, path, &headers, form.as_bytes());
    jar.keep(&h);
    (st, h, String::from_utf8_lossy(&body).into_owned())
}

/// The value of the hidden `csrf` field of a page.
fn csrf(html: &str) -> String {
    html.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a CSRF field")
        .to_owned()
}

fn form_encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Signs in with `key`: the session's jar.
fn sign_in(s: &Server, key: &str) -> Jar {
    let mut jar = Jar::default();
    let (st, _, html) = visit(s, &mut jar, "GET", "/console/sign-in", &[], "");
    assert_eq!(st, 200);
    let form = format!("key={}&csrf={}", form_encode(key), csrf(&html));
    let (st, h, _) = visit(s, &mut jar, "POST", "/console/sign-in", &[], &form);
    assert_eq!(st, 303, "{h:?}");
    assert_eq!(header(&h, "location"), Some("/console/runs"));
    jar
}

const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'";

#[test]
fn console_sessions_forms_pages_and_previews_over_http() {
    if !crate::support::namespace_available() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fake = rt.block_on(fake_provider::start(Duration::ZERO));
    let home = tempfile::Builder::new()
        .prefix("airlock-console-")
        .tempdir()
        .unwrap();
    let mut env = base_env(home.path(), None);
    env.push(("CONSOLE_SESSION_SECRET".into(), SESSION_SECRET.into()));
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, key) = create_org(&env, "Acme", &[]);
    let (_, other_key) = create_org(&env, "Other", &[]);
    register(&s, &key, fake.port());

    // No session: pages go to the sign-in form, data is refused.
    let mut anon = Jar::default();
    let (st, h, _) = visit(&s, &mut anon, "GET", "/console/runs", &[], "");
    assert_eq!(
        (st, header(&h, "location")),
        (303, Some("/console/sign-in"))
    );
    assert_eq!(
        visit(&s, &mut anon, "GET", "/console/data/runs", &[], "").0,
        401
    );

    // The sign-in form pairs its token with a cookie of its own: a token
    // without the cookie (a cross-site form) is refused, as a wrong key.
    let (_, h, html) = visit(&s, &mut anon, "GET", "/console/sign-in", &[], "");
    let csp = header(&h, "content-security-policy").unwrap();
    assert!(csp.starts_with(POLICY) && !csp.contains("unsafe"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    let mut stranger = Jar::default();
    let form = format!("key={}&csrf={}", form_encode(&key), csrf(&html));
    let (st, h, _) = visit(&s, &mut stranger, "POST", "/console/sign-in", &[], &form);
    assert_eq!(st, 403);
    assert!(
        all(&h, "set-cookie")
            .iter()
            .all(|c| !c.starts_with("airlock_console="))
    );
    let bad = format!(
        "key=alk_0123456789abcdef_{}&csrf={}",
        "0".repeat(64),
        csrf(&html)
    );
    let (st, _, body) = visit(&s, &mut anon, "POST", "/console/sign-in", &[], &bad);
    assert_eq!(st, 401, "{body}");

    // Signed in: the cookie is strict, and only the console takes it.
    let mut jar = Jar::default();
    let (_, _, html) = visit(&s, &mut jar, "GET", "/console/sign-in", &[], "");
    let form = format!("key={}&csrf={}", form_encode(&key), csrf(&html));
    let (st, h, _) = visit(&s, &mut jar, "POST", "/console/sign-in", &[], &form);
    assert_eq!(st, 303);
    let session = all(&h, "set-cookie")
        .into_iter()
        .find(|c| c.starts_with("airlock_console="))
        .expect("a session cookie")
        .to_owned();
    for attr in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/console",
        "Max-Age=28800",
    ] {
        assert!(session.contains(attr), "{session}");
    }
    assert!(!session.contains("Secure"), "plain http: {session}");
    assert!(!session.contains(&key), "the cookie never holds the key");
    let cookie = jar.header();
    let (st, _, _) = crate::support::http(s.addr, "GET", "/v1/runs", &[("cookie", &cookie)], b"");
    assert_eq!(st, 401, "/v1 takes no console cookie");
    // Over https (a TLS proxy says so), the cookie is Secure.
    let mut tls = Jar::default();
    let https = [("x-forwarded-proto", "https")];
    let (_, _, html) = visit(&s, &mut tls, "GET", "/console/sign-in", &https, "");
    let form = format!("key={}&csrf={}", form_encode(&key), csrf(&html));
    let (_, h, _) = visit(&s, &mut tls, "POST", "/console/sign-in", &https, &form);
    assert!(
        all(&h, "set-cookie").iter().all(|c| c.contains("; Secure")),
        "{h:?}"
    );

    // A run: a refusal, a model call, an HTML preview.
    let id = start_run(&s, &key, &format!("refuse model html http://{}", s.addr));
    let run = wait_for(&s, &format!("/v1/runs/{id}"), &key, 120, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    assert_eq!(run["status"], "succeeded", "{run}");
    // Its phases, stored as the platform saw them, in the order they came.
    let phases: Vec<i64> = [
        "created_at",
        "started_at",
        "sandbox_up_at",
        "sidecar_up_at",
        "ended_at",
    ]
    .iter()
    .map(|k| run[*k].as_i64().unwrap_or_else(|| panic!("{k}: {run}")))
    .collect();
    assert!(phases.is_sorted(), "phases in order: {run}");

    let (st, h, page) = visit(&s, &mut jar, "GET", &format!("/console/runs/{id}"), &[], "");
    assert_eq!(st, 200, "{page}");
    // The timeline: the five phases, each with its time, in order.
    let timeline = page
        .split("<ol class=\"timeline\" id=\"timeline\">")
        .nth(1)
        .and_then(|t| t.split("</ol>").next())
        .expect("the timeline");
    let shown: Vec<(&str, &str)> = timeline
        .split("<li class=\"done\"><b>")
        .skip(1)
        .map(|li| {
            let (phase, rest) = li.split_once("</b> <span>").expect("a phase's time");
            (phase, rest.split("</span>").next().unwrap_or_default())
        })
        .collect();
    assert_eq!(
        shown.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        [
            "queued",
            "started",
            "sandbox up",
            "sidecar up, running",
            "ended"
        ],
        "{timeline}"
    );
    assert!(
        shown
            .iter()
            .all(|(_, at)| at.len() == "YYYY-MM-DD HH:MM:SS".len()),
        "{timeline}"
    );
    assert!(
        shown.windows(2).all(|w| w[0].1 <= w[1].1),
        "in order: {timeline}"
    );
    let csp = header(&h, "content-security-policy").unwrap();
    assert!(csp.contains("frame-src 'self'"), "{csp}");
    assert!(
        !page.contains("<script>") && !page.contains(" style="),
        "no inline code"
    );
    assert!(page.contains("<tr class=\"refused\">"), "{page}");
    assert!(
        page.contains("<span class=\"code\">not_authorized</span>"),
        "{page}"
    );
    assert!(page.contains("gpt-fake"), "the model call: {page}");
    // The run's budget: each measure's spend beside its limit.
    let budget = page
        .split("<table class=\"budget\" id=\"budget\">")
        .nth(1)
        .and_then(|r| r.split("</table>").next())
        .expect("the budget table");
    assert!(budget.contains("<td>900000</td>"), "{budget}");
    assert!(budget.contains("no limit"), "{budget}");
    assert!(
        !budget.contains("<td>tokens</td><td>0</td>"),
        "spent: {budget}"
    );
    // The preview's frame: sandboxed, scripts only (the URL as the page
    // escapes it: `/` and `&` as entities).
    let preview = page
        .split("<iframe id=\"preview\" sandbox=\"allow-scripts\" src=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .map(|p| p.replace("&#x2f;", "/").replace("&amp;", "&"))
        .expect("the preview's frame");
    assert!(
        preview.starts_with(&format!("/usercontent/runs/{id}/preview?")),
        "{preview}"
    );
    // The preview's source is shown as text in the result, escaped.
    assert!(page.contains("&lt;script&gt;"), "{page}");

    // The preview: text at the top level, HTML only as a frame's load;
    // sandboxed either way; its signature names its run.
    let (st, h, body) = crate::support::http(s.addr, "GET", &preview, &[], b"");
    assert_eq!(st, 200, "{body:?}");
    assert_eq!(
        header(&h, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    let sandbox = header(&h, "content-security-policy").unwrap();
    assert!(sandbox.starts_with("sandbox allow-scripts;"), "{sandbox}");
    assert!(String::from_utf8_lossy(&body).contains("<script>"));
    let nav = [("sec-fetch-dest", "document")];
    let (_, h, _) = crate::support::http(s.addr, "GET", &preview, &nav, b"");
    assert_eq!(
        header(&h, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    let frame = [("sec-fetch-dest", "iframe")];
    let (st, h, _) = crate::support::http(s.addr, "GET", &preview, &frame, b"");
    assert_eq!(st, 200);
    assert_eq!(header(&h, "content-type"), Some("text/html; charset=utf-8"));
    assert!(
        header(&h, "content-security-policy")
            .unwrap()
            .starts_with("sandbox allow-scripts;")
    );
    assert!(
        header(&h, "x-frame-options").is_none(),
        "the console frames it"
    );
    let tampered = preview.replace("signature=", "signature=0");
    assert_eq!(
        crate::support::http(s.addr, "GET", &tampered, &frame, b"").0,
        403
    );

    // Another organization's run is not found through the console either.
    let mut other = sign_in(&s, &other_key);
    let (st, _, _) = visit(
        &s,
        &mut other,
        "GET",
        &format!("/console/runs/{id}"),
        &[],
        "",
    );
    assert_eq!(st, 404);
    let (st, _, body) = visit(
        &s,
        &mut other,
        "GET",
        &format!("/console/data/runs/{id}"),
        &[],
        "",
    );
    assert_eq!(st, 404, "{body}");

    // The data routes answer the /v1 types.
    let (st, _, body) = visit(&s, &mut jar, "GET", "/console/data/runs", &[], "");
    assert_eq!(st, 200);
    let list: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["runs"][0]["id"], id.as_str());

    // No page carries the canary, the key, or the stored secret.
    let mut pages = vec![page];
    for p in ["/console/runs", "/console/connections", "/console/usage"] {
        let (st, h, html) = visit(&s, &mut jar, "GET", p, &[], "");
        assert_eq!(st, 200, "{p}: {html}");
        assert!(
            header(&h, "content-security-policy")
                .unwrap()
                .starts_with(POLICY)
        );
        pages.push(html);
    }
    assert!(pages[2].contains(">llm<"), "the connection is listed");
    for html in &pages {
        assert!(!html.contains(CANARY) && !html.contains(&key), "{html}");
    }
    for asset in ["/console/assets/console.js", "/console/assets/console.css"] {
        let (st, h, _) = visit(&s, &mut jar, "GET", asset, &[], "");
        assert_eq!(st, 200, "{asset}");
        assert!(header(&h, "content-security-policy").is_some());
        assert_eq!(header(&h, "x-content-type-options"), Some("nosniff"));
    }

    // Forms: refused without the session's CSRF token.
    let token = csrf(&pages[1]);
    let (st, _, _) = visit(&s, &mut jar, "POST", "/console/sign-out", &[], "csrf=0000");
    assert_eq!(st, 403);
    let (st, _, _) = visit(&s, &mut jar, "POST", "/console/sign-out", &[], "");
    assert!(st == 400 || st == 422, "no token: {st}");
    let (st, _, _) = visit(
        &s,
        &mut other,
        "POST",
        "/console/sign-out",
        &[],
        &format!("csrf={token}"),
    );
    assert_eq!(st, 403, "another session's token");
    assert_eq!(
        visit(&s, &mut jar, "GET", "/console/runs", &[], "").0,
        200,
        "still signed in"
    );
    let (st, h, _) = visit(
        &s,
        &mut jar,
        "POST",
        "/console/sign-out",
        &[],
        &format!("csrf={token}"),
    );
    assert_eq!(
        (st, header(&h, "location")),
        (303, Some("/console/sign-in"))
    );
    assert_eq!(visit(&s, &mut jar, "GET", "/console/runs", &[], "").0, 303);

    // A revoked key ends its sessions at once.
    let (st, second) = s.call(
        "POST",
        "/v1/api-keys",
        Some(&key),
        Some(&json!({"name": "b"})),
    );
    assert_eq!(st, 201, "{second}");
    let mut again = sign_in(&s, second["key"].as_str().unwrap());
    assert_eq!(
        visit(&s, &mut again, "GET", "/console/runs", &[], "").0,
        200
    );
    let second_id = second["id"].as_str().unwrap();
    let (st, v) = s.call(
        "DELETE",
        &format!("/v1/api-keys/{second_id}"),
        Some(&key),
        None,
    );
    assert_eq!(st, 204, "{v}");
    assert_eq!(
        visit(&s, &mut again, "GET", "/console/runs", &[], "").0,
        303
    );
    assert_eq!(
        visit(&s, &mut again, "GET", "/console/data/runs", &[], "").0,
        401
    );
}

/// A free loopback port (bound, then let go: the server binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Debian's chromium, which Playwright drives (never its own download).
const CHROMIUM: &str = "/usr/bin/chromium";

#[test]
fn console_in_a_browser() {
    if !crate::support::namespace_available() || !python_has(&["playwright.sync_api"]) {
        return;
    }
    let found = std::path::Path::new(CHROMIUM)
        .exists()
        .then_some(())
        .ok_or("/usr/bin/chromium is missing (apt-get install chromium)");
    if airlock_test_support::require_peer("chromium", found).is_none() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    // A slow model: a run stays live while the browser opens its page.
    let fake = rt.block_on(fake_provider::start(Duration::from_millis(800)));
    let home = tempfile::Builder::new()
        .prefix("airlock-console-browser-")
        .tempdir()
        .unwrap();
    // The previews on an origin of their own: another host name (so
    // another site and cookie jar than 127.0.0.1), another listener.
    let uc_port = free_port();
    let mut env = base_env(home.path(), None);
    env.push((
        "USERCONTENT_URL".into(),
        format!("http://localhost:{uc_port}"),
    ));
    env.push(("USERCONTENT_LISTEN".into(), format!("127.0.0.1:{uc_port}")));
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, key) = create_org(&env, "Acme", &[]);
    register(&s, &key, fake.port());
    // An agent whose one request an `ask` rule holds: the browser answers it.
    let held = crate::serve_approval_hooks::held_agent(&s, &key, "held");
    // One run already over, so the usage chart has a day to draw.
    let first = start_run(&s, &key, "model");
    wait_for(&s, &format!("/v1/runs/{first}"), &key, 120, |v| {
        v["status"] == "succeeded"
    });

    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/console_browser.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .env("CONSOLE_URL", format!("http://{}", s.addr))
        .env("PREVIEW_ORIGIN", format!("http://localhost:{uc_port}"))
        .env("API_KEY", &key)
        .env("CANARY", CANARY)
        .env("CHROMIUM", CHROMIUM)
        .env("HELD_AGENT", "held")
        .env("HELD_PROMPT", format!("http://{}", held.addr))
        .env("HELD_CANARY", CANARY_HELD)
        .env("SCREENSHOTS", &shots)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser test failed:\n{stdout}\n{stderr}\nserver log:\n{}",
        s.log_text()
    );
    eprintln!("{stdout}");
    // The request the browser allowed went on, once.
    assert_eq!(held.seen().len(), 1, "{:?}", held.seen());
    for shot in [
        "sign-in",
        "runs",
        "run",
        "approval",
        "preview-top-level",
        "connections",
        "usage",
    ] {
        let p = shots.join(format!("{shot}.png"));
        assert!(
            p.metadata().is_ok_and(|m| m.len() > 1000),
            "{}",
            p.display()
        );
    }
}

/// A held request answered from its run's page: the page lists it with
/// its three answers; a form without the session's CSRF token (none, a
/// wrong one, another session's) is refused and it stays pending; another
/// organization's session sees nothing of it (its run page, its data and
/// its form are 404); the console's answer is recorded as given by the
/// session's key, and the request then goes on, once.
#[test]
fn console_answers_a_held_request_with_its_csrf_token_only() {
    use crate::serve_approval_hooks::{first_pending, held_run};
    if !crate::support::namespace_available() {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("airlock-console-approvals-")
        .tempdir()
        .unwrap();
    let env = base_env(home.path(), None);
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, a) = create_org(&env, "A", &[]);
    let (_, b) = create_org(&env, "B", &[]);
    // The console's user: a key of its own, whose id the answer must name.
    let (st, console_key) = s.call(
        "POST",
        "/v1/api-keys",
        Some(&a),
        Some(&json!({"name": "console"})),
    );
    assert_eq!(st, 201, "{console_key}");
    let mut jar = sign_in(&s, console_key["key"].as_str().unwrap());
    let mut other = sign_in(&s, &b);
    let (up, run) = held_run(&s, &a, "console-held");
    let held = first_pending(&s, &a, &run);
    let aid = held["id"].as_str().unwrap();
    let page = format!("/console/runs/{run}");
    let form = format!("/console/runs/{run}/approvals/{aid}");
    let still_pending = || {
        let (_, v) = s.call("GET", &format!("/v1/runs/{run}/approvals"), Some(&a), None);
        assert_eq!(v["approvals"][0]["state"], "pending", "{v}");
    };

    // Its run's page: the request described, its three answers.
    let (st, _, html) = visit(&s, &mut jar, "GET", &page, &[], "");
    assert_eq!(st, 200, "{html}");
    assert!(html.contains(&format!("data-approval=\"{aid}\"")), "{html}");
    assert!(html.contains(&format!("action=\"{form}\"")), "{html}");
    for d in ["allow_once", "allow_run", "deny"] {
        assert!(html.contains(&format!("value=\"{d}\"")), "{d}: {html}");
    }
    // (minijinja's HTML escaping writes `/` as `&#x2f;`.)
    let text = html.replace("&#x2f;", "/");
    assert!(
        text.contains("/items/7") && !text.contains(CANARY_HELD),
        "{html}"
    );
    let token = csrf(&html);

    // Another organization's session: nothing of it.
    let (_, _, b_runs) = visit(&s, &mut other, "GET", "/console/runs", &[], "");
    let b_token = csrf(&b_runs);
    assert_eq!(visit(&s, &mut other, "GET", &page, &[], "").0, 404);
    let data = format!("/console/data/runs/{run}/approvals");
    assert_eq!(visit(&s, &mut other, "GET", &data, &[], "").0, 404);
    let (st, _, body) = visit(
        &s,
        &mut other,
        "POST",
        &form,
        &[],
        &format!("csrf={b_token}&decision=allow_once"),
    );
    assert_eq!(st, 404, "{body}");
    assert!(!body.replace("&#x2f;", "/").contains("/items/7"), "{body}");
    still_pending();

    // Forged forms: no token, a wrong one, another session's.
    let (st, _, _) = visit(&s, &mut jar, "POST", &form, &[], "decision=allow_once");
    assert!(st == 400 || st == 422, "no token: {st}");
    for bad in ["0000", b_token.as_str()] {
        let (st, _, _) = visit(
            &s,
            &mut jar,
            "POST",
            &form,
            &[],
            &format!("csrf={bad}&decision=allow_once"),
        );
        assert_eq!(st, 403, "token {bad}");
    }
    still_pending();
    assert!(up.seen().is_empty(), "nothing left before the answer");

    // The console's answer, as its session's key.
    let (st, h, _) = visit(
        &s,
        &mut jar,
        "POST",
        &form,
        &[],
        &format!("csrf={token}&decision=allow_once"),
    );
    assert_eq!((st, header(&h, "location")), (303, Some(page.as_str())));
    let (_, v) = s.call("GET", &format!("/v1/runs/{run}/approvals"), Some(&a), None);
    assert_eq!(v["approvals"][0]["state"], "allowed_once", "{v}");
    assert_eq!(v["approvals"][0]["answered_by"], console_key["id"], "{v}");
    let done = wait_for(&s, &format!("/v1/runs/{run}"), &a, 60, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    assert_eq!(done["status"], "succeeded", "{done}\n{}", s.log_text());
    assert_eq!(up.seen().len(), 1, "{:?}", up.seen());
    let audit_path = format!("/v1/runs/{run}/audit.jsonl");
    let (st, _, audit) = s.raw("GET", &audit_path, Some(&a), None, "");
    assert_eq!(st, 200);
    let audit = String::from_utf8(audit).unwrap();
    assert!(
        audit.lines().any(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            r["kind"] == "approval" && r["answered_by"] == console_key["id"]
        }),
        "{audit}"
    );
    // Answered: the page shows who answered, and no form.
    let (_, _, html) = visit(&s, &mut jar, "GET", &page, &[], "");
    assert!(!html.contains(&format!("action=\"{form}\"")), "{html}");
    assert!(html.contains(console_key["id"].as_str().unwrap()), "{html}");
}
