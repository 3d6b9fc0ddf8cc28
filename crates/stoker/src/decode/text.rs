//! Tokenizing text in Rust: a Hugging Face `tokenizer.json` loaded by the `tokenizers` crate
//! (the same core as the Python wheel, so the ids are the same), encoded in parallel batches.

use std::path::Path;

use crate::error::{Error, Result};

/// The largest `tokenizer.json` loaded (1 GiB; the largest published are tens of MB).
pub const MAX_TOKENIZER_BYTES: u64 = 1 << 30;

/// A loaded `tokenizer.json`.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    shown: String,
    fingerprint: u64,
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
        let mut inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| {
            Error::invalid_option(format!("{shown} is not a tokenizer.json the tokenizers library can load: {e}"))
        })?;
        // A tokenizer.json may carry padding and truncation settings for a model's inputs:
        // documents are tokenized whole here (rows are cut and padded by the packer or the
        // tokens decode), so pad ids must not count as tokens of a document.
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| Error::invalid_option(format!("{shown}: {e}")))?;
        // Forks watched from now on: a batch encoded on rayon's pool in a forked child would
        // wait for the parent's pool threads (see `fork`).
        crate::fork::generation();
        Ok(TextTokenizer { inner, shown: shown.to_string(), fingerprint: twox_hash::XxHash64::oneshot(0, bytes) })
    }

    /// Size of the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// A hash of the `tokenizer.json` bytes: what tokenized data is keyed by.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Whether the vocabulary (added tokens included) has a token of id `id`.
    pub fn has_id(&self, id: u32) -> bool {
        self.inner.id_to_token(id).is_some()
    }

    /// The id of token `text` (e.g. `<|endoftext|>`), if the vocabulary has it.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
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
            match self.inner.encode_fast(*piece, false) {
                Ok(e) => ids.extend_from_slice(e.get_ids()),
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
        let cut: Vec<Vec<&str>> = texts.iter().map(|t| pieces(t)).collect();
        let flat: Vec<&str> = cut.iter().flatten().copied().collect();
        let encodings = self.inner.encode_batch(flat, false).map_err(|e| Error::Decode {
            source_name: self.shown.clone(),
            key: String::new(),
            index: 0,
            field: "text".into(),
            reason: format!("tokenizing failed: {e}"),
        })?;
        let mut encodings = encodings.into_iter();
        Ok(cut.iter().map(|p| encodings.by_ref().take(p.len()).flat_map(|e| e.get_ids().to_vec()).collect()).collect())
    }
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
