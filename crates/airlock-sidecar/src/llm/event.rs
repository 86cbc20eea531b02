//! What the meter reads of one streamed event, read in place.
//!
//! Every event of a metered SSE answer is a JSON object, and the meter needs
//! only its `usage`, `model` and `choices`, and the `usage` and `model` of a
//! `response` or `message` object in it. Visitors keep those values and
//! skip the rest (checked for JSON syntax, never stored): nothing else of
//! an event is built.
//! A whole JSON answer's `usage` and `model`, kept raw by the relay's
//! streaming scan, are read by the same visitors ([`read_top`]).
//!
//! It reads what `Value` would: a key given twice keeps its last value, and a
//! value of another type than the one wanted reads as absent (a `usage` that
//! is not an object, a count that is not a non-negative integer, a `model`
//! that is not a string). The meter's
//! `events_read_in_place_meter_as_a_value_would` checks both readings on the
//! same events.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The token counts of one `usage` object.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Counts {
    pub prompt_tokens: Option<u64>,
    pub input_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cache_creation_input_tokens: Option<u64>,
    pub cache_read_input_tokens: Option<u64>,
}

/// The `usage` (when an object) and `model` (when a string) of one object.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Reported<'a> {
    pub usage: Option<Counts>,
    pub model: Option<Cow<'a, str>>,
}

/// One event as the meter reads it.
#[derive(Debug, Default, PartialEq)]
pub(super) struct EventView<'a> {
    pub top: Reported<'a>,
    /// `response` (OpenAI's Responses API), when an object.
    pub response: Option<Reported<'a>>,
    /// `message` (Anthropic's `message_start`), when an object.
    pub message: Option<Reported<'a>>,
    /// `choices` is an empty array.
    pub no_choices: bool,
}

impl EventView<'_> {
    /// An OpenAI chunk that carries only the usage the relay asked for:
    /// `choices` empty, `usage` an object.
    pub fn is_usage_only_chunk(&self) -> bool {
        self.no_choices && self.top.usage.is_some()
    }
}

/// Reads one event's data. Not JSON: an error. JSON but not an object:
/// nothing reported.
pub(super) fn read(data: &str) -> Result<EventView<'_>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(data);
    let view = (&mut de).deserialize_any(EventV)?;
    de.end()?;
    Ok(view)
}

/// A whole JSON answer's top-level `usage` and `model`, given as their raw
/// values (a value that is not JSON reads as absent).
pub(super) fn read_top<'a>(usage: Option<&'a [u8]>, model: Option<&'a [u8]>) -> Reported<'a> {
    fn one<'a, S: DeserializeSeed<'a, Value = Option<T>>, T>(raw: &'a [u8], seed: S) -> Option<T> {
        let mut de = serde_json::Deserializer::from_slice(raw);
        let v = seed.deserialize(&mut de).ok()?;
        de.end().ok()?;
        v
    }
    Reported {
        usage: usage.and_then(|raw| one(raw, CountsV)),
        model: model.and_then(|raw| one(raw, ModelV)),
    }
}

/// The keys any of the visitors below reads; every other key is `Other`.
enum Key {
    Usage,
    Model,
    Response,
    Message,
    Choices,
    PromptTokens,
    InputTokens,
    CompletionTokens,
    OutputTokens,
    CacheCreationInputTokens,
    CacheReadInputTokens,
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyV;
        impl Visitor<'_> for KeyV {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E: de::Error>(self, k: &str) -> Result<Key, E> {
                Ok(match k {
                    "usage" => Key::Usage,
                    "model" => Key::Model,
                    "response" => Key::Response,
                    "message" => Key::Message,
                    "choices" => Key::Choices,
                    "prompt_tokens" => Key::PromptTokens,
                    "input_tokens" => Key::InputTokens,
                    "completion_tokens" => Key::CompletionTokens,
                    "output_tokens" => Key::OutputTokens,
                    "cache_creation_input_tokens" => Key::CacheCreationInputTokens,
                    "cache_read_input_tokens" => Key::CacheReadInputTokens,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(KeyV)
    }
}

/// The visits of values a visitor does not want: each reads as `$absent`
/// (an array's or object's contents are skipped).
macro_rules! absent {
    ($absent:expr; $($kind:ident),*) => { $( absent!(@ $kind, $absent); )* };
    (@ bool, $a:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> { Ok($a) }
    };
    (@ i64, $a:expr) => {
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> { Ok($a) }
    };
    (@ u64, $a:expr) => {
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> { Ok($a) }
    };
    (@ f64, $a:expr) => {
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> { Ok($a) }
    };
    (@ str, $a:expr) => {
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> { Ok($a) }
    };
    (@ unit, $a:expr) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> { Ok($a) }
    };
    (@ seq, $a:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($a)
        }
    };
    (@ map, $a:expr) => {
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($a)
        }
    };
}

/// A visitor that reads any JSON value (`deserialize_any`) as a seed.
macro_rules! seed {
    ($v:ty) => {
        impl<'de> DeserializeSeed<'de> for $v {
            type Value = <$v as Visitor<'de>>::Value;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
        }
    };
}

/// A count: a non-negative integer, else absent.
struct CountV;
seed!(CountV);
impl<'de> Visitor<'de> for CountV {
    type Value = Option<u64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
        Ok(Some(n))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
        Ok(u64::try_from(n).ok())
    }
    absent!(None; bool, f64, str, unit, seq, map);
}

/// A `model`: a string (borrowed from the event when it has no escapes),
/// else absent.
struct ModelV;
seed!(ModelV);
impl<'de> Visitor<'de> for ModelV {
    type Value = Option<Cow<'de, str>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Borrowed(s)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(s.to_owned())))
    }
    absent!(None; bool, i64, u64, f64, unit, seq, map);
}

/// A `usage`: an object's counts, else absent.
struct CountsV;
seed!(CountsV);
impl<'de> Visitor<'de> for CountsV {
    type Value = Option<Counts>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut c = Counts::default();
        while let Some(key) = map.next_key::<Key>()? {
            let slot = match key {
                Key::PromptTokens => &mut c.prompt_tokens,
                Key::InputTokens => &mut c.input_tokens,
                Key::CompletionTokens => &mut c.completion_tokens,
                Key::OutputTokens => &mut c.output_tokens,
                Key::CacheCreationInputTokens => &mut c.cache_creation_input_tokens,
                Key::CacheReadInputTokens => &mut c.cache_read_input_tokens,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = map.next_value_seed(CountV)?;
        }
        Ok(Some(c))
    }
    absent!(None; bool, i64, u64, f64, str, unit, seq);
}

/// A `response` or `message`: an object's `usage` and `model`, else absent.
struct ReportedV;
seed!(ReportedV);
impl<'de> Visitor<'de> for ReportedV {
    type Value = Option<Reported<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut r = Reported::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Usage => r.usage = map.next_value_seed(CountsV)?,
                Key::Model => r.model = map.next_value_seed(ModelV)?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(r))
    }
    absent!(None; bool, i64, u64, f64, str, unit, seq);
}

/// `choices`: whether it is an empty array.
struct NoChoicesV;
seed!(NoChoicesV);
impl<'de> Visitor<'de> for NoChoicesV {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let mut empty = true;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            empty = false;
        }
        Ok(empty)
    }
    absent!(false; bool, i64, u64, f64, str, unit, map);
}

/// The event: an object, else nothing reported.
struct EventV;
impl<'de> Visitor<'de> for EventV {
    type Value = EventView<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut e = EventView::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Usage => e.top.usage = map.next_value_seed(CountsV)?,
                Key::Model => e.top.model = map.next_value_seed(ModelV)?,
                Key::Response => e.response = map.next_value_seed(ReportedV)?,
                Key::Message => e.message = map.next_value_seed(ReportedV)?,
                Key::Choices => e.no_choices = map.next_value_seed(NoChoicesV)?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(e)
    }
    absent!(EventView::default(); bool, i64, u64, f64, str, unit, seq);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_meter_needs() {
        let e = read(r#"{"id":"c1","model":"gpt-x","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}"#).unwrap();
        assert_eq!(e.top.model.as_deref(), Some("gpt-x"));
        assert!(matches!(e.top.model, Some(Cow::Borrowed(_))), "no copy");
        let u = e.top.usage.as_ref().unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (Some(11), Some(7)));
        assert!(e.is_usage_only_chunk());

        let e = read(r#"{"type":"message_start","message":{"model":"claude-x","usage":{"input_tokens":25,"cache_read_input_tokens":3}}}"#).unwrap();
        let m = e.message.unwrap();
        assert_eq!(m.model.as_deref(), Some("claude-x"));
        assert_eq!(m.usage.unwrap().cache_read_input_tokens, Some(3));
        assert!(!e.no_choices);
    }

    #[test]
    fn last_key_wins_and_other_types_read_as_absent() {
        let e =
            read(r#"{"usage":{"prompt_tokens":1},"usage":"no","model":"a","model":"b"}"#).unwrap();
        assert_eq!(e.top.usage, None);
        assert_eq!(e.top.model.as_deref(), Some("b"));
        let e = read(r#"{"usage":{"prompt_tokens":-1,"completion_tokens":2.5,"output_tokens":"3","input_tokens":18446744073709551615}}"#).unwrap();
        let u = e.top.usage.unwrap();
        assert_eq!(
            (
                u.prompt_tokens,
                u.completion_tokens,
                u.output_tokens,
                u.input_tokens
            ),
            (None, None, None, Some(u64::MAX))
        );
        // An escaped key is the same key; an escaped model is copied.
        let e = read(r#"{"us\u0061ge":{"prompt_tokens":4},"model":"g\u0070t"}"#).unwrap();
        assert_eq!(e.top.usage.unwrap().prompt_tokens, Some(4));
        assert_eq!(e.top.model.as_deref(), Some("gpt"));
        assert!(
            !read(r#"{"choices":[{"delta":{}}],"usage":{}}"#)
                .unwrap()
                .is_usage_only_chunk()
        );
        assert!(
            !read(r#"{"choices":{},"usage":{}}"#)
                .unwrap()
                .is_usage_only_chunk()
        );
    }

    #[test]
    fn not_json_is_an_error_and_not_an_object_reports_nothing() {
        for bad in ["[DONE]", "{\"usage\":", "{} {}", "{\"a\":\"\u{1}\"}", ""] {
            assert!(read(bad).is_err(), "{bad:?}");
        }
        for other in [
            "[1,{\"usage\":{\"prompt_tokens\":1}}]",
            "3",
            "\"usage\"",
            "null",
        ] {
            assert_eq!(read(other).unwrap(), EventView::default(), "{other:?}");
        }
    }

    #[test]
    fn only_the_usage_only_chunk_is_dropped() {
        let only = |data: &str| read(data).unwrap().is_usage_only_chunk();
        assert!(only(r#"{"choices": [], "usage": {"prompt_tokens": 1}}"#));
        assert!(!only(
            r#"{"choices": [{"delta": {}}], "usage": {"prompt_tokens": 1}}"#
        ));
        assert!(!only(r#"{"choices": [], "usage": null}"#));
        assert!(!only(r#"{"choices": []}"#));
    }
}
