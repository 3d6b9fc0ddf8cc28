//! Tokens read for packing, held at the width of the ids the batch will carry, so they are
//! widened once, from the file's bytes, and copied into the batch as they are.

use std::ops::Range;

use super::idx::TokenType;
use crate::error::{Error, Result};

/// Document tokens as [`super::TokenDocs::read_into`] appends them: `i32` for int32 ids
/// (each checked to fit when read), `i64` for int64 ids. Going through `i64` for int32 ids
/// wrote and read 8 bytes a token more than the batch needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenBuf {
    /// Tokens for int32 ids.
    I32(Vec<i32>),
    /// Tokens for int64 ids.
    I64(Vec<i64>),
}

impl TokenBuf {
    /// An empty buffer for ids of `width` bytes (4 or 8) with room for `n` tokens.
    pub fn with_capacity(width: usize, n: usize) -> Self {
        match width {
            8 => TokenBuf::I64(Vec::with_capacity(n)),
            _ => TokenBuf::I32(Vec::with_capacity(n)),
        }
    }

    /// Bytes per token (4 or 8).
    pub fn width(&self) -> usize {
        match self {
            TokenBuf::I32(_) => 4,
            TokenBuf::I64(_) => 8,
        }
    }

    /// Append the tokens of little-endian `bytes` of type `ty`. A token that does not fit
    /// int32 ids is an error naming it (the caller's type check of the ids asked for).
    pub(crate) fn extend(&mut self, ty: TokenType, bytes: &[u8]) -> Result<()> {
        match self {
            TokenBuf::I64(v) => {
                ty.extend(bytes, v);
                Ok(())
            }
            TokenBuf::I32(v) => ty.extend_i32(bytes, v).map_err(|bad| {
                Error::invalid_option(format!("token id {bad} does not fit int32 ids: ask for int64 ids"))
            }),
        }
    }

    /// Tokens `range` written native-endian into `dst` (exactly `range.len() * width()`
    /// bytes); `None` when the range is past the end.
    pub(crate) fn write_ne(&self, range: Range<usize>, dst: &mut [u8]) -> Option<()> {
        match self {
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
