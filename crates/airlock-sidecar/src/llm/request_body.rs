//! The request body as sent upstream, and what the relay learns from it:
//! the model asked for, and whether the relay asked the provider for the
//! usage of an OpenAI chat stream (then the usage-only chunk it adds is
//! dropped before the agent sees it).
//!
//! [`prepare`] reads only the members it needs and edits the body as the
//! agent sent it; [`prepare_by_value`] gives the same answer by way of the
//! whole parsed tree, for the bodies the first leaves (and as the oracle
//! the first is tested against).

use bytes::Bytes;
use serde_json::{Value, json};

use super::budget::{OutputBound, output_bound};
use super::route::Endpoint;

/// The request body as sent upstream, and what the relay learnt from it.
#[derive(Debug, PartialEq)]
pub(super) struct Prepared {
    pub(super) body: Bytes,
    pub(super) model: Option<String>,
    /// The relay added `stream_options.include_usage`: drop the usage-only chunk.
    pub(super) drop_usage_chunk: bool,
    /// The output tokens the request bounds itself to (what a budget
    /// reserves for its answer), if it names a bound.
    pub(super) output_bound: Option<u64>,
}

/// The top-level members of a request body that [`prepare`] reads; every
/// other value (the conversation, the tools: nearly all of a body) is
/// skipped as it is parsed, never built. A repeated member of these is
/// an error here: such a body goes the way of [`prepare_by_value`], whose
/// map keeps the last one.
#[derive(serde::Deserialize)]
struct RequestHead {
    model: Option<Value>,
    stream: Option<Value>,
    /// There, whatever its value (`null` included).
    #[serde(default)]
    stream_options: Present,
    // The output bound (a budget's reservation), read in the same pass;
    // not flattened (serde would then keep every other member to hand on).
    max_tokens: Option<Value>,
    max_completion_tokens: Option<Value>,
    max_output_tokens: Option<Value>,
}

/// Whether a member is there; its value is skipped.
#[derive(Default)]
struct Present(bool);

impl<'de> serde::Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Present(true))
    }
}

/// Reads `model` and, for an OpenAI chat stream that did not ask for usage,
/// asks for it. A body that is not a JSON object is sent as it is.
///
/// Reads only the three members it needs ([`RequestHead`]) and, to ask for
/// usage, writes `"stream_options":{"include_usage":true}` into the body
/// as the agent sent it, right after its opening brace. A body it cannot
/// read that way (not a JSON object, a repeated member, `stream_options`
/// already there) goes to [`prepare_by_value`]: the same answer, by way
/// of the whole parsed tree.
pub(super) fn prepare(endpoint: Endpoint, body: Bytes) -> Prepared {
    // The first byte that is not JSON whitespace opens the object. Checked
    // first: a derived struct also reads a JSON array, as its fields in order.
    let Some(open) = body
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .filter(|&i| body[i] == b'{')
    else {
        return prepare_by_value(endpoint, body);
    };
    let Ok(head) = serde_json::from_slice::<RequestHead>(&body) else {
        return prepare_by_value(endpoint, body);
    };
    let model = head
        .model
        .as_ref()
        .and_then(Value::as_str)
        .map(str::to_owned);
    let output_bound = OutputBound {
        max_tokens: head.max_tokens,
        max_completion_tokens: head.max_completion_tokens,
        max_output_tokens: head.max_output_tokens,
    }
    .tokens();
    if !needs_usage_asked(endpoint, head.stream.as_ref()) {
        return Prepared {
            output_bound,
            ..Prepared::as_sent(body, model)
        };
    }
    if head.stream_options.0 {
        return prepare_by_value(endpoint, body);
    }
    // The object has a member (`stream`), so the new one is followed by a comma.
    const ASK: &[u8] = br#""stream_options":{"include_usage":true},"#;
    let mut asked = Vec::with_capacity(body.len() + ASK.len());
    asked.extend_from_slice(&body[..=open]);
    asked.extend_from_slice(ASK);
    asked.extend_from_slice(&body[open + 1..]);
    Prepared {
        body: Bytes::from(asked),
        model,
        drop_usage_chunk: true,
        output_bound,
    }
}

/// Whether the relay asks the provider for the usage of this answer: an
/// OpenAI chat stream (`stream` is the request's member of that name) does
/// not report it unless asked.
fn needs_usage_asked(endpoint: Endpoint, stream: Option<&Value>) -> bool {
    stream.and_then(Value::as_bool) == Some(true)
        && endpoint
            == (Endpoint::Metered {
                chat_stream_usage: true,
            })
}

impl Prepared {
    /// The body as the agent sent it.
    pub(super) fn as_sent(body: Bytes, model: Option<String>) -> Prepared {
        Prepared {
            body,
            model,
            drop_usage_chunk: false,
            output_bound: None,
        }
    }
}

/// [`prepare`] by way of the whole body parsed as a tree: for the bodies
/// its lean reading leaves (and the oracle its tests compare it with).
pub(super) fn prepare_by_value(endpoint: Endpoint, body: Bytes) -> Prepared {
    let output_bound = output_bound(&body);
    Prepared {
        output_bound,
        ..prepare_tree(endpoint, body)
    }
}

/// [`prepare_by_value`] but for the output bound.
fn prepare_tree(endpoint: Endpoint, body: Bytes) -> Prepared {
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&body) else {
        return Prepared::as_sent(body, None);
    };
    let model = obj.get("model").and_then(Value::as_str).map(str::to_owned);
    if !needs_usage_asked(endpoint, obj.get("stream")) {
        return Prepared::as_sent(body, model);
    }
    let asked = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true);
    if asked {
        return Prepared::as_sent(body, model);
    }
    match obj.get_mut("stream_options") {
        Some(Value::Object(o)) => {
            o.insert("include_usage".into(), Value::Bool(true));
        }
        _ => {
            obj.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    match serde_json::to_vec(&Value::Object(obj)) {
        Ok(v) => Prepared {
            body: Bytes::from(v),
            model,
            drop_usage_chunk: true,
            output_bound: None,
        },
        Err(_) => Prepared::as_sent(body, model),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_streams_are_asked_for_usage_once() {
        let chat = Endpoint::Metered {
            chat_stream_usage: true,
        };
        let p = prepare(
            chat,
            Bytes::from_static(br#"{"model":"m","stream":true,"messages":[]}"#),
        );
        assert!(p.drop_usage_chunk);
        assert_eq!(p.model.as_deref(), Some("m"));
        let v: Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);

        let p = prepare(
            chat,
            Bytes::from_static(
                br#"{"model":"m","stream":true,"stream_options":{"include_obfuscation":false}}"#,
            ),
        );
        let v: Value = serde_json::from_slice(&p.body).unwrap();
        assert!(p.drop_usage_chunk);
        assert_eq!(
            v["stream_options"],
            json!({"include_obfuscation": false, "include_usage": true})
        );

        let asked = Bytes::from_static(
            br#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#,
        );
        let p = prepare(chat, asked.clone());
        assert!(!p.drop_usage_chunk);
        assert_eq!(p.body, asked, "the client's own request is sent unchanged");

        let not_stream = Bytes::from_static(br#"{"model":"m"}"#);
        assert_eq!(prepare(chat, not_stream.clone()).body, not_stream);
        let other = Endpoint::Metered {
            chat_stream_usage: false,
        };
        let msgs = Bytes::from_static(br#"{"model":"c","stream":true}"#);
        assert_eq!(
            prepare(other, msgs.clone()),
            Prepared {
                body: msgs,
                model: Some("c".into()),
                drop_usage_chunk: false,
                output_bound: None,
            }
        );
        let junk = Bytes::from_static(b"\xff not json");
        assert_eq!(prepare(chat, junk.clone()).body, junk);
    }

    /// A repeated bound reserves its largest value on the lean path too
    /// (never the default a body naming no bound gets).
    #[test]
    fn a_repeated_max_tokens_is_bounded_by_its_largest_value() {
        let chat = Endpoint::Metered {
            chat_stream_usage: true,
        };
        for raw in [
            &br#"{"model":"m","max_tokens":1,"max_tokens":100000}"#[..],
            br#"{"model":"m","max_tokens":100000,"stream":true,"max_tokens":1}"#,
        ] {
            let p = prepare(chat, Bytes::copy_from_slice(raw));
            assert_eq!(
                p.output_bound,
                Some(100_000),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    /// The lean [`prepare`] answers as [`prepare_by_value`] does (the same
    /// model and decision, a body that parses to the same JSON), for every
    /// shape of body an agent can send.
    #[test]
    fn the_lean_prepare_answers_as_the_parsed_tree_does() {
        let bodies: &[&[u8]] = &[
            br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            br#"  {"stream":true}"#,
            br#"{"stream":true,"model":7}"#,
            br#"{ "stream" : true , "model" : "m" } "#,
            b"\n\t{\r\n\"stream\":true}\n",
            br#"{"model":"m","stream":false}"#,
            br#"{"model":"m","stream":"true"}"#,
            br#"{"model":"m"}"#,
            br#"{}"#,
            br#"{ }"#,
            br#"{"mod\u0065l":"esc","str\u0065am":true}"#,
            br#"{"model":"a","model":"b","stream":true}"#,
            br#"{"stream":false,"stream":true}"#,
            br#"{"stream":true,"stream_options":{"include_usage":false}}"#,
            br#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            br#"{"stream":true,"stream_options":{"include_obfuscation":false}}"#,
            br#"{"stream":true,"stream_options":null}"#,
            br#"{"stream":true,"stream_options":[1]}"#,
            br#"{"stream":true,"tools":[{"stream_options":{"x":1},"model":"inner"}]}"#,
            br#"{"stream":true,"model":"m"} trailing"#,
            br#"{"stream":true,"model":"m""#,
            br#"[{"stream":true}]"#,
            br#"["m",false]"#,
            br#"["m",true]"#,
            br#" ["m",true,null]"#,
            br#""stream""#,
            b"\xff not json",
            b"",
            br#"{"stream":true,"messages":"caf\u00e9 \ud83d\ude00"}"#,
            "{\"stream\":true,\"model\":\"\u{e9}\u{1F600}\"}".as_bytes(),
            br#"{"model":"m","stream":true,"max_tokens":50}"#,
            br#"{"model":"m","max_completion_tokens":7,"max_tokens":3}"#,
            br#"{"max_output_tokens":9,"stream":false}"#,
            br#"{"max_tokens":3,"max_tokens":9,"stream":true}"#,
            br#"{"max_tokens":9,"max_tokens":3,"model":"m"}"#,
            br#"{"model":"m","max_tokens":1,"messages":[],"max_tokens":100000}"#,
            br#"{"max_tokens":"50","stream":true}"#,
            br#"{"max_tokens":-1,"max_output_tokens":2}"#,
        ];
        for chat_stream_usage in [true, false] {
            let endpoint = Endpoint::Metered { chat_stream_usage };
            for raw in bodies {
                let body = Bytes::copy_from_slice(raw);
                let lean = prepare(endpoint, body.clone());
                let tree = prepare_by_value(endpoint, body.clone());
                let what = String::from_utf8_lossy(raw);
                assert_eq!(lean.model, tree.model, "{what}");
                assert_eq!(lean.drop_usage_chunk, tree.drop_usage_chunk, "{what}");
                assert_eq!(lean.output_bound, tree.output_bound, "{what}");
                match serde_json::from_slice::<Value>(&tree.body) {
                    Ok(want) => assert_eq!(
                        serde_json::from_slice::<Value>(&lean.body).ok(),
                        Some(want),
                        "{what}"
                    ),
                    Err(_) => assert_eq!(lean.body, tree.body, "{what}"),
                }
                if !lean.drop_usage_chunk {
                    assert_eq!(lean.body, body, "{what}: sent as the agent wrote it");
                }
            }
        }
    }
}
