//! Agent text on the operator's terminal: everything Airlock prints of what
//! an agent wrote (the live view of a run, `airlock runs logs`, URLs in the
//! run report) goes through [`safe`], so an agent cannot send escape
//! sequences (OSC/CSI: retitle, clear, move the cursor, forge a line),
//! carriage returns that overwrite a line, or bidirectional overrides that
//! reorder one, to the operator's terminal.

use std::borrow::Cow;
use std::fmt::Write;

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// Longest line kept whole: a longer one arrives in pieces of this size.
pub const MAX_LINE: usize = 64 * 1024;

/// The next line of `r` (without its newline), at most `max` bytes, invalid
/// UTF-8 replaced: `None` at the end. A stream without newlines never grows
/// a buffer past `max`, and binary output never stops the reader.
pub async fn next_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Option<String>> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok((!line.is_empty()).then(|| String::from_utf8_lossy(&line).into_owned()));
        }
        let room = max - line.len();
        let (take, done) = match buf.iter().take(room).position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len().min(room), buf.len() >= room),
        };
        line.extend_from_slice(&buf[..take]);
        r.consume(take);
        if done {
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
        }
    }
}

/// Whether `c` must not reach a terminal as itself.
fn is_unsafe(c: char) -> bool {
    match c {
        '\t' => false,
        // C0 controls (ESC, CR, BEL, BS, …), DEL, and the C1 controls (CSI is U+009B)
        c if c.is_control() => true,
        // bidirectional embeddings, overrides and isolates, marks, and the
        // line/paragraph separators some terminals treat as line breaks
        '\u{061c}'
        | '\u{200e}'
        | '\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}'
        | '\u{2028}'
        | '\u{2029}' => true,
        _ => false,
    }
}

/// `s` with every control or reordering character written out as a visible
/// escape (`\x1b`, `\r`, `\u{202e}`); borrowed when nothing needed escaping.
pub fn safe(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if !is_unsafe(c) {
            out.push(c);
            continue;
        }
        let _ = match c {
            '\r' => out.write_str("\\r"),
            '\n' => out.write_str("\\n"),
            c if (c as u32) < 0x80 => write!(out, "\\x{:02x}", c as u32),
            c => write!(out, "\\u{{{:x}}}", c as u32),
        };
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_and_reordering_are_written_out() {
        let forged = "\x1b]0;pwned\x07\x1b[2K\r\u{25b8} succeeded\u{9b}31m \u{202e}gnp.exe";
        let s = safe(forged);
        assert!(!s.chars().any(is_unsafe), "{s:?}");
        assert_eq!(
            s,
            "\\x1b]0;pwned\\x07\\x1b[2K\\r\u{25b8} succeeded\\u{9b}31m \\u{202e}gnp.exe"
        );
        assert!(!s.contains('\x1b') && !s.contains('\r'));
    }

    #[tokio::test]
    async fn lines_are_bounded_and_binary_does_not_stop_the_reader() {
        let mut input: Vec<u8> = b"one\n\xff\xfe bin\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 10));
        input.extend_from_slice(b"\nlast");
        let mut r = tokio::io::BufReader::with_capacity(3, &input[..]);
        let mut got = vec![];
        while let Some(l) = next_line(&mut r, 4).await.unwrap() {
            got.push(l);
        }
        assert_eq!(
            got,
            [
                "one",
                "\u{fffd}\u{fffd} b",
                "in",
                "xxxx",
                "xxxx",
                "xx",
                "last"
            ]
        );
    }

    #[test]
    fn ordinary_text_is_untouched_and_not_copied() {
        for t in ["hello", "tab\tseparated", "ünïcödé ▸ ✓ 日本", ""] {
            assert!(matches!(safe(t), Cow::Borrowed(x) if x == t));
        }
        assert_eq!(safe("a\0b\x7f"), "a\\x00b\\x7f");
        assert_eq!(safe("two\nlines"), "two\\nlines");
    }
}
