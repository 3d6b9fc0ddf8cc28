//! The `tokenizers` crate behind the few calls [`TextTokenizer`](super::TextTokenizer) makes,
//! so a build without the `tokenizers` feature keeps every type and refuses to load a
//! tokenizer (with an error naming the feature) instead of leaving the library's users to
//! handle a type that is there in one build and not in another.

/// Whether this build loads tokenizers (the `tokenizers` feature).
pub(super) const AVAILABLE: bool = cfg!(feature = "tokenizers");

/// A loaded tokenizer: padding and truncation off (documents are tokenized whole).
#[cfg(feature = "tokenizers")]
pub(super) struct Engine(tokenizers::Tokenizer);

/// No tokenizer can be loaded in this build: the type has no values.
#[cfg(not(feature = "tokenizers"))]
pub(super) enum Engine {}

#[cfg(feature = "tokenizers")]
impl Engine {
    /// Load a `tokenizer.json`'s bytes; the error is the library's (or its panic's) text.
    pub(super) fn load(bytes: &[u8]) -> Result<Engine, String> {
        // The library panics on some damaged files (an `expect` in its normalizers' loader).
        let loaded = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(bytes));
        let mut inner = loaded
            .map_err(|p| format!("the library failed ({})", crate::error::panic_message(p)))?
            .map_err(|e| e.to_string())?;
        // A tokenizer.json may carry padding and truncation settings for a model's inputs:
        // documents are tokenized whole here (rows are cut and padded by the packer or the
        // tokens decode), so pad ids must not count as tokens of a document.
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| e.to_string())?;
        Ok(Engine(inner))
    }

    /// Size of the vocabulary, added tokens included.
    pub(super) fn vocab_size(&self) -> usize {
        self.0.get_vocab_size(true)
    }

    /// Whether token `id` is in the vocabulary.
    pub(super) fn has_id(&self, id: u32) -> bool {
        self.0.id_to_token(id).is_some()
    }

    /// The id of token `text`.
    pub(super) fn token_id(&self, text: &str) -> Option<u32> {
        self.0.token_to_id(text)
    }

    /// The ids of one text, without special tokens, on this thread.
    pub(super) fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.0.encode_fast(text, false).map(|e| e.get_ids().to_vec()).map_err(|e| e.to_string())
    }

    /// The ids of each text, without special tokens, on the library's threads.
    pub(super) fn encode_batch(&self, texts: Vec<&str>) -> Result<Vec<Vec<u32>>, String> {
        let encodings = self.0.encode_batch(texts, false).map_err(|e| e.to_string())?;
        Ok(encodings.into_iter().map(|e| e.get_ids().to_vec()).collect())
    }
}

#[cfg(not(feature = "tokenizers"))]
impl Engine {
    /// Refused (callers check [`AVAILABLE`] first, with an error naming the feature).
    pub(super) fn load(_: &[u8]) -> Result<Engine, String> {
        Err("this build has no tokenizer".into())
    }

    pub(super) fn vocab_size(&self) -> usize {
        match *self {}
    }

    pub(super) fn has_id(&self, _: u32) -> bool {
        match *self {}
    }

    pub(super) fn token_id(&self, _: &str) -> Option<u32> {
        match *self {}
    }

    pub(super) fn encode(&self, _: &str) -> Result<Vec<u32>, String> {
        match *self {}
    }

    pub(super) fn encode_batch(&self, _: Vec<&str>) -> Result<Vec<Vec<u32>>, String> {
        match *self {}
    }
}
