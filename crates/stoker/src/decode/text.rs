//! Tokenizing text in Rust: a Hugging Face `tokenizer.json` loaded by the `tokenizers` crate
//! (the same core as the Python wheel, so the ids are the same), encoded in parallel batches.

use std::path::Path;

use super::engine::Engine;
use crate::error::{Error, Result};

/// The largest `tokenizer.json` loaded (256 MiB; the largest published are tens of MB). A
/// device given in its place is refused unread; a pipe is read up to it.
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// A loaded `tokenizer.json`.
pub struct TextTokenizer {
    inner: Engine,
    shown: String,
    fingerprint: u64,
    /// Bytes of text one call of the library encodes: a piece for each core, and at least
    /// [`BATCH_BYTES`] (the cores are counted once, at load).
    batch_bytes: usize,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer").field("file", &self.shown).field("vocab", &self.vocab_size()).finish()
    }
}

impl TextTokenizer {
    /// Load `path` (a Hugging Face `tokenizer.json`; the largest are tens of MB, and a file
    /// over [`MAX_TOKENIZER_BYTES`] is refused unread: a corpus given in its place).
    pub fn from_file(path: &Path) -> Result<Self> {
        // A build without the library refuses before reading the file.
        if !super::engine::AVAILABLE {
            return Err(Error::without_feature(&path.display().to_string(), "a tokenizer.json", "tokenizers"));
        }
        let bytes = crate::store::read_capped(path, MAX_TOKENIZER_BYTES).map_err(|e| {
            Error::invalid_option(format!(
                "cannot read the tokenizer {}: {e} (give the path of a Hugging Face tokenizer.json)",
                path.display()
            ))
        })?;
        Self::from_bytes(&bytes, &path.display().to_string())
    }

    /// Load a `tokenizer.json`'s bytes; `shown` names it in errors.
    pub fn from_bytes(bytes: &[u8], shown: &str) -> Result<Self> {
        if !super::engine::AVAILABLE {
            return Err(Error::without_feature(shown, "a tokenizer.json", "tokenizers"));
        }
        let cannot = |e: String| {
            Error::invalid_option(format!("{shown} is not a tokenizer.json the tokenizers library can load: {e}"))
        };
        refuse_bad_charsmaps(bytes).map_err(cannot)?;
        let inner = Engine::load(bytes).map_err(cannot)?;
        // Forks watched from now on: a batch encoded on rayon's pool in a forked child would
        // wait for the parent's pool threads (see `fork`).
        crate::fork::generation();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let tok = TextTokenizer {
            inner,
            shown: shown.to_string(),
            fingerprint: twox_hash::XxHash64::oneshot(0, bytes),
            batch_bytes: BATCH_BYTES.max(cores * PIECE_BYTES),
        };
        // A damaged normalizer table can load and then make the library panic on the first
        // text: tried here on every ASCII character and a few others, so the file is named at
        // open. (An error for the probe is no sign of damage: a word-level vocabulary without
        // an unknown token refuses words it lacks.)
        let probe: String = (1u8..0x80).map(char::from).chain("é ü ß ğ 中文 😀 \u{200b}".chars()).collect();
        tok.guarded(|| tok.inner.encode(probe.as_str()).is_ok()).map_err(Error::invalid_option)?;
        Ok(tok)
    }

    /// `f`, with a panic of the tokenizers library (a damaged tokenizer.json can make one)
    /// turned into an error naming this tokenizer.
    fn guarded<T>(&self, f: impl FnOnce() -> T) -> std::result::Result<T, String> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
            format!(
                "tokenizing with {} failed inside the tokenizers library ({}): the tokenizer.json is likely damaged; \
                 load it with the tokenizers Python package to check it",
                self.shown,
                crate::error::panic_message(p)
            )
        })
    }

    /// What errors call it (its path).
    pub fn name(&self) -> &str {
        &self.shown
    }

    /// Size of the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    /// A hash of the `tokenizer.json` bytes: what tokenized data is keyed by.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Whether the vocabulary (added tokens included) has a token of id `id`.
    pub fn has_id(&self, id: u32) -> bool {
        self.inner.has_id(id)
    }

    /// The id of token `text` (e.g. `<|endoftext|>`), if the vocabulary has it.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_id(text)
    }

    /// The ids of one text, without special tokens, on the calling thread (the Loader's
    /// decode threads run one document each); a text over 256 KiB in pieces cut at word
    /// ends (the same ids for tokenizers that split words at whitespace).
    pub fn encode(&self, text: &str) -> std::result::Result<Vec<u32>, String> {
        Ok(self.encode_prefix(text, usize::MAX)?.0)
    }

    /// The ids of `text`'s first pieces (as [`encode`](Self::encode) cuts it), up to the first piece that brings
    /// them past `want` (a row's room: a document cut to it needs no more), and whether
    /// they are the whole text's.
    pub fn encode_prefix(&self, text: &str, want: usize) -> std::result::Result<(Vec<u32>, bool), String> {
        let mut ids = Vec::new();
        let pieces = pieces(text);
        for (n, piece) in pieces.iter().enumerate() {
            match self.guarded(|| self.inner.encode(piece))? {
                Ok(e) => ids.extend_from_slice(&e),
                Err(e) => return Err(format!("tokenizing with {} failed: {e}", self.shown)),
            }
            if ids.len() > want {
                return Ok((ids, n + 1 == pieces.len()));
            }
        }
        Ok((ids, true))
    }

    /// The ids of each text, without special tokens (BOS/EOS are the packer's), encoded in
    /// parallel on the `tokenizers` crate's threads (all cores; on the calling thread in a
    /// process forked after its parent used them: their threads are the parent's); a long
    /// text over 256 KiB in pieces, as [`encode`](Self::encode).
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        self.encode_batch_in(texts, self.batch_bytes)
    }

    /// [`encode_batch`](Self::encode_batch), `limit` bytes of text to one call of the library.
    fn encode_batch_in(&self, texts: &[&str], limit: usize) -> Result<Vec<Vec<u32>>> {
        let failed = |reason: String| Error::Decode {
            source_name: self.shown.clone(),
            key: String::new(),
            index: 0,
            field: "text".into(),
            reason,
        };
        let cut: Vec<Vec<&str>> = texts.iter().map(|t| pieces(t)).collect();
        let flat: Vec<&str> = cut.iter().flatten().copied().collect();
        // The library's encodings take about 100 times their text (offsets, token strings,
        // masks): they are made a group of pieces at a time, at most `limit` bytes of text,
        // and cut down to their ids before the next group, so a 120 MB document (a few MB of
        // zstd) takes its ids' memory, not gigabytes.
        let mut ids: Vec<Vec<u32>> = Vec::with_capacity(flat.len());
        let mut rest = &flat[..];
        while !rest.is_empty() {
            let mut n = 0;
            let mut bytes = 0;
            while n < rest.len() && (n == 0 || bytes + rest[n].len() <= limit) {
                bytes += rest[n].len();
                n += 1;
            }
            let group = rest[..n].to_vec();
            let encoded = self
                .guarded(|| self.inner.encode_batch(group))
                .map_err(failed)?
                .map_err(|e| failed(format!("tokenizing failed: {e}")))?;
            ids.extend(encoded);
            rest = &rest[n..];
        }
        let mut ids = ids.into_iter();
        Ok(cut.iter().map(|p| ids.by_ref().take(p.len()).flatten().collect()).collect())
    }
}

/// The most bytes of text one call of the library encodes at once (see
/// [`TextTokenizer::encode_batch`]), unless the cores need more pieces: 4 MB, about 400 MB of
/// the library's working memory at worst.
const BATCH_BYTES: usize = 4 << 20;

/// Refuse a `Precompiled` normalizer (SentencePiece's table) whose table claims more bytes
/// than it has: the library sizes an allocation by the claim before reading it (a 200-byte
/// file asked for 4 GB and aborted the process). `bytes` is the whole tokenizer.json.
fn refuse_bad_charsmaps(bytes: &[u8]) -> std::result::Result<(), String> {
    /// The decoded length of base64 text `b` and its first four bytes (`None`: not base64
    /// or shorter than four bytes); the table itself is the library's to decode.
    fn head(b: &str) -> Option<(usize, [u8; 4])> {
        let six = |c: u8| match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        };
        let body = b.trim_end_matches('=').as_bytes();
        let mut bits = 0u64;
        for &c in body.get(..8)? {
            bits = bits << 6 | u64::from(six(c)?);
        }
        let [_, _, a, b, c, d, _, _] = bits.to_be_bytes();
        Some((body.len() * 3 / 4, [a, b, c, d]))
    }
    fn walk(v: &serde_json::Value) -> std::result::Result<(), String> {
        match v {
            serde_json::Value::Object(m) => {
                if let (Some(t), Some(map)) = (m.get("type"), m.get("precompiled_charsmap")) {
                    if t == "Precompiled" {
                        let Some((len, first)) = map.as_str().and_then(head) else {
                            return Err("its Precompiled normalizer's table is not base64 of a table".into());
                        };
                        let claim = u32::from_le_bytes(first) as usize;
                        if !claim.is_multiple_of(4) || claim > len.saturating_sub(4) {
                            return Err(format!(
                                "its Precompiled normalizer's table claims {claim} bytes of trie in {len} bytes (damaged)"
                            ));
                        }
                    }
                }
                m.values().try_for_each(walk)
            }
            serde_json::Value::Array(a) => a.iter().try_for_each(walk),
            _ => Ok(()),
        }
    }
    // Parsed into a tree only when a table may be there (a large vocabulary's file is tens of
    // MB); not JSON: the library's own error says so.
    if !bytes.windows(b"Precompiled".len()).any(|w| w == b"Precompiled") {
        return Ok(());
    }
    serde_json::from_slice::<serde_json::Value>(bytes).map_or(Ok(()), |v| walk(&v))
}

/// The most bytes of text tokenized at once. The `tokenizers` crate's working memory is
/// about 100 times the text (260 bytes a token for text of short words: a 16 MB document
/// took 1.8 GB, and a 60 MB one aborted the process wanting a gigabyte in one allocation).
pub(crate) const PIECE_BYTES: usize = 256 << 10;

/// `text` in pieces of at most [`PIECE_BYTES`]: each cut right before a whitespace character
/// that follows another character, in the piece's second half (for tokenizers that split
/// words at whitespace, as the byte-level BPE, WordPiece and Metaspace ones do, a word never
/// spans the cut, so the pieces' ids are the whole text's); a piece with no such place is
/// cut at a character boundary, where its ids may differ from the whole text's. One piece
/// for a text of at most [`PIECE_BYTES`].
pub(crate) fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::with_capacity(text.len() / PIECE_BYTES + 1);
    let mut rest = text;
    while rest.len() > PIECE_BYTES {
        let mut end = PIECE_BYTES;
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let head = &rest[..end];
        let word_end = head
            .char_indices()
            .rev()
            .take_while(|&(i, _)| i > PIECE_BYTES / 2)
            .find(|&(i, c)| c.is_whitespace() && !head[..i].ends_with(char::is_whitespace))
            .map(|(i, _)| i);
        let at = word_end.unwrap_or(end);
        out.push(&rest[..at]);
        rest = &rest[at..];
    }
    out.push(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORDS: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
        "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
        "model":{"type":"WordLevel","vocab":{"[UNK]":0,"a":1,"b":2},"unk_token":"[UNK]"}}"#;

    /// `encode_batch` runs on rayon's pool, whose threads a forked child (a DataLoader fork
    /// worker) lacks: once the parent has used the pool, the child's batches must still end.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_forked_child_encodes_batches_after_the_parent_used_rayon() {
        let tok = TextTokenizer::from_bytes(WORDS.as_bytes(), "words").unwrap();
        let texts: Vec<String> = (0..4000).map(|i| if i % 2 == 0 { "a b a".into() } else { "b c".into() }).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        assert_eq!(tok.encode_batch(&refs).unwrap()[..2], [vec![1, 2, 1], vec![2, 0]]);
        let serial = !tokenizers::utils::parallelism::get_parallelism() || rayon_is_one_thread();
        assert!(tokenizers::utils::parallelism::has_parallelism_been_used() || serial);
        let child = crate::fork::in_child((), || tok.encode_batch(&refs).is_ok_and(|ids| ids[1] == [2, 0]));
        assert_eq!(child, Ok(()), "a forked child's encode_batch");
    }

    /// A damaged tokenizer.json is an error naming it, never an abort or a panic: a
    /// SentencePiece table claiming 2 GB of trie in 68 bytes (the library would allocate 4 GB
    /// before reading it), and one that loads but makes the library index past its end.
    #[test]
    fn damaged_normalizer_tables_are_errors_naming_the_file() {
        let with_table = |table: &[u8]| {
            const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            let mut enc = String::new();
            for c in table.chunks(3) {
                let n = c.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
                for i in 0..4 {
                    enc.push(if i <= c.len() { B64[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
                }
            }
            WORDS.replace(
                r#""normalizer":null"#,
                &format!(r#""normalizer":{{"type":"Precompiled","precompiled_charsmap":"{enc}"}}"#),
            )
        };
        let huge = with_table(&[&[0xff, 0xff, 0xff, 0x7f][..], &[1; 64]].concat());
        let e = TextTokenizer::from_bytes(huge.as_bytes(), "huge.json").unwrap_err().to_string();
        assert!(e.contains("huge.json") && e.contains("claims 2147483647 bytes"), "{e}");
        let bogus = with_table(&[&[8, 0, 0, 0][..], &[0xff; 8], b"abc"].concat());
        let e = TextTokenizer::from_bytes(bogus.as_bytes(), "bogus.json").unwrap_err().to_string();
        assert!(e.contains("bogus.json") && e.contains("likely damaged"), "{e}");
    }

    /// Texts encoded a group of pieces at a time (the groups' bytes bounded) have the ids of
    /// one call over them all.
    #[test]
    fn grouped_calls_give_the_ids_of_one() {
        let tok = TextTokenizer::from_bytes(WORDS.as_bytes(), "words").unwrap();
        let texts: Vec<String> = (0..50).map(|i| "a b ".repeat(i % 7) + &"b c a ".repeat(i % 3)).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let whole = tok.encode_batch_in(&refs, usize::MAX).unwrap();
        for limit in [0, 1, 10, 100] {
            assert_eq!(tok.encode_batch_in(&refs, limit).unwrap(), whole, "{limit}");
        }
        assert_eq!(whole[8], [1, 2, 2, 0, 1, 2, 0, 1]);
    }

    fn rayon_is_one_thread() -> bool {
        tokenizers::utils::parallelism::current_num_threads() <= 1
    }
    /// A text longer than a piece is tokenized in pieces cut at word ends: the same ids as
    /// whole, and a prefix stops at the piece that has enough.
    #[test]
    fn long_texts_are_tokenized_in_pieces_with_the_whole_texts_ids() {
        let tok = TextTokenizer::from_bytes(WORDS.as_bytes(), "words").unwrap();
        // Words of 1-3 letters and runs of 1-3 spaces or newlines, over 3 pieces' worth.
        let (mut text, mut want) = (String::new(), Vec::new());
        for i in 0..300_000usize {
            let word = ["a", "bb", "ab", "b"][i % 4];
            text.push_str(word);
            want.push(match word {
                "a" => 1,
                "b" => 2,
                _ => 0,
            });
            text.push_str(["  ", " ", "\n \t"][i % 3]);
        }
        let cut = pieces(&text);
        assert!(cut.len() > 3 && cut.iter().all(|p| p.len() <= PIECE_BYTES), "{} pieces", cut.len());
        assert_eq!(cut.concat(), text);
        for w in cut.windows(2) {
            assert!(w[1].starts_with(char::is_whitespace) && !w[0].ends_with(char::is_whitespace));
        }
        assert_eq!(tok.encode(&text).unwrap(), want);
        let got = tok.encode_batch(&["a b", &text, "b"]).unwrap();
        assert_eq!((&got[0][..], &got[1], &got[2][..]), (&[1, 2][..], &want, &[2][..]));
        let (first, whole) = tok.encode_prefix(&text, 10).unwrap();
        assert!(!whole && first.len() > 10 && first.len() < want.len() / 2 && want.starts_with(&first));
        assert_eq!(tok.encode_prefix("a b", 10).unwrap(), (vec![1, 2], true));

        // No word end: cut at character boundaries, never inside a character.
        let wide = "é".repeat(PIECE_BYTES);
        let cut = pieces(&wide);
        assert_eq!((cut.len(), cut.concat() == wide), (2, true));
        assert!(cut.iter().all(|p| p.len() <= PIECE_BYTES));
    }
}
