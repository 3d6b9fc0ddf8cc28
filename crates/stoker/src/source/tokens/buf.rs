//! Tokens read for packing, held at the width of the ids the batch will carry, so they are
//! widened once, from the file's bytes, and copied into the batch as they are.

use std::ops::Range;

use super::idx::TokenType;
use crate::error::{Error, Result};

/// Document tokens as [`super::TokenDocs::read_into`] appends them: `u16` for uint16 ids,
/// `i32` for int32 ids (each checked to fit when read), `i64` for int64 ids. Going through
/// `i64` for int32 ids wrote and read 8 bytes a token more than the batch needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenBuf {
    /// Tokens for uint16 ids, as the native-endian bytes the batch takes.
    U16(Vec<u8>),
    /// Tokens for int32 ids.
    I32(Vec<i32>),
    /// Tokens for int64 ids.
    I64(Vec<i64>),
}

impl TokenBuf {
    /// An empty buffer for ids of `width` bytes (2, 4 or 8) with room for `n` tokens.
    pub fn with_capacity(width: usize, n: usize) -> Self {
        match width {
            8 => TokenBuf::I64(Vec::with_capacity(n)),
            2 => TokenBuf::U16(Vec::with_capacity(n * 2)),
            _ => TokenBuf::I32(Vec::with_capacity(n)),
        }
    }

    /// Bytes per token (2, 4 or 8).
    pub fn width(&self) -> usize {
        match self {
            TokenBuf::U16(_) => 2,
            TokenBuf::I32(_) => 4,
            TokenBuf::I64(_) => 8,
        }
    }

    /// Append the tokens of little-endian `bytes` of type `ty`, or return the first that is
    /// not an id at this width (negative, or past uint16 or int32 ids), for the caller to
    /// name its file ([`bad_token`]); nothing is appended then.
    pub(crate) fn extend(&mut self, ty: TokenType, bytes: &[u8]) -> std::result::Result<(), i64> {
        match self {
            TokenBuf::I64(v) => {
                let start = v.len();
                ty.extend(bytes, v);
                ty.refuse_negative(v, start)
            }
            TokenBuf::I32(v) => ty.extend_i32(bytes, v),
            TokenBuf::U16(v) => {
                let start = v.len();
                v.resize(start + bytes.len() / ty.size() * 2, 0);
                ty.write_ne(bytes, &mut v[start..], 2).inspect_err(|_| v.truncate(start))
            }
        }
    }

    /// Tokens `range` written native-endian into `dst` (exactly `range.len() * width()`
    /// bytes); `None` when the range is past the end.
    pub(crate) fn write_ne(&self, range: Range<usize>, dst: &mut [u8]) -> Option<()> {
        match self {
            TokenBuf::U16(v) => {
                let bytes = v.get(range.start * 2..range.end * 2)?;
                dst.get_mut(..bytes.len())?.copy_from_slice(bytes);
            }
            TokenBuf::I32(v) => {
                for (d, t) in dst.chunks_exact_mut(4).zip(v.get(range)?) {
                    d.copy_from_slice(&t.to_ne_bytes());
                }
            }
            TokenBuf::I64(v) => {
                for (d, t) in dst.chunks_exact_mut(8).zip(v.get(range)?) {
                    d.copy_from_slice(&t.to_ne_bytes());
                }
            }
        }
        Some(())
    }
}

/// Where [`super::TokenDocs::read_now`] writes: each piece's tokens straight into its place in
/// a batch's ids column at the ids' width (no buffer between the file's bytes and the batch),
/// by the piece's number in the run of pieces read.
pub struct TokenSlots<'a> {
    col: &'a mut [u8],
    /// Each piece's byte offset in `col` and its number of tokens.
    slots: &'a [(usize, usize)],
    /// Pieces written so far.
    next: usize,
    /// Where the current reader's pieces start among the slots (a mixture's sources read
    /// their runs of pieces in turn, each numbering its own from 0).
    base: usize,
    width: usize,
}

impl<'a> TokenSlots<'a> {
    /// Slots `slots` (byte offset, tokens) of `col`, ids `width` bytes wide (2, 4 or 8).
    pub(crate) fn new(col: &'a mut [u8], slots: &'a [(usize, usize)], width: usize) -> Self {
        TokenSlots { col, slots, next: 0, base: 0, width }
    }

    /// Pieces written so far.
    pub(crate) fn filled(&self) -> usize {
        self.next
    }

    /// The pieces from here on are the next reader's, numbered from 0 by
    /// [`put_at`](Self::put_at) (a mixture calls this before each source's run).
    pub(crate) fn next_run(&mut self) {
        self.base = self.next;
    }

    /// Piece `i` of the current run: its tokens, little-endian `bytes` of type `ty`, into its
    /// slot. Each piece is written once ([`filled`](Self::filled) counts them). More tokens
    /// or pieces than planned is an internal error; a token that is not an id at this width
    /// is `bad`'s error for it (see [`bad_token`]).
    pub(crate) fn put_at(
        &mut self,
        i: usize,
        ty: TokenType,
        bytes: &[u8],
        bad: impl Fn(i64, usize) -> Error,
    ) -> Result<()> {
        let &(at, n) =
            self.slots.get(self.base + i).ok_or_else(|| Error::internal("more token pieces read than planned"))?;
        if bytes.len() != n * ty.size() {
            return Err(Error::internal(format!("{} bytes read for a piece of {n} tokens", bytes.len())));
        }
        let width = self.width;
        let dst = self
            .col
            .get_mut(at..at + n * width)
            .ok_or_else(|| Error::internal("a token piece outside its batch's column"))?;
        ty.write_ne(bytes, dst, width).map_err(|t| bad(t, width))?;
        self.next += 1;
        Ok(())
    }
}

/// The error for token `t` of the file `shown` (`name` its document file's name), which is not
/// an id at the ids' `width` (2, 4 or 8 bytes): a negative one says the file is damaged (an id
/// indexes a vocabulary; handed on, it fails the embedding lookup far from here), one past
/// uint16 or int32 ids asks for wider ids.
pub(crate) fn bad_token(t: i64, width: usize, shown: String, name: &str) -> Error {
    if t < 0 {
        return Error::CorruptData {
            shard: shown,
            key: name.to_string(),
            field: "tokens".into(),
            reason: format!(
                "token id {t} is negative: an id indexes a vocabulary, so the file is damaged or not of token \
                 ids; write it again"
            ),
        };
    }
    // The narrowest ids that hold it.
    let ids = if width == 2 { "uint16" } else { "int32" };
    let wider = if i32::try_from(t).is_ok() { "int32" } else { "int64" };
    Error::invalid_option(format!("{shown}: token id {t} does not fit {ids} ids: ask for {wider} ids"))
}
