//! How keys that are bytes become text without losing a byte, and how any key or message is
//! shown safely (a key can hold terminal escapes or newlines). At the crate root, below the
//! error type and the samples that both use it.

use std::borrow::Cow;
use std::fmt::Write as _;

/// A key stored as bytes (an LMDB key), as text that loses nothing: valid UTF-8 is kept as
/// it is, except that a backslash becomes `\\`; each byte that is not part of valid UTF-8
/// becomes `\xNN` (two lower-case hex digits). Keys that are UTF-8 without a backslash (nearly
/// all) are unchanged; two different byte keys never give the same text (a lossy conversion
/// would turn both into U+FFFD), and [`unescape_key`] turns the text back into the bytes.
pub fn escape_key(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(bytes) {
        if !s.contains('\\') {
            return Cow::Borrowed(s);
        }
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    Cow::Owned(out)
}

/// The bytes a key stands for: the inverse of [`escape_key`] (`\\` is a backslash, `\xNN`
/// a byte). Writers of byte keys (`pack` to LMDB) store these. Text that [`escape_key`]
/// cannot have produced is read leniently: a backslash that starts neither escape is itself.
pub fn unescape_key(key: &str) -> Cow<'_, [u8]> {
    if !key.contains('\\') {
        return Cow::Borrowed(key.as_bytes());
    }
    let b = key.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            match b.get(i + 1) {
                Some(b'\\') => {
                    out.push(b'\\');
                    i += 2;
                    continue;
                }
                Some(b'x') => {
                    if let Some(v) = b.get(i + 2..i + 4).and_then(hex_byte) {
                        out.push(v);
                        i += 4;
                        continue;
                    }
                }
                _ => {}
            }
        }
        out.push(b[i]);
        i += 1;
    }
    Cow::Owned(out)
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| (c as char).to_digit(16);
    Some((digit(two[0])? * 16 + digit(two[1])?) as u8)
}

/// A key (or field name) as a terminal or a log should show it: the key's bytes
/// ([`unescape_key`]) with a backslash as `\\`, control characters (newline, ESC, DEL...)
/// and bytes that are not UTF-8 as `\xNN`, and other characters that steer a terminal or
/// reorder text (C1 controls, bidirectional overrides, line separators) as `\u{NNNN}`. A
/// key from data can then neither recolour a terminal nor forge a line of output, and keys
/// that differ in any byte print differently.
pub fn display_key(key: &str) -> Cow<'_, str> {
    if !key.chars().any(|c| c == '\\' || is_unsafe_char(c)) {
        return Cow::Borrowed(key);
    }
    let bytes = unescape_key(key);
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c => push_char_escaped(&mut out, c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    Cow::Owned(out)
}

/// `text` (a message that may quote keys, names or paths from data) with the characters that
/// steer a terminal escaped as [`display_key`] escapes them; backslashes are left alone, so
/// a message stays readable. For whole messages, where [`display_key`] is for one key.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        push_char_escaped(&mut out, c);
    }
    Cow::Owned(out)
}

fn push_char_escaped(out: &mut String, c: char) {
    if c.is_ascii_control() {
        let _ = write!(out, "\\x{:02x}", c as u32);
    } else if is_unsafe_char(c) {
        let _ = write!(out, "\\u{{{:x}}}", c as u32);
    } else {
        out.push(c);
    }
}

/// Control characters (C0, DEL, C1) and the invisible characters that reorder or break text:
/// bidirectional marks, embeddings, overrides and isolates, and the line and paragraph
/// separators.
fn is_unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod key_tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn byte_keys_escape_losslessly_and_plain_keys_stay_as_they_are() {
        assert!(matches!(escape_key(b"000123"), Cow::Borrowed("000123")));
        assert_eq!(escape_key(b"a\xffb"), "a\\xffb");
        assert_eq!(escape_key(b"a\xfeb"), "a\\xfeb");
        assert_eq!(escape_key(b"back\\slash"), "back\\\\slash");
        // A key that spells an escape is not the byte it spells.
        assert_eq!(escape_key(b"\\xff"), "\\\\xff");
        assert_eq!(escape_key("é\u{1b}[31m".as_bytes()), "é\u{1b}[31m", "valid UTF-8 is kept, controls too");
        assert_eq!(unescape_key("a\\xffb"), &b"a\xffb"[..]);
        assert_eq!(unescape_key("\\\\xff"), &b"\\xff"[..]);
        // Text no escape produced is read as it is.
        assert_eq!(unescape_key("a\\b\\x4"), &b"a\\b\\x4"[..]);
        assert_eq!(unescape_key("trailing\\"), &b"trailing\\"[..]);
    }

    #[test]
    fn display_escapes_what_steers_a_terminal() {
        assert!(matches!(display_key("k01/é.x"), Cow::Borrowed(_)));
        assert_eq!(display_key("a\u{1b}[31mred\nforged"), "a\\x1b[31mred\\x0aforged");
        assert_eq!(display_key("del\u{7f}tab\t"), "del\\x7ftab\\x09");
        assert_eq!(display_key("c1\u{9b}bidi\u{202e}ls\u{2028}"), "c1\\u{9b}bidi\\u{202e}ls\\u{2028}");
        // Byte keys show their bytes: an invalid byte as `\xNN`, a backslash doubled.
        assert_eq!(display_key(&escape_key(b"a\xff")), "a\\xff");
        assert_eq!(display_key(&escape_key(b"a\\b")), "a\\\\b");
        assert_eq!(display_key("lone\\b"), "lone\\\\b");
        assert_eq!(escape_controls("key `a\u{1b}]0;x\u{7}` at C:\\x"), "key `a\\x1b]0;x\\x07` at C:\\x");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn escape_round_trips_and_keeps_keys_apart(a in proptest::collection::vec(any::<u8>(), 0..24),
                                                  b in proptest::collection::vec(any::<u8>(), 0..24)) {
            let ea = escape_key(&a);
            let back = unescape_key(&ea).into_owned();
            prop_assert_eq!(&back, &a);
            prop_assert_eq!(escape_key(&back).into_owned(), ea.to_string());
            let eb = escape_key(&b);
            prop_assert_eq!(a == b, ea == eb);
            let (da, db) = (display_key(&ea), display_key(&eb));
            prop_assert_eq!(a == b, da == db);
            prop_assert!(!da.chars().any(is_unsafe_char), "{:?}", da);
        }

        #[test]
        fn escape_round_trips_text_with_backslashes_and_escapes(s in "[a\\\\x0-9f\u{1b}\n é\u{9b}]{0,16}") {
            let e = escape_key(s.as_bytes());
            prop_assert_eq!(unescape_key(&e).into_owned(), s.as_bytes().to_vec());
            prop_assert!(!display_key(&e).chars().any(is_unsafe_char));
            prop_assert!(!escape_controls(&s).chars().any(is_unsafe_char));
        }
    }
}
