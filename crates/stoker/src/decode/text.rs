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
    /// decode threads run one document each).
    pub fn encode(&self, text: &str) -> std::result::Result<Vec<u32>, String> {
        match self.inner.encode_fast(text, false) {
            Ok(e) => Ok(e.get_ids().to_vec()),
            Err(e) => Err(format!("tokenizing with {} failed: {e}", self.shown)),
        }
    }

    /// The ids of each text, without special tokens (BOS/EOS are the packer's), encoded in
    /// parallel on the `tokenizers` crate's threads (all cores; on the calling thread in a
    /// process forked after its parent used them: their threads are the parent's).
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        let encodings = self.inner.encode_batch(texts.to_vec(), false).map_err(|e| Error::Decode {
            source_name: self.shown.clone(),
            key: String::new(),
            index: 0,
            field: "text".into(),
            reason: format!("tokenizing failed: {e}"),
        })?;
        Ok(encodings.into_iter().map(|e| e.get_ids().to_vec()).collect())
    }
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
}
