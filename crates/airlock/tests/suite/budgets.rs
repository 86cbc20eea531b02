//! Model budgets, attacked from the agent's side: the real `airlock
//! sidecar` against a real platform and a fake provider on 127.0.0.1.
//!
//! What is checked: many calls at once cannot pass a budget that fits
//! fewer (the run's, kept by the sidecar; the organization's, kept in the
//! store); a huge `max_tokens` is refused before it leaves; a provider that
//! reports more than was reserved is charged what it reported, and the next
//! call is refused; a stream whose usage never comes keeps its reservation;
//! a budget that cannot be read refuses every call (fail closed) with a
//! typed answer the SDKs raise, its reason kept on the run; and the
//! legitimate path: calls within the budget pass, and a settled call frees
//! what it did not use. A budget's thresholds reached queue their
//! `budget.threshold` webhook deliveries once each.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use airlock_platform::testing::TestPlatform;
use airlock_platform_api::wire::RunEvent;
use airlock_store::{BudgetLimits, LOCAL_ORG, OrgBudget, THRESHOLD_EVENT, Thresholds, WebhookRow};
use airlock_test_support::fake_provider::{self, *};
use airlock_test_support::sidecar_config::{Provider, RunBudget, SidecarConfig};
use airlock_vault::ExposeSecret;
use serde_json::{Value, json};

const PROVIDER_KEY: &str = "sk-live-provider-key-budget";
const HOST: &str = "api.internal.test";

/// A sidecar configuration for `p` whose model is the fake's OpenAI API,
/// with `budget` (the launch contract's `budget`, as JSON).
fn config(p: &TestPlatform, fake: &FakeProvider, budget: Value) -> SidecarConfig {
    config_for(
        p,
        Provider::Openai,
        &format!("http://{HOST}:{}/v1", fake.port()),
        budget,
    )
}

/// A sidecar configuration for `p` whose model is `provider` at
/// `base_url` (priced), with `budget`.
fn config_for(
    p: &TestPlatform,
    provider: Provider,
    base_url: &str,
    budget: Value,
) -> SidecarConfig {
    let budget: RunBudget = serde_json::from_value(budget).unwrap();
    p.sidecar_config()
        .tcp()
        .model(provider, base_url)
        .model_with(|m| {
            m.price_in_per_mtok_usd = Some(2.5);
            m.price_out_per_mtok_usd = Some(10.0);
        })
        .loopback_host(HOST)
        .budget(|b| *b = budget)
        .build()
}

/// A chat request for `model` bounded to `max_tokens`: its body.
fn chat(model: &str, max_tokens: u64) -> String {
    json!({"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
}

/// Posts `body` to the relay's chat path: status and JSON answer.
fn post(addr: SocketAddr, token: &str, body: &str) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    let (status, _, b) = http(
        addr,
        "POST",
        "/llm/v1/chat/completions",
        &[
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ],
        body.as_bytes(),
    );
    (status, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

/// Posts `n` bodies at once, each from its own thread and connection.
async fn post_at_once(addr: SocketAddr, token: &str, bodies: Vec<String>) -> Vec<(u16, Value)> {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(bodies.len()));
    let threads: Vec<_> = bodies
        .into_iter()
        .map(|b| {
            let (token, barrier) = (token.to_owned(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                post(addr, &token, &b)
            })
        })
        .collect();
    tokio::task::spawn_blocking(move || threads.into_iter().map(|t| t.join().unwrap()).collect())
        .await
        .unwrap()
}

/// The tokens the relay reserves for `body` (its bytes, and its bound).
fn reserved(body: &str, max_tokens: u64) -> u64 {
    body.len() as u64 + max_tokens
}

async fn costs(p: &TestPlatform) -> usize {
    p.events()
        .await
        .iter()
        .filter(|e| matches!(e, RunEvent::Cost(_)))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn parallel_calls_cannot_pass_a_run_budget_that_fits_one() {
    let p = TestPlatform::start("agent-budget-run").await;
    add_model_key(&p, PROVIDER_KEY).await;
    // Streams take a while: every call is in flight at once.
    let fake = fake_provider::start(Duration::from_millis(100)).await;
    let body = chat(CHAT_MODEL, 100);
    let one = reserved(&body, 100);
    // One reservation fits, two do not.
    let sc = spawn_sidecar(&config(
        &p,
        &fake,
        json!({"run": {"tokens": one + one / 2}}),
    ));
    let token = p.sidecar_token.expose_secret().to_owned();
    let stream = json!({"model": CHAT_MODEL, "max_tokens": 100, "stream": true, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let answers = post_at_once(sc.tcp(), &token, vec![stream; 16]).await;
    let passed = answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(passed, 1, "{answers:?}");
    assert_eq!(fake.requests().len(), 1);
    for (status, v) in answers.iter().filter(|(s, _)| *s != 200) {
        assert_eq!(*status, 429, "{v}");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "budget_exceeded", "{v}");
        assert_eq!(v["error"]["budget"]["scope"], "run", "{v}");
        assert_eq!(v["error"]["budget"]["measure"], "tokens", "{v}");
        assert_eq!(v["error"]["budget"]["limit"], one + one / 2, "{v}");
    }
    // The legitimate path: the call that passed is settled at its usage
    // (22 tokens), which frees the rest of its reservation for the next.
    let (status, v) = post(sc.tcp(), &token, &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(fake.requests().len(), 2);
    let (status, v) = post(sc.tcp(), &token, &body);
    assert_eq!(status, 200, "{v}");
    let c = eventually(10, || async { (costs(&p).await == 3).then_some(()) }).await;
    assert!(c.is_some(), "every call that passed has its cost event");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_max_tokens_is_refused_before_it_leaves() {
    let p = TestPlatform::start("agent-budget-huge").await;
    add_model_key(&p, PROVIDER_KEY).await;
    let fake = fake_provider::start(Duration::ZERO).await;
    let sc = spawn_sidecar(&config(
        &p,
        &fake,
        json!({"run": {"tokens": 100_000, "cost_microusd": 500_000, "requests": 10}}),
    ));
    let token = p.sidecar_token.expose_secret().to_owned();
    for max in [1_000_000_000_000_000u64, u64::MAX, 200_000] {
        let (status, v) = post(sc.tcp(), &token, &chat(CHAT_MODEL, max));
        assert_eq!(status, 429, "{v}");
        assert_eq!(v["error"]["code"], "budget_exceeded", "{v}");
        assert_eq!(
            v["error"]["budget"]["left"], 100_000,
            "nothing was charged: {v}"
        );
    }
    // Within the tokens, past the cost: 60,000 output tokens at $10 per
    // million are $0.60, past the $0.50.
    let (status, v) = post(sc.tcp(), &token, &chat(CHAT_MODEL, 60_000));
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["budget"]["measure"], "cost_microusd", "{v}");
    assert!(
        fake.requests().is_empty(),
        "a refused call reached the provider"
    );
    // Within every limit: it passes.
    let (status, v) = post(sc.tcp(), &token, &chat(CHAT_MODEL, 1000));
    assert_eq!(status, 200, "{v}");
    assert_eq!(fake.requests().len(), 1);
}

/// A run's budget (its manifest's, within the operator's ceilings) is in
/// its report beside its spend.
#[test]
fn a_runs_budget_and_spend_are_in_its_report() {
    let run = RealRun::with_manifest(
        "print('ok')\n",
        "[agent]\nname = \"budgeted\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\n\
         [budget]\ntokens = 5000\nrequests = 40\n",
    )
    .env("PLATFORM_RUN_LIMITS", r#"{"run_requests_ceiling": 30}"#);
    let (out, report) = run.run("process");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        report["budget"],
        json!({"limits": {"tokens": 5000, "cost_microusd": null, "requests": 30},
               "spend": {"tokens": 0, "cost_microusd": 0, "requests": 0}}),
        "{report}"
    );
}

/// `max_tokens` named twice: the reservation is the largest value (the
/// provider may keep either), never the default of a body that names none.
#[tokio::test(flavor = "multi_thread")]
async fn a_repeated_max_tokens_reserves_its_largest_value() {
    let p = TestPlatform::start("agent-budget-twice").await;
    add_model_key(&p, PROVIDER_KEY).await;
    let fake = fake_provider::start(Duration::ZERO).await;
    let sc = spawn_sidecar(&config(&p, &fake, json!({"run": {"tokens": 20_000}})));
    let token = p.sidecar_token.expose_secret().to_owned();
    let msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
    for body in [
        format!(r#"{{"model":"{CHAT_MODEL}","max_tokens":1,{msgs},"max_tokens":100000}}"#),
        format!(
            r#"{{"model":"{CHAT_MODEL}","max_tokens":100000,"stream":true,{msgs},"max_tokens":1}}"#
        ),
    ] {
        let (status, v) = post(sc.tcp(), &token, &body);
        assert_eq!(status, 429, "{body}: {v}");
        assert_eq!(
            v["error"]["budget"]["needed"],
            reserved(&body, 100_000),
            "{v}"
        );
    }
    assert!(
        fake.requests().is_empty(),
        "a refused call reached the provider"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_past_the_reservation_is_charged_and_the_next_call_refused() {
    let p = TestPlatform::start("agent-budget-over").await;
    add_model_key(&p, PROVIDER_KEY).await;
    let fake = fake_provider::start(Duration::ZERO).await;
    let big = chat(BIG_USAGE_MODEL, 10);
    // Room for one reservation and one big answer, and one more small
    // reservation: not for two big answers and a third call.
    let limit = BIG_USAGE.0 + BIG_USAGE.1 + 2 * reserved(&big, 10);
    let sc = spawn_sidecar(&config(&p, &fake, json!({"run": {"tokens": limit}})));
    let token = p.sidecar_token.expose_secret().to_owned();
    let (status, v) = post(sc.tcp(), &token, &big);
    assert_eq!(status, 200, "{v}");
    // Settled at 10,000: the second still fits its reservation, and is
    // charged its own 10,000 (the provider's word, past what was reserved).
    let (status, v) = post(sc.tcp(), &token, &big);
    assert_eq!(status, 200, "{v}");
    let (status, v) = post(sc.tcp(), &token, &big);
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["budget"]["left"], 0, "{v}");
    assert_eq!(fake.requests().len(), 2);
}

/// Thresholds [0.5, 1]: a run whose two calls spend half its token budget,
/// then all of it, fires those two thresholds once each (queued in the
/// store's outbox for the webhook subscribed, the run's journal read in
/// twice), and nothing more.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_crossing_half_and_all_of_its_budget_fires_those_two_once() {
    let p = TestPlatform::start("agent-budget-thresholds").await;
    add_model_key(&p, PROVIDER_KEY).await;
    let store = p.store();
    let t = Thresholds::from_fractions(&[0.5, 1.0]).unwrap();
    store.set_budget_thresholds(LOCAL_ORG, &t).await.unwrap();
    store
        .create_webhook(
            &WebhookRow {
                id: "wh_budget".into(),
                org_id: LOCAL_ORG.into(),
                url: "http://127.0.0.1:9/".into(),
                events: json!([THRESHOLD_EVENT]).to_string(),
                secret_envelope: "v1:k1:x".into(),
                created_at: 1,
            },
            None,
        )
        .await
        .unwrap();
    // Two big answers fill the budget exactly.
    let limit = 2 * (BIG_USAGE.0 + BIG_USAGE.1);
    let limit_i = i64::try_from(limit).unwrap();
    let limits = BudgetLimits {
        tokens: Some(limit_i),
        ..BudgetLimits::default()
    };
    // Recorded as the orchestrator does when the run starts.
    store.set_run_budget(&p.run_id, &limits).await.unwrap();
    let fake = fake_provider::start(Duration::ZERO).await;
    let sc = spawn_sidecar(&config(&p, &fake, json!({"run": {"tokens": limit}})));
    let token = p.sidecar_token.expose_secret().to_owned();
    let crossed = || async {
        store
            .budget_crossings(LOCAL_ORG, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.budget, c.measure, c.threshold, c.spent))
            .collect::<Vec<_>>()
    };
    let half = ("run".to_owned(), "tokens".to_owned(), 500, limit_i / 2);
    let (status, v) = post(sc.tcp(), &token, &chat(BIG_USAGE_MODEL, 10));
    assert_eq!(status, 200, "{v}");
    p.events().await;
    assert_eq!(crossed().await, vec![half.clone()]);
    let (status, v) = post(sc.tcp(), &token, &chat(BIG_USAGE_MODEL, 10));
    assert_eq!(status, 200, "{v}");
    p.events().await;
    p.events().await;
    let all = ("run".to_owned(), "tokens".to_owned(), 1000, limit_i);
    assert_eq!(crossed().await, vec![half, all]);
    let d = store
        .list_deliveries(LOCAL_ORG, "wh_budget", 10, None)
        .await
        .unwrap();
    assert_eq!(d.len(), 2, "{d:?}");
    for x in &d {
        assert_eq!(
            (x.event.as_str(), x.run_id.as_str()),
            (THRESHOLD_EVENT, p.run_id.as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_whose_usage_never_comes_keeps_its_reservation() {
    let p = TestPlatform::start("agent-budget-stall").await;
    add_model_key(&p, PROVIDER_KEY).await;
    let fake = fake_provider::start(Duration::from_millis(10)).await;
    let stall = json!({"model": STALL_MODEL, "max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let small = json!({"model": ANTHROPIC_MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let limit = reserved(&stall, 50) + reserved(&small, 50) - 1;
    let cfg = config_for(
        &p,
        Provider::Anthropic,
        &format!("http://{HOST}:{}", fake.port()),
        json!({"run": {"tokens": limit}}),
    );
    let sc = spawn_sidecar(&cfg);
    let token = p.sidecar_token.expose_secret().to_owned();
    // The stream starts, then the client cuts it: the relay reads on for
    // its usage, which never comes; its reservation stands meanwhile.
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(sc.tcp()).unwrap();
        let req = format!(
            "POST /llm/v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{stall}",
            stall.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    }
    let auth = format!("Bearer {token}");
    let (status, _, b) = http(
        sc.tcp(),
        "POST",
        "/llm/v1/messages",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        small.as_bytes(),
    );
    let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["budget"]["scope"], "run", "{v}");
    assert_eq!(fake.requests().len(), 1);
}

/// Sets organization `org`'s day budget.
async fn org_day_budget(p: &TestPlatform, day: BudgetLimits) {
    p.store()
        .set_org_budget(
            LOCAL_ORG,
            &OrgBudget {
                day,
                ..OrgBudget::default()
            },
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn parallel_calls_cannot_pass_the_organizations_day_budget() {
    let p = TestPlatform::start("agent-budget-org").await;
    add_model_key(&p, PROVIDER_KEY).await;
    org_day_budget(
        &p,
        BudgetLimits {
            requests: Some(3),
            ..BudgetLimits::default()
        },
    )
    .await;
    let fake = fake_provider::start(Duration::ZERO).await;
    let sc = spawn_sidecar(&config(&p, &fake, json!({"org": true})));
    let token = p.sidecar_token.expose_secret().to_owned();
    let answers = post_at_once(sc.tcp(), &token, vec![chat(CHAT_MODEL, 10); 12]).await;
    let passed = answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(passed, 3, "{answers:?}");
    assert_eq!(fake.requests().len(), 3);
    for (status, v) in answers.iter().filter(|(s, _)| *s != 200) {
        assert_eq!(*status, 429, "{v}");
        assert_eq!(v["error"]["budget"]["scope"], "org_day", "{v}");
        assert_eq!(v["error"]["budget"]["measure"], "requests", "{v}");
        assert_eq!(v["error"]["budget"]["left"], 0, "{v}");
    }
    // Each call that passed is settled at its usage in the store.
    let periods = airlock_platform::budget::periods_at(airlock_platform_api::clock::now_ms());
    let settled = eventually(10, || async {
        let (day, _) = p.store().org_spend(LOCAL_ORG, &periods).await.unwrap();
        (day.reserved_tokens == 0).then_some(day)
    })
    .await
    .expect("the reservations were settled");
    let (i, o) = CHAT_USAGE;
    assert_eq!(settled.tokens, i64::try_from(3 * (i + o)).unwrap());
    assert_eq!(settled.requests, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_budget_that_cannot_be_read_refuses_every_call() {
    let p = TestPlatform::start("agent-budget-outage").await;
    add_model_key(&p, PROVIDER_KEY).await;
    org_day_budget(
        &p,
        BudgetLimits {
            tokens: Some(1_000_000),
            ..BudgetLimits::default()
        },
    )
    .await;
    let fake = fake_provider::start(Duration::ZERO).await;
    let sc = spawn_sidecar(&config(&p, &fake, json!({"org": true})));
    let token = p.sidecar_token.expose_secret().to_owned();
    let (status, v) = post(sc.tcp(), &token, &chat(CHAT_MODEL, 10));
    assert_eq!(status, 200, "{v}");
    // The store goes away: the budget cannot be read, so no call leaves.
    p.store().close().await;
    for _ in 0..3 {
        let (status, v) = post(sc.tcp(), &token, &chat(CHAT_MODEL, 10));
        assert_eq!(status, 503, "{v}");
        assert_eq!(v["error"]["type"], "budget_unavailable", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("budget cannot be read"),
            "{v}"
        );
    }
    assert_eq!(fake.requests().len(), 1);
    // The reason is kept on the run (its journal, which survives the outage).
    let journal = std::fs::read_to_string(&p.journal).unwrap();
    assert!(
        journal.contains("fail closed"),
        "no refusal in the run's journal: {journal}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openai_sdk_raises_the_refusal() {
    if !python_has(&["openai"]) {
        return;
    }
    let p = TestPlatform::start("agent-budget-sdk").await;
    add_model_key(&p, PROVIDER_KEY).await;
    let fake = fake_provider::start(Duration::ZERO).await;
    let sc = spawn_sidecar(&config(&p, &fake, json!({"run": {"requests": 1}})));
    let token = p.sidecar_token.expose_secret().to_owned();
    let code = r#"
import json, sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
out = []
for _ in range(2):
    try:
        c.chat.completions.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        out.append({"ok": True})
    except openai.RateLimitError as e:
        out.append({"status": e.status_code, "type": e.body.get("type"), "budget": e.body.get("budget")})
print(json.dumps(out))
"#;
    let base = format!("http://{}/llm/v1", sc.tcp());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", code, &base, &token])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v[0]["ok"], true, "{v}");
    assert_eq!(v[1]["status"], 429, "{v}");
    assert_eq!(v[1]["type"], "budget_exceeded", "{v}");
    assert_eq!(v[1]["budget"]["measure"], "requests", "{v}");
}

/// `airlock org budget set|get` against a real `airlock serve`: a limit
/// given is set, one not given keeps its value, `none` removes it.
#[test]
fn the_cli_sets_and_reads_the_organizations_budget_on_a_server() {
    use crate::support::serve::{Server, base_env, command, create_org};
    let home = tempfile::Builder::new()
        .prefix("airlock-org-budget-")
        .tempdir()
        .unwrap();
    let env = base_env(home.path(), None);
    let s = Server::start(&env, "process", home.path().join("serve.log"));
    let (_, key) = create_org(&env, "Acme", &[]);
    let org = |args: &[&str]| {
        let out = command(&env)
            .args(["org", "budget"])
            .args(args)
            .args(["--server", &s.url("")])
            .env("AIRLOCK_API_KEY", &key)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let set: Value = serde_json::from_str(&org(&[
        "set",
        "--day-tokens",
        "5000",
        "--month-cost-usd",
        "2.5",
        "--json",
    ]))
    .unwrap();
    assert_eq!(set["day"]["tokens"], 5000, "{set}");
    assert_eq!(set["month"]["cost_microusd"], 2_500_000, "{set}");
    let set: Value = serde_json::from_str(&org(&[
        "set",
        "--day-tokens",
        "none",
        "--day-requests",
        "7",
        "--json",
    ]))
    .unwrap();
    assert_eq!(
        (
            &set["day"]["tokens"],
            &set["day"]["requests"],
            &set["month"]["cost_microusd"]
        ),
        (&Value::Null, &json!(7), &json!(2_500_000)),
        "{set}"
    );
    let text = org(&["get"]);
    assert!(text.contains("requests 0 of 7"), "{text}");
    assert!(text.contains("cost $0.00 of $2.50"), "{text}");
    let api = s.call("GET", "/v1/org/budget", Some(&key), None).1;
    assert_eq!(api["day"]["requests"], 7, "{api}");
}
