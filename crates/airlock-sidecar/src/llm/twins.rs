//! The relay's fast paths beside the plain paths they stand in for, one
//! function each, for the `twins` bench (`benches/twins.rs`); not an API.
//! Each pair returns the same figure (the tokens metered, the body's
//! length) so the bench can check both read the same thing.

use bytes::Bytes;
use serde_json::Value;

use super::event::{self, Counts};
use super::json_usage::JsonUsage;
use super::meter::Usage;
use super::request_body::{Prepared, prepare, prepare_by_value};
use super::route::Endpoint;
use super::sse::{SseSplitter, event_data};

/// What the meter read: (input, output) tokens.
pub type Metered = (Option<u64>, Option<u64>);

fn metered(u: &Usage) -> Metered {
    (u.input, u.output)
}

/// The meter as it reads a `serde_json::Value`: the reference the in-place
/// reading agrees with (`events_read_in_place_meter_as_a_value_would`).
pub(in crate::llm) fn observe_value(u: &mut Usage, v: &Value) {
    for usage in [
        v.get("usage"),
        v.pointer("/response/usage"),
        v.pointer("/message/usage"),
    ]
    .into_iter()
    .flatten()
    {
        if usage.is_object() {
            let n = |k: &str| usage.get(k).and_then(Value::as_u64);
            u.merge_usage(&Counts {
                prompt_tokens: n("prompt_tokens"),
                input_tokens: n("input_tokens"),
                completion_tokens: n("completion_tokens"),
                output_tokens: n("output_tokens"),
                cache_creation_input_tokens: n("cache_creation_input_tokens"),
                cache_read_input_tokens: n("cache_read_input_tokens"),
            });
        }
    }
    for model in [
        v.get("model"),
        v.pointer("/response/model"),
        v.pointer("/message/model"),
    ]
    .into_iter()
    .flatten()
    {
        if let Some(m) = model.as_str().filter(|m| !m.is_empty()) {
            u.model = Some(m.to_owned());
        }
    }
}

/// A whole JSON answer's usage, scanned as it streams ([`JsonUsage`]).
pub fn json_usage_scanned(chunks: &[Bytes]) -> Metered {
    let mut scan = JsonUsage::default();
    for c in chunks {
        scan.push(c);
    }
    let mut u = Usage::default();
    scan.finish(&mut u);
    metered(&u)
}

/// The same, the plain way: the answer gathered, then parsed by serde
/// (every member but `usage` and `model` skipped, never built).
pub fn json_usage_parsed(chunks: &[Bytes]) -> Metered {
    #[derive(serde::Deserialize)]
    struct Top {
        usage: Option<Value>,
        model: Option<Value>,
    }
    let mut whole = Vec::new();
    for c in chunks {
        whole.extend_from_slice(c);
    }
    let mut u = Usage::default();
    if let Ok(top) = serde_json::from_slice::<Top>(&whole) {
        let v = serde_json::json!({"usage": top.usage, "model": top.model});
        observe_value(&mut u, &v);
    }
    metered(&u)
}

/// An SSE answer's usage: split by [`SseSplitter`], each event's data read
/// in place ([`event::read`]).
pub fn sse_in_place(chunks: &[Bytes]) -> Metered {
    sse_metered(chunks, |u, data| {
        if let Ok(e) = event::read(data) {
            u.observe_event(&e);
        }
    })
}

/// The same events, each event's data parsed into a `serde_json::Value`
/// (the plain reading of [`event`]).
pub fn sse_by_value(chunks: &[Bytes]) -> Metered {
    sse_metered(chunks, |u, data| {
        if let Ok(v) = serde_json::from_str::<Value>(data) {
            observe_value(u, &v);
        }
    })
}

/// The usage `observe` reads of each event's data, the stream split by
/// [`SseSplitter`].
fn sse_metered(chunks: &[Bytes], observe: impl Fn(&mut Usage, &str)) -> Metered {
    let mut s = SseSplitter::default();
    let mut u = Usage::default();
    for c in chunks {
        s.push(c);
        while let Some(ev) = s.next_event() {
            if let Some(data) = event_data(&ev) {
                observe(&mut u, &data);
            }
        }
    }
    metered(&u)
}

/// The same stream split by the `sse-stream` crate (which gives each
/// event's fields, not its raw bytes), each event read in place.
pub async fn sse_stream_crate(chunks: &[Bytes]) -> Metered {
    use futures::StreamExt;
    let body = futures::stream::iter(chunks.iter().cloned().map(Ok::<_, std::io::Error>));
    let mut events = sse_stream::SseStream::from_bytes_stream(body);
    let mut u = Usage::default();
    while let Some(Ok(sse)) = events.next().await {
        if let Some(data) = sse.data
            && let Ok(e) = event::read(&data)
        {
            u.observe_event(&e);
        }
    }
    metered(&u)
}

/// A chat stream's request body as sent upstream, by [`prepare`]: the
/// length of the body and whether usage was asked for.
pub fn prepared_in_place(body: Bytes) -> (usize, bool) {
    chat_stream_body(prepare, body)
}

/// The same, by way of the whole parsed tree ([`prepare_by_value`]).
pub fn prepared_by_value(body: Bytes) -> (usize, bool) {
    chat_stream_body(prepare_by_value, body)
}

fn chat_stream_body(prepare: fn(Endpoint, Bytes) -> Prepared, body: Bytes) -> (usize, bool) {
    let chat = Endpoint::Metered {
        chat_stream_usage: true,
    };
    let p = prepare(chat, body);
    (p.body.len(), p.drop_usage_chunk)
}
