//! The credential redactor's throughput on answers of different kinds.
//!
//! `cargo bench -p airlock-sidecar --bench redact`
//!
//! Each answer (`REDACT_BENCH_MB` MiB, default 16; `REDACT_BENCH_ONLY` a
//! part of the names of the answers to measure) is pushed through a
//! [`StreamRedactor`] in 16 KiB chunks, each searched as it comes (a slow
//! upstream), and fed in 16 KiB chunks searched once per 256 KiB (the
//! intercepting proxy's batch when the upstream is faster than the
//! redactor), with one 32-byte credential value. Beside each figure, in
//! the same loop:
//! copying the same chunks (the floor of any body that is passed on) and
//! one Aho-Corasick search of the raw answer for the value (the floor of
//! any search). Three repetitions, alternating; MiB/s, median [min–max].
//!
//! The answers: random bytes (a binary download), one base64 alphabet
//! letter repeated (the worst case: one base64 run the length of the
//! answer), base64 text with MIME line breaks, an embeddings answer (JSON
//! holding long base64 runs of random bytes), JSON with escapes on every
//! line, and HTML with character references.
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure

use std::hint::black_box;
use std::time::Instant;

use airlock_sidecar::credential::Redactor;
use base64::Engine as _;

const SECRET: &str = "sk-live-0123456789abcdefABCDEF42";
const CHUNK: usize = 16 * 1024;
const BATCH: usize = 256 * 1024;

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn answers(len: usize) -> Vec<(&'static str, Vec<u8>)> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<u8> = (0..len)
        .map(|_| xorshift(&mut s).to_le_bytes()[0])
        .collect();
    let letters = vec![b'Z'; len];
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut mime = Vec::with_capacity(len);
    while mime.len() < len {
        for _ in 0..76 {
            mime.push(B64[usize::from(xorshift(&mut s).to_le_bytes()[0] & 63)]);
        }
        mime.extend_from_slice(b"\r\n");
    }
    mime.truncate(len);
    let mut json = Vec::with_capacity(len);
    let mut i = 0u64;
    while json.len() < len {
        json.extend_from_slice(
            format!("{{\"id\":{i},\"path\":\"\\/srv\\/data\\/{i}\",\"note\":\"line\\nnext \\u00e9\"}},\n")
                .as_bytes(),
        );
        i += 1;
    }
    json.truncate(len);
    // An embeddings answer: each vector's float32 bytes as one base64 run
    // (random bytes: their decoded views hold `\`, `%` and `&` all over).
    let mut embeddings = b"{\"object\":\"list\",\"data\":[".to_vec();
    let mut i = 0u64;
    while embeddings.len() < len {
        let vector: Vec<u8> = (0..8192)
            .map(|_| xorshift(&mut s).to_le_bytes()[0])
            .collect();
        embeddings.extend_from_slice(
            format!(
                "{{\"object\":\"embedding\",\"index\":{i},\"embedding\":\"{}\"}},",
                base64::engine::general_purpose::STANDARD.encode(vector)
            )
            .as_bytes(),
        );
        i += 1;
    }
    embeddings.truncate(len);
    let mut html = Vec::with_capacity(len);
    while html.len() < len {
        html.extend_from_slice(
            b"<p class=\"row\">Fish &amp; chips &lt;b&gt; &#233;t&eacute; &#x2F;menu</p>\n",
        );
    }
    html.truncate(len);
    vec![
        ("random bytes", random),
        ("one base64 letter repeated", letters),
        ("base64 with MIME line breaks", mime),
        ("embeddings (random base64)", embeddings),
        ("JSON with escapes", json),
        ("HTML with references", html),
    ]
}

fn mib_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / secs
}

fn spread(v: &mut [f64]) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    format!("{:8.0} [{:.0}–{:.0}]", v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let mb: usize = std::env::var("REDACT_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let reps = 3;
    let redactor = Redactor::new([SECRET]);
    let raw = aho_corasick::AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .match_kind(aho_corasick::MatchKind::LeftmostLongest)
        .build([SECRET])
        .unwrap();
    println!(
        "redact: {mb} MiB per answer in {} KiB chunks, one {}-byte value, {reps} repetitions, alternating; MiB/s",
        CHUNK / 1024,
        SECRET.len()
    );
    println!(
        "  {:<30} {:>22} {:>22} {:>22} {:>22}",
        "answer", "per 16 KiB chunk", "per 256 KiB batch", "copy (floor)", "raw search (floor)"
    );
    // `REDACT_BENCH_ONLY=json` measures only the answers whose name holds it.
    let only = std::env::var("REDACT_BENCH_ONLY").unwrap_or_default();
    for (name, answer) in answers(mb * 1024 * 1024) {
        if !name.to_lowercase().contains(&only.to_lowercase()) {
            continue;
        }
        let (mut red, mut batched, mut copy, mut search) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            let t = Instant::now();
            let mut out = 0usize;
            let mut s = redactor.stream();
            for c in answer.chunks(CHUNK) {
                out += s.push(c).len();
            }
            out += s.finish().len();
            red.push(mib_s(answer.len(), t.elapsed().as_secs_f64()));
            black_box(out);

            let t = Instant::now();
            let (mut out, mut fed) = (0usize, 0usize);
            let mut s = redactor.stream();
            for c in answer.chunks(CHUNK) {
                s.feed(c);
                fed += c.len();
                if fed >= BATCH {
                    out += s.flush().len();
                    fed = 0;
                }
            }
            out += s.finish().len();
            batched.push(mib_s(answer.len(), t.elapsed().as_secs_f64()));
            black_box(out);

            let t = Instant::now();
            let mut out = 0usize;
            for c in answer.chunks(CHUNK) {
                out += black_box(c.to_vec()).len();
            }
            copy.push(mib_s(answer.len(), t.elapsed().as_secs_f64()));
            black_box(out);

            let t = Instant::now();
            black_box(raw.find_iter(&answer).count());
            search.push(mib_s(answer.len(), t.elapsed().as_secs_f64()));
        }
        println!(
            "  {name:<30} {:>22} {:>22} {:>22} {:>22}",
            spread(&mut red),
            spread(&mut batched),
            spread(&mut copy),
            spread(&mut search)
        );
    }
}
