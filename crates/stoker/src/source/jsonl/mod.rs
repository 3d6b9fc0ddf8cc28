//! JSON Lines text corpora: one document per line, its text in one field (`text` unless the
//! `text_field` option names another), as the Hub's and most pretraining corpora ship.
//! Files end `.jsonl`, or `.jsonl.gz` / `.jsonl.zst` compressed as a whole.
//!
//! The first open walks each file once (through the store, a block at a time) and writes where
//! every non-blank line starts and ends to a line index kept on disk; later opens read that
//! index instead, and a sample is one ranged read of its line (see [`super::span_file`], also
//! for files compressed as a whole). A line that is not a JSON object, lacks the field, or
//! holds invalid UTF-8 is an error naming the file and the document when it is read
//! (`on_damage=skip` / `skip_errors` step over it, counted).

use std::fmt;
use std::io::Read;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::span_file::SpanFiles;
use super::span_index::JSONL_LINES;
use super::{Capability, DynSampleSource, SampleSource, SourceInfo};
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::store::{IoCounters, ObjectInfo, Store};
use crate::uri::{Layout, SourceOptions};

/// File name endings this layout reads.
pub(crate) const SUFFIXES: [&str; 3] = [".jsonl", ".jsonl.gz", ".jsonl.zst"];

/// A JSONL corpus of one or more files, documents in file order, then line order.
pub(crate) struct JsonlSource {
    files: SpanFiles,
    field: Arc<str>,
    display: String,
}

impl fmt::Debug for JsonlSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonlSource").field("source", &self.display).field("files", &self.files.count()).finish()
    }
}

impl fmt::Display for JsonlSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

/// Open the JSONL files `listing` (in path order).
pub(crate) async fn open(
    store: Store,
    listing: Vec<ObjectInfo>,
    opts: &SourceOptions,
    display: String,
) -> Result<Arc<DynSampleSource>> {
    let field: Arc<str> = opts.text_field.as_deref().unwrap_or("text").into();
    let files = SpanFiles::open(store, listing, opts, &JSONL_LINES, (scan, None), &SUFFIXES).await?;
    Ok(Arc::new(JsonlSource { files, field, display }))
}

/// Hand the non-blank lines of `r` to `line`; returns how many bytes `r` held.
fn scan(r: &mut dyn Read, line: &mut dyn FnMut(u64, u64) -> std::io::Result<()>) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let (mut at, mut start, mut blank) = (0u64, 0u64, true);
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        for (i, &b) in buf[..n].iter().enumerate() {
            let pos = at + i as u64;
            if b == b'\n' {
                if !blank {
                    line(start, pos)?;
                }
                (start, blank) = (pos + 1, true);
            } else if !b.is_ascii_whitespace() {
                blank = false;
            }
        }
        at += n as u64;
    }
    if !blank {
        line(start, at)?;
    }
    Ok(at)
}

impl JsonlSource {
    /// The text of document `line` of file `f`, from its line's bytes (starting at byte `at`).
    fn text(&self, f: usize, line: usize, at: u64, bytes: &[u8]) -> Result<Bytes> {
        text_field(bytes, &self.field).map(Bytes::from).map_err(|why| Error::CorruptData {
            shard: self.files.describe(f),
            key: self.files.key(f, line),
            field: self.field.to_string(),
            reason: format!("line at byte {at}: {why}"),
        })
    }
}

/// The string value of `field` in the JSON object `line`, unescaped.
pub(crate) fn text_field(line: &[u8], field: &str) -> std::result::Result<String, String> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Pick<'a>(&'a str);
    impl<'de> Visitor<'de> for Pick<'_> {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
            // A key given twice: the last copy is the value, as Python's json (and pandas,
            // and `datasets`) read it.
            let mut found = None;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == self.0 {
                    found = Some(map.next_value::<StrOrOther>()?.0);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            match found {
                Some(None) => Err(serde::de::Error::custom(format!("`{}` is not a string", self.0))),
                Some(Some(text)) => Ok(Some(text)),
                None => Ok(None),
            }
        }
    }
    /// A string, or `None` for any other JSON value (skipped).
    struct StrOrOther(Option<String>);
    impl<'de> serde::Deserialize<'de> for StrOrOther {
        fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = StrOrOther;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_str<E>(self, v: &str) -> std::result::Result<StrOrOther, E> {
                    Ok(StrOrOther(Some(v.to_string())))
                }
                fn visit_string<E>(self, v: String) -> std::result::Result<StrOrOther, E> {
                    Ok(StrOrOther(Some(v)))
                }
                fn visit_bool<E>(self, _: bool) -> std::result::Result<StrOrOther, E> {
                    Ok(StrOrOther(None))
                }
                fn visit_i64<E>(self, _: i64) -> std::result::Result<StrOrOther, E> {
                    Ok(StrOrOther(None))
                }
                fn visit_u64<E>(self, _: u64) -> std::result::Result<StrOrOther, E> {
                    Ok(StrOrOther(None))
                }
                fn visit_f64<E>(self, _: f64) -> std::result::Result<StrOrOther, E> {
                    Ok(StrOrOther(None))
                }
                fn visit_unit<E>(self) -> std::result::Result<StrOrOther, E> {
                    Ok(StrOrOther(None))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(
                    self,
                    mut s: A,
                ) -> std::result::Result<StrOrOther, A::Error> {
                    while s.next_element::<IgnoredAny>()?.is_some() {}
                    Ok(StrOrOther(None))
                }
                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<StrOrOther, A::Error> {
                    while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                    Ok(StrOrOther(None))
                }
            }
            d.deserialize_any(V)
        }
    }
    impl<'de> DeserializeSeed<'de> for Pick<'_> {
        type Value = Option<String>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(line);
    let picked = Pick(field).deserialize(&mut de).map_err(|e| match std::str::from_utf8(line) {
        // JSON text is UTF-8: say so rather than what the parser tripped on.
        Err(u) => format!("the line is not UTF-8 text (byte {} of the line)", u.valid_up_to()),
        // Python's json.dumps escapes text that held undecodable bytes (read with
        // errors="surrogateescape") as lone surrogates: valid JSON syntax, but no text.
        Ok(_) if e.to_string().contains("surrogate") || e.to_string().contains("escape") && surrogate_escape(line) => {
            format!(
                "a string holds a lone UTF-16 surrogate escape such as \\ud800 ({e}), which is no Unicode character: \
             the writer's text was not valid (Python writes these for text read with errors=\"surrogateescape\"); \
             repair the text, or skip such lines (on_damage=skip; skip_errors=True for a TokenLoader)"
            )
        }
        Ok(_) => format!("not a JSON object with a string `{field}`: {e}"),
    })?;
    de.end().map_err(|e| format!("more after the JSON object: {e}"))?;
    picked.ok_or_else(|| format!("no field `{field}` (set text_field= to the field holding the text)"))
}

/// Whether `line` holds a `\u` escape of a UTF-16 surrogate (`\ud800` to `\udfff`): where
/// one is lone, the parser's error is about the escape (`"\ud800"` ends the string where the
/// pair's second half should be), and the reason is the surrogate.
fn surrogate_escape(line: &[u8]) -> bool {
    line.windows(4)
        .any(|w| w[0] == b'\\' && w[1] == b'u' && w[2].eq_ignore_ascii_case(&b'd') && b"89abcdefABCDEF".contains(&w[3]))
}

#[async_trait]
impl SampleSource for JsonlSource {
    fn len(&self) -> usize {
        self.files.len()
    }

    fn capability(&self) -> Capability {
        self.files.capability()
    }

    fn info(&self) -> SourceInfo {
        SourceInfo::of(Layout::Jsonl, self.files.count())
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        self.get_many(&[index]).await?.pop().ok_or_else(|| Error::internal("no sample for a checked index"))
    }

    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        self.files
            .get_many(indices, |f, line, at, bytes| {
                let text = self.text(f, line, at, &bytes)?;
                Ok(Sample::single(self.files.key(f, line), self.field.clone(), text))
            })
            .await
    }

    fn locality(&self, index: usize) -> Option<usize> {
        self.files.locality(index)
    }

    fn location(&self, index: usize) -> Option<String> {
        self.files.location(index)
    }

    fn io_counters(&self) -> Option<IoCounters> {
        Some(self.files.store().counters())
    }

    fn fingerprint(&self) -> Option<u64> {
        Some(self.files.fingerprint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_is_picked_unescaped_and_bad_lines_say_why() {
        assert_eq!(text_field(br#"{"id": 1, "text": "a\nb \u00e9", "meta": {"text": 2}}"#, "text").unwrap(), "a\nb é");
        assert!(text_field(b"not json", "text").unwrap_err().contains("not a JSON object"));
        assert!(text_field(br#"{"body": "x"}"#, "text").unwrap_err().contains("no field `text`"));
        assert!(text_field(br#"{"text": 5}"#, "text").unwrap_err().contains("string"));
        assert!(text_field(b"{\"text\": \"\xff\"}", "text").is_err());
        // json.dumps("a\udcff") (text that held a byte that is not UTF-8): valid JSON, no text.
        let e = text_field(br#"{"text": "a\udcff"}"#, "text").unwrap_err();
        assert!(e.contains("lone UTF-16 surrogate") && e.contains("surrogateescape"), "{e}");
        let e = text_field(br#"{"text": "\ud800\u0041"}"#, "text").unwrap_err();
        assert!(e.contains("lone UTF-16 surrogate"), "{e}");
        // A high surrogate with nothing after it: the parser says the escape ended.
        let e = text_field(br#"{"text": "x\ud800"}"#, "text").unwrap_err();
        assert!(e.contains("lone UTF-16 surrogate"), "{e}");
        // A key given twice: the last copy, as Python's json reads it (whatever the first).
        let twice = br#"{"text": "old draft", "id": 3, "text": "final text"}"#;
        assert_eq!(text_field(twice, "text").unwrap(), "final text");
        assert_eq!(text_field(br#"{"text": 5, "text": "x"}"#, "text").unwrap(), "x");
        assert!(text_field(br#"{"text": "x", "text": {"a": [1]}}"#, "text").unwrap_err().contains("not a string"));
        // A pair is one character.
        assert_eq!(text_field(br#"{"text": "\ud83d\ude00"}"#, "text").unwrap(), "\u{1f600}");
    }

    #[test]
    fn lines_skip_blanks() {
        let mut lines = Vec::new();
        let len = scan(&mut &b"{}\n\n  \n{\"a\":1}\n{}"[..], &mut |s, e| {
            lines.push((s, e));
            Ok(())
        })
        .unwrap();
        assert_eq!((lines, len), (vec![(0, 2), (7, 14), (15, 17)], 17));
    }
}
