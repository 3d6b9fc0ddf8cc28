//! Text fields tokenized on the decode threads, one document per row (fine-tuning, or any
//! per-sample model input): `[B, seq_len]` ids, truncated or padded, and their lengths.
//! Packing documents into full rows is the [`TokenLoader`](crate::tokens::TokenLoader)'s.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::text::TextTokenizer;
use crate::batch::Dtype;
use crate::error::{Error, Result};

/// The longest row a [`TokensSpec`] may ask for: 16 Mi tokens (a row is allocated per sample).
pub const MAX_SEQ_LEN: usize = 1 << 24;

/// A text field to token ids: the field's UTF-8 text is tokenized by a Hugging Face
/// `tokenizer.json` (the `tokenizers` crate: the Python wheel's ids), `bos`/`eos` added, and
/// the row cut to `seq_len` (the document's tokens truncated, its BOS and EOS kept) or padded
/// with `pad_id`. The batch gets two columns: the field, `[B, seq_len]` of `dtype`, and
/// `FIELD_len`, `[B]` int32, each row's tokens before the padding (for an attention mask or
/// labels).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensSpec {
    /// Path of the `tokenizer.json`.
    pub tokenizer: String,
    /// Tokens in a row.
    pub seq_len: usize,
    /// Put before every document: an id, or the token's text (`"<s>"`).
    #[serde(default)]
    pub bos: Option<TokenRef>,
    /// Put after every document: an id, or the token's text (`"<|endoftext|>"`).
    #[serde(default)]
    pub eos: Option<TokenRef>,
    /// What fills a row after its document.
    #[serde(default)]
    pub pad_id: i64,
    /// `int32` (the default), `int64`, or `uint16` (vocabularies of at most 65,536 tokens).
    #[serde(default = "int32")]
    pub dtype: Dtype,
    /// Cut documents longer than `seq_len` (the default); when off, one is a decode error.
    #[serde(default = "yes")]
    pub truncate: bool,
}

fn int32() -> Dtype {
    Dtype::I32
}

fn yes() -> bool {
    true
}

/// A special token, by id or by its text in the vocabulary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenRef {
    /// The id.
    Id(u32),
    /// The token's text, looked up when the tokenizer loads.
    Text(String),
}

impl TokensSpec {
    /// A spec for `seq_len`-token rows by the tokenizer at `tokenizer`, with the defaults.
    pub fn new(tokenizer: impl Into<String>, seq_len: usize) -> Self {
        TokensSpec {
            tokenizer: tokenizer.into(),
            seq_len,
            bos: None,
            eos: None,
            pad_id: 0,
            dtype: Dtype::I32,
            truncate: true,
        }
    }

    /// Refuse what cannot work, before any file is read.
    pub(super) fn validate(&self) -> std::result::Result<(), String> {
        if self.seq_len == 0 || self.seq_len > MAX_SEQ_LEN {
            return Err(format!("seq_len must be 1..={MAX_SEQ_LEN}, not {}", self.seq_len));
        }
        if !matches!(self.dtype, Dtype::I32 | Dtype::I64 | Dtype::U16) {
            return Err(format!("token ids are int32, int64 or uint16, not {}", self.dtype));
        }
        if self.dtype == Dtype::I32 && i32::try_from(self.pad_id).is_err() {
            return Err(format!("pad_id {} does not fit int32", self.pad_id));
        }
        if self.dtype == Dtype::U16 && u16::try_from(self.pad_id).is_err() {
            return Err(format!("pad_id {} does not fit uint16 (0 to 65,535): use dtype int32", self.pad_id));
        }
        let specials = self.bos.is_some() as usize + self.eos.is_some() as usize;
        if self.seq_len <= specials {
            return Err(format!("seq_len {} leaves no room for a document between BOS and EOS", self.seq_len));
        }
        Ok(())
    }

    /// The name of the lengths column of field `field`.
    pub fn lengths_field(field: &str) -> String {
        format!("{field}_len")
    }
}

/// A [`TokensSpec`] ready to run: its tokenizer loaded and its special tokens resolved.
#[derive(Debug)]
pub(super) struct Tokenize {
    tok: Arc<TextTokenizer>,
    bos: Option<u32>,
    eos: Option<u32>,
    /// The lengths column's name.
    pub(super) lengths: Arc<str>,
}

impl Tokenize {
    pub(super) fn load(field: &str, spec: &TokensSpec) -> Result<Self> {
        let tok = Arc::new(TextTokenizer::from_file(Path::new(&spec.tokenizer))?);
        let resolve = |t: &Option<TokenRef>, what: &str| -> Result<Option<u32>> {
            match t {
                None => Ok(None),
                // By the vocabulary's ids, not its size: vocabularies have gaps.
                Some(TokenRef::Id(id)) if tok.has_id(*id) => Ok(Some(*id)),
                Some(TokenRef::Id(id)) => Err(Error::invalid_option(format!(
                    "decode spec for `{field}`: {what} id {id} is not in the vocabulary of {} ({} tokens)",
                    spec.tokenizer,
                    tok.vocab_size()
                ))),
                Some(TokenRef::Text(text)) => tok.token_id(text).map(Some).ok_or_else(|| {
                    Error::invalid_option(format!(
                        "decode spec for `{field}`: {what} `{text}` is not a token of {}; give its id, or a token \
                         the vocabulary has",
                        spec.tokenizer
                    ))
                }),
            }
        };
        let (bos, eos) = (resolve(&spec.bos, "bos")?, resolve(&spec.eos, "eos")?);
        Ok(Tokenize { tok, bos, eos, lengths: TokensSpec::lengths_field(field).into() })
    }

    /// Tokenize `data` into `out` (a row of `spec.seq_len` ids of `spec.dtype`); the tokens
    /// before the padding.
    pub(super) fn row(&self, spec: &TokensSpec, data: &[u8], out: &mut [u8]) -> std::result::Result<u32, String> {
        let text = std::str::from_utf8(data).map_err(|e| {
            format!("the field is not UTF-8 text ({e}); tokenize text fields, or read this one as bytes")
        })?;
        let room = spec.seq_len - self.bos.is_some() as usize - self.eos.is_some() as usize;
        // Only as much of a long document as the row can take (see `pieces`).
        let (ids, whole) = self.tok.encode_prefix(text, room)?;
        if ids.len() > room && !spec.truncate {
            let more = if whole { "" } else { "over " };
            return Err(format!(
                "the document is {more}{} tokens, more than the row's {room} (seq_len {} less BOS/EOS); raise \
                 seq_len, or let it be truncated (truncate=true)",
                ids.len(),
                spec.seq_len
            ));
        }
        let doc = &ids[..ids.len().min(room)];
        let row = self.bos.iter().chain(doc).chain(&self.eos).map(|&t| t as i64);
        let pad = std::iter::repeat(spec.pad_id);
        let used = self.bos.is_some() as usize + doc.len() + self.eos.is_some() as usize;
        match spec.dtype {
            Dtype::I64 => {
                for (o, t) in out.chunks_exact_mut(8).zip(row.chain(pad)) {
                    o.copy_from_slice(&t.to_ne_bytes());
                }
            }
            Dtype::U16 => {
                // A vocabulary past 65,536 tokens: an id that would wrap is the document's error.
                for (o, t) in out.chunks_exact_mut(2).zip(row.chain(pad)) {
                    let t =
                        u16::try_from(t).map_err(|_| format!("token id {t} does not fit uint16; use dtype int32"))?;
                    o.copy_from_slice(&t.to_ne_bytes());
                }
            }
            _ => {
                // Ids are u32: one past i32::MAX (a vocabulary of 2 G tokens) would wrap.
                for (o, t) in out.chunks_exact_mut(4).zip(row.chain(pad)) {
                    let t =
                        i32::try_from(t).map_err(|_| format!("token id {t} does not fit int32; use dtype int64"))?;
                    o.copy_from_slice(&t.to_ne_bytes());
                }
            }
        }
        Ok(used as u32)
    }
}
