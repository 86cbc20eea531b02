//! The forms each ordinary encoder writes, written out by hand here (the
//! suite's `credential_encodings` drives the real encoders).

use base64::Engine;

use super::*;

/// An AWS-style secret with the characters encoders treat differently.
const SECRET: &str = "wJalr/XUtn+FEMI&K7<MDENG>bPx'R\"fiCY";

fn assert_gone(r: &Redactor, text: &str, what: &str) {
    let out = r.str(text);
    assert!(out.contains(REDACTED), "{what}: not redacted: {out}");
    for probe in ["wJalr", "XUtn", "K7", "MDENG", "fiCY"] {
        // The secret's pieces are gone (the surrounding text stays).
        assert!(
            !out.contains(probe) || text.replace(SECRET, "").contains(probe),
            "{what}: {probe} left in {out}"
        );
    }
}

#[test]
fn json_escapes_of_every_encoder() {
    let r = Redactor::new([SECRET]);
    let serde = serde_json::to_string(SECRET).unwrap();
    let php = serde.replace('/', "\\/");
    let go = serde
        .replace('&', "\\u0026")
        .replace('<', "\\u003c")
        .replace('>', "\\u003e");
    let js_all: String = SECRET
        .chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect();
    let js_upper: String = SECRET
        .chars()
        .map(|c| format!("\\u{:04X}", c as u32))
        .collect();
    let js_x: String = SECRET.bytes().map(|b| format!("\\x{b:02x}")).collect();
    for (what, enc) in [
        ("serde", serde),
        ("php", php),
        ("go", go),
        ("js", js_all),
        ("JS", js_upper),
        ("\\x", js_x),
    ] {
        assert_gone(&r, &format!("{{\"note\":{enc},\"ok\":1}}"), what);
    }
    // Non-ASCII as \u escapes, a surrogate pair included.
    let r = Redactor::new(["clé-😀-secret"]);
    assert_eq!(
        r.str(r#"{"a":"cl\u00e9-\ud83d\ude00-secret"}"#),
        r#"{"a":"[REDACTED]"}"#
    );
}

#[test]
fn percent_encodings_in_both_cases_and_plus_for_space() {
    let r = Redactor::new([SECRET]);
    let upper: String = SECRET.bytes().map(|b| format!("%{b:02X}")).collect();
    let lower: String = SECRET.bytes().map(|b| format!("%{b:02x}")).collect();
    let mixed = deliver_encode(SECRET).to_ascii_lowercase();
    for (what, enc) in [("upper", upper), ("lower", lower), ("mixed", mixed)] {
        assert_gone(&r, &format!("/a?x={enc}&y=2"), what);
    }
    let spaced = Redactor::new(["pass word/x"]);
    assert_eq!(spaced.str("q=pass+word%2Fx&z"), "q=[REDACTED]&z");
    assert_eq!(spaced.str("q=pass%20word%2fx"), "q=[REDACTED]");
}

fn deliver_encode(s: &str) -> String {
    crate::credential::deliver::percent_encode(s)
}

#[test]
fn html_named_decimal_and_hex_references() {
    let r = Redactor::new([SECRET]);
    let named = SECRET
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#039;");
    let decimal: String = SECRET.bytes().map(|b| format!("&#{b};")).collect();
    let hex: String = SECRET.bytes().map(|b| format!("&#x{b:X};")).collect();
    let slash = named.replace('/', "&#x2F;");
    let sol = named.replace('/', "&sol;").replace('+', "&plus;");
    for (what, enc) in [
        ("named", named),
        ("decimal", decimal),
        ("hex", hex),
        ("slash", slash),
        ("sol", sol),
    ] {
        assert_gone(&r, &format!("<p title=\"{enc}\">hi</p>"), what);
    }
}

#[test]
fn base64_of_both_alphabets_at_every_alignment() {
    let r = Redactor::new([SECRET]);
    let engines = [
        base64::engine::general_purpose::STANDARD,
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    for (e, engine) in engines.iter().enumerate() {
        for lead in 0..6 {
            for trail in 0..4 {
                let mut data = vec![b'z'; lead];
                data.extend_from_slice(SECRET.as_bytes());
                data.extend(std::iter::repeat_n(b'q', trail));
                let enc = engine.encode(&data);
                let text = format!("{{\"blob\":\"{enc}\"}}");
                let out = r.str(&text);
                // What is left decodes to nothing of the secret.
                let left: String = out
                    .replace(REDACTED, "")
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || "+/-_".contains(*c))
                    .collect();
                for skip in 0..4 {
                    let dec = base64::engine::general_purpose::STANDARD_NO_PAD
                        .decode(left.get(skip..).unwrap_or("").replace(['-', '_'], "A"));
                    if let Ok(d) = dec {
                        assert!(
                            !String::from_utf8_lossy(&d).contains("XUtn"),
                            "engine {e}, lead {lead}"
                        );
                    }
                }
                assert!(out.contains(REDACTED), "engine {e} lead {lead}: {out}");
            }
        }
    }
    // Basic: `user:password`, and MIME lines (76 characters, CRLF).
    let b64 = base64::engine::general_purpose::STANDARD;
    assert_gone(
        &r,
        &format!("Basic {}", b64.encode(format!("admin:{SECRET}"))),
        "basic",
    );
    let long = b64.encode(format!("{}{SECRET}{}", "x".repeat(50), "y".repeat(50)));
    let mime: Vec<String> = long
        .as_bytes()
        .chunks(76)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    assert!(r.str(&mime.join("\r\n")).contains(REDACTED));
}

#[test]
fn two_encoders_in_a_row() {
    let r = Redactor::new([SECRET]);
    let b64 = base64::engine::general_purpose::STANDARD;
    let json = serde_json::to_string(SECRET).unwrap();
    // base64 of JSON, PHP's `\/` in base64 text, percent-encoded JSON.
    assert!(r.str(&b64.encode(&json)).contains(REDACTED));
    let php_b64 = b64.encode(SECRET).replace('/', "\\/");
    assert!(r.str(&format!("\"{php_b64}\"")).contains(REDACTED));
    let pct_json: String = json.bytes().map(|b| format!("%{b:02x}")).collect();
    assert!(r.str(&pct_json).contains(REDACTED));
    // JSON in an HTML attribute.
    let html_json = json.replace('&', "&amp;").replace('"', "&quot;");
    assert!(r.str(&html_json).contains(REDACTED));
}

#[test]
fn case_is_ignored_and_nothing_else_changes() {
    let r = Redactor::new(["k3y!AbCd"]);
    assert_eq!(r.str("host k3y!abcd.example"), "host [REDACTED].example");
    assert_eq!(r.str("K3Y!ABCD"), "[REDACTED]");
    assert_eq!(r.str("k3y!AbCdk3y!AbCd"), "[REDACTED][REDACTED]");
    assert_eq!(r.str("no secret here"), "no secret here");
    assert_eq!(r.str(""), "");
    // Escapes and base64 that hold no secret are left as they were.
    let plain = r#"{"a":"x\/y\u0026z","b":"aGVsbG8gd29ybGQ=","c":"%41&amp;&#47;"}"#;
    assert_eq!(r.str(plain), plain);
    // Short values are not redacted.
    let short = Redactor::new(["abc"]);
    assert!(short.is_empty());
    assert_eq!(short.str("abc"), "abc");
    assert!(Redactor::new([]).is_empty());
    // A large answer keeps its bytes around the value.
    let mut big = vec![b'.'; 100_000];
    big.splice(50_000..50_000, b"k3y!AbCd".iter().copied());
    let out = r.bytes(&big);
    assert_eq!(out.len(), 100_000 + REDACTED.len());
    assert_eq!(
        out.get(50_000..50_000 + REDACTED.len()),
        Some(REDACTED.as_bytes())
    );
}

/// Split anywhere, in any chunks, a stream gives what the whole answer
/// gives.
#[test]
fn a_stream_finds_a_value_split_across_chunks() {
    let r = Redactor::new([SECRET]);
    let b64 = base64::engine::general_purpose::STANDARD;
    let go = serde_json::to_string(SECRET)
        .unwrap()
        .replace('&', "\\u0026");
    let answers = [
        format!("data: {{\"a\":{go}}}\n\n"),
        format!(
            "{}{}{}",
            "-".repeat(3000),
            b64.encode(SECRET),
            ".".repeat(5000)
        ),
        format!("pre {SECRET} mid {} post", SECRET.replace('&', "&amp;")),
    ];
    for answer in &answers {
        let whole = r.bytes(answer.as_bytes());
        for size in [1, 2, 3, 7, 64, 1000, 4096] {
            let mut s = r.stream();
            let mut out = Vec::new();
            for chunk in answer.as_bytes().chunks(size) {
                out.extend(s.push(chunk));
            }
            out.extend(s.finish());
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&whole),
                "chunks of {size}"
            );
            // Fed in those chunks and searched only every few of them (the
            // proxy's batches): the same.
            for every in [2, 3, 5] {
                let mut s = r.stream();
                let mut out = Vec::new();
                for (i, chunk) in answer.as_bytes().chunks(size).enumerate() {
                    s.feed(chunk);
                    if i % every == every - 1 {
                        out.extend(s.flush());
                    }
                }
                out.extend(s.finish());
                assert_eq!(
                    String::from_utf8_lossy(&out),
                    String::from_utf8_lossy(&whole),
                    "chunks of {size}, searched every {every}"
                );
            }
        }
    }
    // Nothing to redact: the chunks go through as they are, fed or pushed.
    let mut none = Redactor::none().stream();
    assert_eq!(none.push(b"abc"), b"abc");
    none.feed(b"de");
    none.feed(b"f");
    assert_eq!(none.flush(), b"def");
    none.feed(b"g");
    assert_eq!(none.finish(), b"g");
}

/// Whether `spans` (sorted, merged) cover `must` whole.
fn covered(spans: &[(usize, usize)], must: (usize, usize)) -> bool {
    spans.iter().any(|&(s, e)| s <= must.0 && must.1 <= e)
}

/// Random answers ([`differential`]): every value is redacted over every
/// byte it was encoded into, and a stream cut anywhere gives what the
/// whole answer gives.
#[test]
fn random_answers_are_redacted_where_their_values_were_written() {
    let mut rng = differential::Rng::new(44);
    for case in 0..1000 {
        let secrets: Vec<String> = (0..1 + rng.below(2))
            .map(|_| differential::secret(&mut rng))
            .collect();
        let r = Redactor::new(secrets.iter().map(String::as_str));
        let (answer, must) = differential::answer(&mut rng, &secrets);
        let spans = r.spans(&answer);
        for m in &must {
            assert!(
                covered(&spans, *m),
                "case {case}: {m:?} of {:?} not in {spans:?}: {secrets:?}",
                String::from_utf8_lossy(&answer)
            );
        }
        if case % 4 != 0 {
            continue;
        }
        let whole = r.bytes(&answer);
        let mut s = r.stream();
        let mut out = Vec::new();
        let mut rest = answer.as_slice();
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(1 + rng.below(rest.len().min(2000)));
            out.extend(s.push(chunk));
            rest = tail;
        }
        out.extend(s.finish());
        assert_eq!(out, whole, "case {case}: stream");
    }
}

/// Whether `out` still holds the secret's base64: its letters left, read
/// at each of the four offsets, decode to a piece of it.
fn base64_leaks(out: &[u8]) -> bool {
    let left: String = String::from_utf8_lossy(out)
        .replace(REDACTED, " ")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "+/-_ ".contains(*c))
        .collect();
    left.split(' ').any(|run| {
        (0..4).any(|skip| {
            let run = run
                .get(skip..)
                .unwrap_or("")
                .replace('-', "+")
                .replace('_', "/");
            let run = run.get(..run.len() / 4 * 4).unwrap_or("");
            base64::engine::general_purpose::STANDARD
                .decode(run)
                .is_ok_and(|d| String::from_utf8_lossy(&d).contains("XUtn"))
        })
    })
}

/// A hostile upstream cuts the secret's base64 (URL-safe, unpadded, at
/// each alignment, alone, inside a long base64 run, across a line break)
/// into two chunks at every position: the stream redacts it all the same.
#[test]
fn a_hostile_upstream_cannot_split_a_values_base64_past_the_stream() {
    let r = Redactor::new([SECRET]);
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let run = "Z".repeat(8000);
    for lead in 0..3 {
        let enc = url.encode(format!("{}{SECRET}yy", "x".repeat(lead)));
        let mid = enc.len() / 2;
        let texts = [
            enc.clone(),
            format!("{run}{enc}{run}"),
            format!("{}\r\n{}", &enc[..mid], &enc[mid..]),
            format!("{run}{}\n{}{run}", &enc[..mid], &enc[mid..]),
        ];
        for (t, text) in texts.iter().enumerate() {
            assert!(base64_leaks(text.as_bytes()), "the probe reads {t}");
            let at = text.find(&enc[..4]).unwrap_or(0);
            for cut in at.saturating_sub(2)..(at + enc.len() + 4).min(text.len()) {
                let mut s = r.stream();
                let mut out = s.push(&text.as_bytes()[..cut]);
                out.extend(s.push(&text.as_bytes()[cut..]));
                out.extend(s.finish());
                assert!(
                    !base64_leaks(&out),
                    "lead {lead}, text {t}, cut {cut}: {}",
                    String::from_utf8_lossy(&out)
                );
            }
        }
    }
}

/// A value's base64 inside a long run that is decoded only at its ends
/// (its middle holds nothing a nested decoder reads), and a value split
/// between two such runs: redacted over the characters it was encoded
/// into, as a decoded view gives.
#[test]
fn base64_in_the_middle_of_a_long_run_and_split_between_two() {
    let run = "Z".repeat(4000);
    let b64 = base64::engine::general_purpose::STANDARD;
    let r = Redactor::new([SECRET]);
    for lead in [0, 1, 2] {
        let enc = b64.encode(format!("{}{SECRET}", "x".repeat(lead)));
        let text = format!("{run}{enc}{run}");
        let out = r.bytes(text.as_bytes());
        assert!(!base64_leaks(&out), "lead {lead}");
        // The span starts on the first character the value's first byte
        // went into.
        let first = run.len() + lead * 4 / 3;
        assert_eq!(
            r.spans(text.as_bytes()).first().map(|s| s.0),
            Some(first),
            "lead {lead}"
        );
    }
    // Split between two padded runs, each long.
    let (a, b) = SECRET.split_at(16);
    let text = format!(
        "{run}{}.{}{run}",
        b64.encode(format!("{}{a}", "x".repeat(3000))),
        b64.encode(format!("{b}{}", "y".repeat(3000)))
    );
    assert!(r.str(&text).contains(REDACTED), "split between two runs");
}

/// A value written by an escape encoder into binary data (random bytes on
/// either side, whose decoded views hold `\`, `%` and `&` all over), the
/// whole base64-encoded as one long run (an embeddings answer, a file):
/// the run is decoded only at its ends and around the escapes a nested
/// decoder recognises, and the value is still found at every alignment,
/// in both alphabets, whatever escape wrote it.
#[test]
fn a_nested_escape_inside_random_base64_is_found() {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    let r = Redactor::new([SECRET]);
    let mut rng = differential::Rng::new(4401);
    let mut random = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| u8::try_from(rng.next() & 0xff).unwrap_or(0))
            .collect()
    };
    let json: String = SECRET
        .chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect();
    let percent: String = SECRET.bytes().map(|b| format!("%{b:02x}")).collect();
    let html: String = SECRET.bytes().map(|b| format!("&#x{b:X};")).collect();
    for (what, nested) in [("json", json), ("percent", percent), ("html", html)] {
        for lead in [6000, 6001, 6002] {
            let mut binary = random(lead);
            binary.extend_from_slice(nested.as_bytes());
            binary.extend(random(6000));
            for (alphabet, text) in [
                ("standard", STANDARD.encode(&binary)),
                ("url-safe", URL_SAFE_NO_PAD.encode(&binary)),
            ] {
                let answer = format!("{{\"embedding\":\"{text}\"}}");
                let at = "{\"embedding\":\"".len();
                // The characters that hold only the nested form's bytes.
                let from = at + (lead * 4).div_ceil(3) + 1;
                let to = at + (lead + nested.len()) * 4 / 3 - 1;
                let spans = r.spans(answer.as_bytes());
                assert!(
                    covered(&spans, (from, to)),
                    "{what}, {alphabet}, lead {lead}: {spans:?} do not cover {from}..{to}"
                );
            }
        }
    }
}

/// Found by the fuzzer (`redact_encodings`), twice: a value escaped (as
/// JavaScript writes it, `\uXXXX` for every UTF-16 unit; as PHP writes it,
/// `\"`), then base64-encoded, right after another base64 run whose decoded
/// bytes end in the start of an escape (a backslash; `\u`). A view holds
/// both runs' bytes one after the other, and the JSON decoder read that
/// start and the value's first bytes as one escape (`\\`; `\uaaaa`), so the
/// value was not decoded. Each start of an escape, at each offset, in both
/// alphabets, is tried.
#[test]
fn a_run_after_a_run_ending_in_an_escapes_start_is_read_on_its_own_too() {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    let js_secret = "<x> a\\;&_bM?-}😀Ma😀};%😀aM~<x> a";
    let js: String = js_secret
        .encode_utf16()
        .map(|u| format!("\\u{u:04x}"))
        .collect();
    let php_secret = "aaaaaaaaaaaaaaa é!:70&€€\"> %bak  ";
    let php = serde_json::to_string(php_secret).unwrap();
    let php = php[1..php.len() - 1].replace('/', "\\/");
    // The fuzzer's answers, as they were.
    let r = Redactor::new([js_secret]);
    let found = format!(
        "AsJFb8mHW2LAsJFx1THcYX3sEaN-Gs0JbbH8mHW2LAsJFx1THcYX3sEade/RH8B8ttt5AAAAy1w\"{}\"6DRFdqTdzbuaJmfooooaL4Ql0Zz66=QQQ45DnA0,oQQQdaWWHEaN-Gs0JbbH8mHW2LAsJFx1THcY",
        STANDARD.encode(format!("{js}\\u0073\\u0073"))
    );
    assert!(r.str(&found).contains(REDACTED), "javascript: {found}");
    let r = Redactor::new([php_secret]);
    let found = format!(
        "vFx1RQT/QQPFMcH=PNpBCCCCCCkppppppppppppppppppQQQQpppppppppppppppppppppppEaAsJvvvvvvvnvvaaaAsJFx1QvvvvvvvvFx1Rc\"{}\"aaaaaaacJFx1QvvvvvvvvFx1RQT/QQPFMcH=PN",
        URL_SAFE_NO_PAD.encode(&php)
    );
    assert!(r.str(&found).contains(REDACTED), "php: {found}");
    // A previous run of random bytes and the start of an escape, at each
    // length mod 3 (each offset of the view).
    let mut rng = differential::Rng::new(5104);
    for (secret, escaped) in [(js_secret, &js), (php_secret, &php)] {
        let r = Redactor::new([secret]);
        for lead in 60..66 {
            for start in [
                &b"\\"[..],
                b"\\u",
                b"\\ua",
                b"\\x",
                b"%",
                b"%a",
                b"&#x",
                b"&am",
            ] {
                let mut before: Vec<u8> = (0..lead)
                    .map(|_| u8::try_from(rng.next() & 0x7f).unwrap_or(0))
                    .filter(|b| !b"\\%&".contains(b))
                    .collect();
                before.extend_from_slice(start);
                for (alphabet, a, b) in [
                    (
                        "standard",
                        STANDARD.encode(&before),
                        STANDARD.encode(escaped),
                    ),
                    (
                        "url-safe",
                        URL_SAFE_NO_PAD.encode(&before),
                        URL_SAFE_NO_PAD.encode(escaped),
                    ),
                ] {
                    let answer = format!("{a}\"{b}\"");
                    let spans = r.spans(answer.as_bytes());
                    // The characters that hold only the escaped value's
                    // bytes.
                    let (from, to) = (a.len() + 2, a.len() + b.len());
                    assert!(
                        covered(&spans, (from, to)),
                        "{secret:?}, {alphabet}, lead {lead}, {:?}: {spans:?}",
                        String::from_utf8_lossy(start)
                    );
                }
            }
        }
    }
}
