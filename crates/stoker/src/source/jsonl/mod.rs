//! JSON Lines text corpora: one document per line, its text in one field (`text` unless the
//! `text_field` option names another), as the Hub's and most pretraining corpora ship.
//! Files end `.jsonl`, or `.jsonl.gz` / `.jsonl.zst` compressed as a whole.
//!
//! The first open walks each file once (through the store, a block at a time) and writes where
//! every non-blank line starts and ends to a line index kept on disk ([`lines`]); later opens
//! read that index instead, and a sample is one ranged read of its line. A compressed file
//! cannot be read by range, so it is decompressed once per process (by the walk, or at its
//! first read when its index was found) into an unnamed file of this process's own (freed by
//! the kernel when the process ends), and samples are read from there. What decompression may
//! produce is bounded ([`MAX_RATIO`] times the compressed size, plus [`SLACK`]), so a bomb is
//! an error naming the file, not a full disk. A line that is not a JSON object, lacks the
//! field, or holds invalid UTF-8 is an error naming the file and the document when it is read
//! (`on_damage=skip` / `skip_errors` step over it, counted).

mod lines;

use std::fmt;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::{check_index, Capability, DynSampleSource, SampleSource, SourceInfo};
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::store::{Cancel, IoCounters, Object, ObjectInfo, Store};
use crate::uri::{Layout, SourceOptions};

/// File name endings this layout reads.
pub(crate) const SUFFIXES: [&str; 3] = [".jsonl", ".jsonl.gz", ".jsonl.zst"];

/// Text compresses 3-10x; a whole-file stream that expands more than this is refused.
const MAX_RATIO: u64 = 64;
/// Allowed beyond [`MAX_RATIO`] times the compressed size (tiny files compress badly).
const SLACK: u64 = 64 << 20;

pub(crate) use lines::SUFFIX as INDEX_SUFFIX;
use lines::{LineIndex, Places};

/// Where a file's lines are read from.
enum Body {
    /// The file itself, by range through the store.
    Store,
    /// The file compressed as a whole, decompressed once into an unnamed local file: by the
    /// walk, or at the first read that wants it.
    Compressed(tokio::sync::OnceCell<Arc<std::fs::File>>),
}

struct JsonlFile {
    /// The file's path without its suffix, as keys show it.
    name: String,
    path: String,
    obj: Object,
    body: Body,
    lines: Arc<LineIndex>,
}

/// A JSONL corpus of one or more files, documents in file order, then line order.
pub(crate) struct JsonlSource {
    store: Store,
    files: Vec<JsonlFile>,
    starts: Vec<u64>,
    field: Arc<str>,
    /// Where compressed files are decompressed to.
    spill_dir: PathBuf,
    display: String,
}

impl fmt::Debug for JsonlSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonlSource").field("source", &self.display).field("files", &self.files.len()).finish()
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
    mut listing: Vec<ObjectInfo>,
    opts: &SourceOptions,
    display: String,
) -> Result<Arc<DynSampleSource>> {
    listing.sort_by(|a, b| a.path.cmp(&b.path));
    let field: Arc<str> = opts.text_field.as_deref().unwrap_or("text").into();
    // Decompressed copies go where decoded shards spill (the temporary directory when the
    // disk cache is off: a compressed file has to be decompressed somewhere to be read by line).
    let spill_dir = opts.spill_dir().unwrap_or_else(std::env::temp_dir);
    let opened = super::tar_index::walk_all(listing.len(), opts.concurrency().min(8), |i, cancel| {
        let (info, store, dir) = (listing[i].clone(), store.clone(), spill_dir.clone());
        let places = Places::of(&store, &info.path, opts);
        async move {
            tokio::task::spawn_blocking(move || index(&store, &info, &places, dir, cancel))
                .await
                .map_err(Error::task)?
        }
    })
    .await?;
    let mut files = Vec::with_capacity(listing.len());
    let mut starts = vec![0u64];
    for (info, (lines, copy)) in listing.iter().zip(opened) {
        let suffix = SUFFIXES.iter().rev().find(|s| info.path.ends_with(*s)).copied().unwrap_or("");
        let name = info.path.strip_suffix(suffix).unwrap_or(&info.path).to_string();
        starts.push(starts.last().copied().unwrap_or(0) + lines.len());
        let body = match (compressed(&info.path), copy) {
            (false, _) => Body::Store,
            (true, copy) => Body::Compressed(tokio::sync::OnceCell::new_with(copy.map(Arc::new))),
        };
        let obj = store.object(info);
        files.push(JsonlFile { name, path: info.path.clone(), obj, body, lines: Arc::new(lines) });
    }
    Ok(Arc::new(JsonlSource { store, files, starts, field, spill_dir, display }))
}

fn compressed(path: &str) -> bool {
    path.ends_with(".gz") || path.ends_with(".zst")
}

/// The line index of `info`: the one kept on disk if it is whole and of this version of the
/// file, else built by a walk (which also leaves a compressed file's decompressed copy).
fn index(
    store: &Store,
    info: &ObjectInfo,
    places: &Places,
    spill_dir: PathBuf,
    cancel: Cancel,
) -> Result<(LineIndex, Option<std::fs::File>)> {
    let version = lines::version(info);
    if let Some(found) = places.find(version) {
        return Ok((found, None));
    }
    let fail = |e: std::io::Error| Error::io(format!("the line index of {}", store.describe(&info.path)), e);
    let mut writer = lines::Writer::create(places, &spill_dir).map_err(fail)?;
    let (copy, len) = walk(store, &store.object(info), spill_dir, cancel, &mut |s, e| writer.push(s, e))?;
    Ok((writer.finish(version, len).map_err(fail)?, copy))
}

/// Walk `obj` once, handing each non-blank line to `line`; for a compressed file, leave its
/// decompressed copy. Returns the copy and the length of the (decompressed) data.
fn walk(
    store: &Store,
    obj: &Object,
    spill_dir: PathBuf,
    cancel: Cancel,
    line: &mut dyn FnMut(u64, u64) -> std::io::Result<()>,
) -> Result<(Option<std::fs::File>, u64)> {
    let shown = store.describe(obj.path());
    let mut reader = store.blocking_reader(obj, true, cancel)?;
    let path = obj.path();
    let bad = |why: String| Error::CorruptData {
        shard: shown.clone(),
        key: String::new(),
        field: String::new(),
        reason: why,
    };
    let limit = obj.size().saturating_mul(MAX_RATIO).saturating_add(SLACK);
    let (copy, len) = if compressed(path) {
        let mut file = std::fs::create_dir_all(&spill_dir)
            .and_then(|()| super::spill::unnamed_file(&spill_dir))
            .map_err(|e| Error::io(spill_dir.display(), e))?;
        let decoder: Box<dyn Read> = if path.ends_with(".gz") {
            Box::new(flate2::read::MultiGzDecoder::new(&mut reader))
        } else {
            Box::new(zstd::stream::read::Decoder::new(&mut reader).map_err(|e| bad(format!("not zstd: {e}")))?)
        };
        let len = scan(decoder.take(limit.saturating_add(1)), Some(&mut file), limit, line)
            .map_err(|e| bad(e.to_string()))?;
        (Some(file), len)
    } else {
        (None, scan(&mut reader, None, u64::MAX, line).map_err(|e| bad(e.to_string()))?)
    };
    if let Some(e) = reader.failure() {
        return Err(e);
    }
    Ok((copy, len))
}

/// Hand the non-blank lines of `r` to `line` (copying `r` to `copy` when given), refusing more
/// than `limit` bytes; returns how many bytes `r` held.
fn scan(
    mut r: impl Read,
    mut copy: Option<&mut std::fs::File>,
    limit: u64,
    line: &mut dyn FnMut(u64, u64) -> std::io::Result<()>,
) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let (mut at, mut start, mut blank) = (0u64, 0u64, true);
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if at + n as u64 > limit {
            return Err(std::io::Error::other(format!(
                "it decompresses to more than {limit} bytes ({MAX_RATIO} times its size): a decompression bomb, or \
                 not text"
            )));
        }
        if let Some(f) = copy.as_deref_mut() {
            f.write_all(&buf[..n])?;
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
    fn locate(&self, doc: u64) -> Option<(usize, usize)> {
        super::locate(&self.starts, doc)
    }

    /// The bytes of lines `lines` of file `f`, with where each starts.
    async fn read_lines(&self, f: usize, lines: &[usize]) -> Result<Vec<(u64, Bytes)>> {
        let file = &self.files[f];
        let shown = self.store.describe(&file.path);
        let (index, want) = (file.lines.clone(), lines.to_vec());
        let copy = match &file.body {
            Body::Store => None,
            Body::Compressed(copy) => Some(self.decompressed(f, copy).await?.clone()),
        };
        let fail = move |what: &str, e: std::io::Error| Error::io(format!("{what} of {shown}"), e);
        let Some(copy) = copy else {
            // Looked up in place, not on a blocking thread: 16 bytes a line of a local file
            // read whole at open (so in the page cache), where a hop to the blocking pool and
            // back costs more than the read itself (the store's read makes one hop already).
            let spans = index.spans(&want).map_err(|e| fail("the line index", e))?;
            let got = self.store.read(&file.obj, &spans).await?;
            return Ok(spans.iter().map(|s| s.start).zip(got).collect());
        };
        tokio::task::spawn_blocking(move || {
            let spans = index.spans(&want).map_err(|e| fail("the line index", e))?;
            spans
                .iter()
                .map(|s| {
                    // Fallible: a line's length comes from the data.
                    let v = crate::buffer::try_take((s.end - s.start) as usize)
                        .and_then(|mut v| copy.read_exact_at(&mut v, s.start).map(|()| v))
                        .map_err(|e| fail("the decompressed copy", e))?;
                    Ok((s.start, Bytes::from(v)))
                })
                .collect()
        })
        .await
        .map_err(Error::task)?
    }

    /// The decompressed copy of compressed file `f`, made at the first read that wants it
    /// when the walk was skipped (its line index was found on disk).
    async fn decompressed<'a>(
        &self,
        f: usize,
        copy: &'a tokio::sync::OnceCell<Arc<std::fs::File>>,
    ) -> Result<&'a Arc<std::fs::File>> {
        copy.get_or_try_init(|| async {
            let (store, obj, dir) = (self.store.clone(), self.files[f].obj.clone(), self.spill_dir.clone());
            let want = self.files[f].lines.data_len();
            let cancel = Cancel::default();
            let _stop = cancel.on_drop();
            let (copy, len) = tokio::task::spawn_blocking(move || walk(&store, &obj, dir, cancel, &mut |_, _| Ok(())))
                .await
                .map_err(Error::task)??;
            match copy {
                Some(copy) if len == want => Ok(Arc::new(copy)),
                _ => Err(Error::CorruptData {
                    shard: self.store.describe(&self.files[f].path),
                    key: String::new(),
                    field: String::new(),
                    reason: format!(
                        "it decompresses to {len} bytes where its line index says {want}: the file changed \
                         without changing its size or time; delete its `{}` index and reopen",
                        lines::SUFFIX
                    ),
                }),
            }
        })
        .await
    }

    /// The text of document `line` of file `f`, from its line's bytes (starting at byte `at`).
    fn text(&self, f: usize, line: usize, at: u64, bytes: &[u8]) -> Result<Bytes> {
        text_field(bytes, &self.field).map(Bytes::from).map_err(|why| Error::CorruptData {
            shard: self.store.describe(&self.files[f].path),
            key: self.key(f, line),
            field: self.field.to_string(),
            reason: format!("line at byte {at}: {why}"),
        })
    }

    fn key(&self, f: usize, line: usize) -> String {
        format!("{}/{line:09}", self.files[f].name)
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
            let mut found = None;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == self.0 && found.is_none() {
                    found = Some(map.next_value::<String>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
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
        Ok(_) => format!("not a JSON object with a string `{field}`: {e}"),
    })?;
    de.end().map_err(|e| format!("more after the JSON object: {e}"))?;
    picked.ok_or_else(|| format!("no field `{field}` (set text_field= to the field holding the text)"))
}

#[async_trait]
impl SampleSource for JsonlSource {
    fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0) as usize
    }

    fn capability(&self) -> Capability {
        Capability {
            random_access: true,
            coalesced_reads: true,
            locality: true,
            cheap_meta: false,
            local: !self.store.is_remote(),
        }
    }

    fn info(&self) -> SourceInfo {
        SourceInfo::of(Layout::Jsonl, self.files.len())
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        self.get_many(&[index]).await?.pop().ok_or_else(|| Error::internal("no sample for a checked index"))
    }

    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        let mut located = Vec::with_capacity(indices.len());
        for &i in indices {
            check_index(i, self.len())?;
            located.push(self.locate(i as u64).ok_or_else(|| Error::internal("a checked index not found"))?);
        }
        let mut out: Vec<Option<Sample>> = vec![None; indices.len()];
        let mut order: Vec<usize> = (0..located.len()).collect();
        order.sort_by_key(|&i| located[i]);
        for group in order.chunk_by(|&a, &b| located[a].0 == located[b].0) {
            let f = located[group[0]].0;
            let lines: Vec<usize> = group.iter().map(|&i| located[i].1).collect();
            let got = self.read_lines(f, &lines).await?;
            for (&i, (at, bytes)) in group.iter().zip(got) {
                let line = located[i].1;
                let text = self.text(f, line, at, &bytes)?;
                out[i] = Some(Sample::single(self.key(f, line), self.field.clone(), text));
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    fn locality(&self, index: usize) -> Option<usize> {
        self.locate(index as u64).map(|(f, _)| f)
    }

    fn location(&self, index: usize) -> Option<String> {
        self.locate(index as u64).map(|(f, _)| format!("file {}", self.store.describe(&self.files[f].path)))
    }

    fn io_counters(&self) -> Option<IoCounters> {
        Some(self.store.counters())
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
    }

    #[test]
    fn lines_skip_blanks_and_a_bomb_is_stopped() {
        let mut lines = Vec::new();
        let len = scan(&b"{}\n\n  \n{\"a\":1}\n{}"[..], None, u64::MAX, &mut |s, e| {
            lines.push((s, e));
            Ok(())
        })
        .unwrap();
        assert_eq!((lines, len), (vec![(0, 2), (7, 14), (15, 17)], 17));
        let zeros = std::io::repeat(b'x').take(10_000);
        assert!(scan(zeros, None, 1000, &mut |_, _| Ok(())).unwrap_err().to_string().contains("decompression bomb"));
    }
}
