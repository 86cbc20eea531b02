//! A fake model provider on 127.0.0.1 for the `/llm` relay tests and bench.
//!
//! It speaks the real wire formats, usage included: OpenAI chat completions
//! (JSON and SSE, with the usage-only chunk when `stream_options.include_usage`
//! is set), the Responses API (JSON and SSE), Anthropic messages (JSON and
//! SSE) and model listings. Streams are sent one event per write with a
//! configurable delay between events, so a test can tell a relay that streams
//! from one that buffers. Every request is recorded with its headers, so a
//! test can check which key reached the provider. To prove the relay filters
//! what comes back, every answer also carries headers the agent must never
//! see: `set-cookie` and `x-upstream-auth`, both echoing the key received.
//!
//! A minimal HTTP/1.1 server over tokio (keep-alive, content-length request
//! bodies, chunked streaming answers): enough for the Python SDKs and the
//! relay, and fully under the test's control.

#![allow(clippy::unwrap_used)] // test support: a panic is the calling test's failure

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Usage the fake reports (each test compares the metered numbers with these).
pub const CHAT_USAGE: (u64, u64) = (17, 5);
pub const RESPONSES_USAGE: (u64, u64) = (13, 6);
pub const ANTHROPIC_USAGE: (u64, u64) = (23, 9);
pub const CHAT_MODEL: &str = "gpt-fake-2026-01-01";
pub const ANTHROPIC_MODEL: &str = "claude-fake-2026-01-01";
/// Text pieces streamed (one event each).
pub const PIECES: [&str; 5] = ["Hel", "lo", ", ", "wor", "ld"];
/// A model whose streams start and then never end (no usage ever comes).
pub const STALL_MODEL: &str = "fake-stall";
/// A model whose answers report hostile usage: `u64::MAX` tokens in, 2^63 out.
pub const HUGE_USAGE_MODEL: &str = "fake-huge-usage";
/// A model whose answers report more usage than any small request
/// reserves: [`BIG_USAGE`] tokens.
pub const BIG_USAGE_MODEL: &str = "fake-big-usage";
pub const BIG_USAGE: (u64, u64) = (5000, 5000);
/// A model whose answers reflect the key the provider received
/// ([`reflections`]): in its text, in the `x-request-id` header, written one
/// byte per chunk when streamed. The request's `user` picks a failure
/// instead: `"error"` a 400 whose message reflects it, `"gzip"` an answer
/// that says it is gzip-encoded.
pub const REFLECT_MODEL: &str = "fake-reflect";
/// Tokens the fake counts per embeddings input.
pub const EMBED_TOKENS_PER_INPUT: u64 = 3;

#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Lowercased names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

#[derive(Clone)]
pub struct FakeProvider {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Unix ms at which the last event of each stream was written.
    pub last_event_sent_ms: Arc<Mutex<Vec<f64>>>,
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    /// Keys the provider answers 401 to, as a provider does to a revoked key.
    pub revoked: Arc<Mutex<Vec<String>>>,
}

impl FakeProvider {
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
    /// From now on, a request with `key` gets 401 (and is still recorded).
    pub fn revoke(&self, key: &str) {
        self.revoked.lock().unwrap().push(key.to_owned());
    }
    /// The key each request carried, in order (`Bearer ` or `x-api-key`).
    pub fn keys(&self) -> Vec<String> {
        self.requests().iter().map(key_of).collect()
    }
}

/// The key a request carried: `Authorization: Bearer …` or `x-api-key`.
fn key_of(req: &Seen) -> String {
    req.header("authorization")
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v))
        .or(req.header("x-api-key"))
        .unwrap_or("")
        .to_owned()
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// Starts the fake on 127.0.0.1 with `delay` between stream events.
pub async fn start(delay: Duration) -> FakeProvider {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fake provider");
    let addr = listener.local_addr().unwrap();
    let fake = FakeProvider {
        addr,
        seen: Arc::default(),
        last_event_sent_ms: Arc::default(),
        connections: Arc::default(),
        revoked: Arc::default(),
    };
    let f = fake.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            f.connections
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(serve(s, f.clone(), delay));
        }
    });
    fake
}

async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Seen> {
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let mut b = [0u8; 8192];
        let n = s.read(&mut b).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&b[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let start = head_end + 4;
    while buf.len() < start + len {
        let mut b = [0u8; 8192];
        let n = s.read(&mut b).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&b[..n]);
    }
    let body = buf[start..start + len].to_vec();
    buf.drain(..start + len);
    Some(Seen {
        method,
        path,
        headers,
        body,
    })
}

async fn serve(mut s: TcpStream, fake: FakeProvider, delay: Duration) {
    let mut buf = Vec::new();
    while let Some(req) = read_request(&mut s, &mut buf).await {
        fake.seen.lock().unwrap().push(req.clone());
        let key = req
            .header("authorization")
            .or(req.header("x-api-key"))
            .unwrap_or("")
            .to_owned();
        let echo = format!(
            "set-cookie: session={key}\r\nx-upstream-auth: {key}\r\nx-request-id: req_fake_1\r\nx-ratelimit-remaining-tokens: 999\r\n"
        );
        if fake.revoked.lock().unwrap().contains(&key_of(&req)) {
            let refusal = json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}});
            if json_answer(&mut s, &echo, 401, &refusal).await {
                continue;
            }
            return;
        }
        let body = req.json();
        let stream = body["stream"] == Value::Bool(true);
        let path = req.path.split('?').next().unwrap_or("").to_owned();
        let ok = if path.ends_with("/chat/completions") && body["model"] == REFLECT_MODEL {
            reflect(&mut s, &key_of(&req), &body).await
        } else if path.ends_with("/chat/completions") && stream {
            let usage = body["stream_options"]["include_usage"] == Value::Bool(true);
            sse(&mut s, &echo, chat_events(usage), delay, &fake).await
        } else if path.ends_with("/chat/completions") && body["model"] == HUGE_USAGE_MODEL {
            let mut answer = chat_json();
            answer["usage"] = json!({"prompt_tokens": u64::MAX, "completion_tokens": 1u64 << 63, "total_tokens": u64::MAX});
            json_answer(&mut s, &echo, 200, &answer).await
        } else if path.ends_with("/chat/completions") && body["model"] == BIG_USAGE_MODEL {
            let mut answer = chat_json();
            answer["usage"] = json!({"prompt_tokens": BIG_USAGE.0, "completion_tokens": BIG_USAGE.1, "total_tokens": BIG_USAGE.0 + BIG_USAGE.1});
            json_answer(&mut s, &echo, 200, &answer).await
        } else if path.ends_with("/chat/completions") {
            json_answer(&mut s, &echo, 200, &chat_json()).await
        } else if path.ends_with("/responses") && stream {
            sse(&mut s, &echo, responses_events(), delay, &fake).await
        } else if path.ends_with("/responses") {
            json_answer(&mut s, &echo, 200, &responses_json()).await
        } else if path == "/v1/messages" && stream && body["model"] == STALL_MODEL {
            let mut events = anthropic_events();
            events.truncate(4);
            stalled_sse(&mut s, &echo, events, delay).await
        } else if path == "/v1/messages" && stream {
            sse(&mut s, &echo, anthropic_events(), delay, &fake).await
        } else if path == "/v1/messages" {
            json_answer(&mut s, &echo, 200, &anthropic_json()).await
        } else if path.ends_with("/embeddings") {
            json_answer(&mut s, &echo, 200, &embeddings_json(&body)).await
        } else if path.ends_with("/models") {
            let list = json!({"object": "list", "data": [{"id": CHAT_MODEL, "object": "model", "created": 1, "owned_by": "fake"}]});
            json_answer(&mut s, &echo, 200, &list).await
        } else {
            json_answer(
                &mut s,
                &echo,
                404,
                &json!({"error": {"message": "no such path", "type": "invalid_request_error"}}),
            )
            .await
        };
        if !ok {
            return;
        }
    }
}

async fn json_answer(s: &mut TcpStream, extra: &str, status: u16, v: &Value) -> bool {
    json_text_answer(s, extra, status, &v.to_string()).await
}

/// A JSON answer whose text is `body` as it is.
async fn json_text_answer(s: &mut TcpStream, extra: &str, status: u16, body: &str) -> bool {
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.is_ok() && s.write_all(body.as_bytes()).await.is_ok()
}

/// Writes each event as one chunk, `delay` apart.
async fn sse(
    s: &mut TcpStream,
    extra: &str,
    events: Vec<String>,
    delay: Duration,
    fake: &FakeProvider,
) -> bool {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n{extra}\r\n"
    );
    if s.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let n = events.len();
    for (i, ev) in events.into_iter().enumerate() {
        if i > 0 && !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let chunk = format!("{:x}\r\n{ev}\r\n", ev.len());
        if s.write_all(chunk.as_bytes()).await.is_err() {
            return false;
        }
        if i + 1 == n {
            fake.last_event_sent_ms.lock().unwrap().push(now_ms());
        }
    }
    s.write_all(b"0\r\n\r\n").await.is_ok()
}

/// `key` as a provider (or a proxy in front of it) that reflects it
/// writes it: raw, JSON-escaped (`\uXXXX` for each character, as
/// JavaScript's and Python's `ensure_ascii` encoders may), percent-encoded,
/// and base64 in both alphabets.
pub fn reflections(key: &str) -> Vec<String> {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    vec![
        key.to_owned(),
        key.chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect(),
        key.bytes().map(|b| format!("%{b:02X}")).collect(),
        STANDARD.encode(key),
        URL_SAFE_NO_PAD.encode(key),
    ]
}

/// A JSON text of `v` whose strings hold [`reflections`]: the JSON escape
/// written as the escape itself (serde would escape its backslashes).
fn reflecting_json(v: &Value) -> String {
    v.to_string().replace("\\\\u", "\\u")
}

/// The answer of [`REFLECT_MODEL`] to a chat request.
async fn reflect(s: &mut TcpStream, key: &str, body: &Value) -> bool {
    let echo = format!("x-request-id: req_{key}\r\n");
    let text = format!("{} {}", PIECES.concat(), reflections(key).join(" "));
    match body["user"].as_str() {
        Some("error") => {
            let refusal = json!({"error": {"message": format!("bad request from {text}"), "type": "invalid_request_error"}});
            return json_text_answer(s, &echo, 400, &reflecting_json(&refusal)).await;
        }
        Some("gzip") => {
            let echo = format!("{echo}content-encoding: gzip\r\n");
            return json_answer(s, &echo, 200, &json!({"content": text})).await;
        }
        _ => {}
    }
    if body["stream"] != Value::Bool(true) {
        let mut answer = chat_json();
        answer["choices"][0]["message"]["content"] = json!(text);
        return json_text_answer(s, &echo, 200, &reflecting_json(&answer)).await;
    }
    let usage = body["stream_options"]["include_usage"] == Value::Bool(true);
    let mut events = chat_events(usage);
    // Each reflection as one more piece of text, before the last chunk.
    let chunk = |content: &str| {
        let v = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": CHAT_MODEL,
                       "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}], "usage": null});
        format!("data: {}\n\n", reflecting_json(&v))
    };
    let at = PIECES.len() + 1;
    for (i, r) in reflections(key).iter().enumerate() {
        events.insert(at + i, chunk(&format!(" {r}")));
    }
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n{echo}\r\n"
    );
    if s.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    // One byte per chunk: the key is cut at every position of the stream.
    for b in events.concat().bytes() {
        let mut piece = b"1\r\n".to_vec();
        piece.extend_from_slice(&[b, b'\r', b'\n']);
        if s.write_all(&piece).await.is_err() {
            return false;
        }
    }
    s.write_all(b"0\r\n\r\n").await.is_ok()
}

/// Writes `events` like [`sse`], then keeps the stream open without a word
/// until the client goes away.
async fn stalled_sse(s: &mut TcpStream, extra: &str, events: Vec<String>, delay: Duration) -> bool {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n{extra}\r\n"
    );
    if s.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    for (i, ev) in events.into_iter().enumerate() {
        if i > 0 && !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let chunk = format!("{:x}\r\n{ev}\r\n", ev.len());
        if s.write_all(chunk.as_bytes()).await.is_err() {
            return false;
        }
    }
    let mut b = [0u8; 1024];
    while let Ok(n) = s.read(&mut b).await {
        if n == 0 {
            break;
        }
    }
    false
}

/// An embeddings answer for `request`: one vector of `dimensions` (default
/// 8) per input, base64 float32 unless `encoding_format` is `float`.
pub fn embeddings_json(request: &Value) -> Value {
    use base64::Engine as _;
    let inputs = match &request["input"] {
        Value::Array(a) => a.len(),
        _ => 1,
    };
    let dims = usize::try_from(request["dimensions"].as_u64().unwrap_or(8)).unwrap();
    let float = request["encoding_format"] == "float";
    let data: Vec<Value> = (0..inputs)
        .map(|i| {
            let v: Vec<f32> = (0..dims)
                .map(|j| ((i * 31 + j) % 1000) as f32 / 1000.0)
                .collect();
            let embedding = if float {
                json!(v)
            } else {
                let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let tokens = inputs as u64 * EMBED_TOKENS_PER_INPUT;
    json!({"object": "list", "data": data, "model": request["model"],
           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
}

fn data(v: Value) -> String {
    format!("data: {v}\n\n")
}

pub fn chat_events(include_usage: bool) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": CHAT_MODEL,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": null})
    };
    let mut out = vec![data(chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    ))];
    for p in PIECES {
        out.push(data(chunk(json!({"content": p}), Value::Null)));
    }
    out.push(data(chunk(json!({}), json!("stop"))));
    if include_usage {
        out.push(data(json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": CHAT_MODEL,
            "choices": [], "usage": {"prompt_tokens": CHAT_USAGE.0, "completion_tokens": CHAT_USAGE.1, "total_tokens": CHAT_USAGE.0 + CHAT_USAGE.1}})));
    }
    out.push("data: [DONE]\n\n".into());
    out
}

pub fn chat_json() -> Value {
    json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": CHAT_MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": PIECES.concat()}, "finish_reason": "stop", "logprobs": null}],
        "usage": {"prompt_tokens": CHAT_USAGE.0, "completion_tokens": CHAT_USAGE.1, "total_tokens": CHAT_USAGE.0 + CHAT_USAGE.1}})
}

fn response_obj(status: &str, with_output: bool) -> Value {
    let output = if with_output {
        json!([{"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": PIECES.concat(), "annotations": []}]}])
    } else {
        json!([])
    };
    let usage = if status == "completed" {
        json!({"input_tokens": RESPONSES_USAGE.0, "input_tokens_details": {"cached_tokens": 0},
               "output_tokens": RESPONSES_USAGE.1, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": RESPONSES_USAGE.0 + RESPONSES_USAGE.1})
    } else {
        Value::Null
    };
    json!({"id": "resp_fake", "object": "response", "created_at": 1, "status": status, "model": CHAT_MODEL,
           "output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "usage": usage})
}

pub fn responses_json() -> Value {
    response_obj("completed", true)
}

pub fn responses_events() -> Vec<String> {
    let ev = |kind: &str, v: Value| format!("event: {kind}\ndata: {v}\n\n");
    let mut out = vec![ev(
        "response.created",
        json!({"type": "response.created", "sequence_number": 0, "response": response_obj("in_progress", false)}),
    )];
    for (i, p) in PIECES.iter().enumerate() {
        out.push(ev(
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "sequence_number": i + 1, "item_id": "msg_fake", "output_index": 0, "content_index": 0, "delta": p, "logprobs": []}),
        ));
    }
    out.push(ev("response.completed", json!({"type": "response.completed", "sequence_number": PIECES.len() + 1, "response": response_obj("completed", true)})));
    out
}

pub fn anthropic_json() -> Value {
    json!({"id": "msg_fake", "type": "message", "role": "assistant", "model": ANTHROPIC_MODEL,
        "content": [{"type": "text", "text": PIECES.concat()}], "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": ANTHROPIC_USAGE.0, "output_tokens": ANTHROPIC_USAGE.1}})
}

pub fn anthropic_events() -> Vec<String> {
    let ev = |kind: &str, v: Value| format!("event: {kind}\ndata: {v}\n\n");
    let mut out = vec![ev(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message", "role": "assistant", "model": ANTHROPIC_MODEL,
            "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": ANTHROPIC_USAGE.0, "output_tokens": 1}}}),
    )];
    out.push(ev("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
    out.push(ev("ping", json!({"type": "ping"})));
    for p in PIECES {
        out.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}})));
    }
    out.push(ev(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    out.push(ev(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": ANTHROPIC_USAGE.1}}),
    ));
    out.push(ev("message_stop", json!({"type": "message_stop"})));
    out
}
