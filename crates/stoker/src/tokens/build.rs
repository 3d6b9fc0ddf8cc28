//! Rows of a token batch from their pieces and the tokens read for them, written straight
//! into the batch's column buffers.

use std::sync::Arc;

use super::plan::{piece_len, Piece, Placed};
use super::{IdType, PackConfig};
use crate::batch::{BatchBuilder, ColumnType, Dtype};
use crate::error::{Error, Result};
use crate::source::{TokenBuf, TokenDocs, TokenSlots};

/// Column names and types of a token batch, made once per loader.
pub(crate) struct Columns {
    input_ids: (Arc<str>, Arc<ColumnType>),
    position_ids: (Arc<str>, Arc<ColumnType>),
    loss_mask: (Arc<str>, Arc<ColumnType>),
    cu_seqlens: Arc<str>,
}

impl Columns {
    pub(crate) fn new(cfg: &PackConfig) -> Self {
        let w = cfg.window();
        let ids = match cfg.ids {
            IdType::Uint16 => Dtype::U16,
            IdType::Int32 => Dtype::I32,
            IdType::Int64 => Dtype::I64,
        };
        Columns {
            input_ids: ("input_ids".into(), ColumnType::new(ids, vec![w])),
            position_ids: ("position_ids".into(), ColumnType::new(Dtype::I32, vec![w])),
            loss_mask: ("loss_mask".into(), ColumnType::new(Dtype::U8, vec![w])),
            cu_seqlens: "cu_seqlens".into(),
        }
    }
}

/// The segments of a row: runs of pieces of one document (or of padding), as
/// `(start in the row, length, whether padding)`.
fn segments(pieces: &[Placed]) -> impl Iterator<Item = (usize, usize, bool)> + '_ {
    let mut at = 0usize;
    let mut i = 0usize;
    std::iter::from_fn(move || {
        let (doc, _) = pieces.get(i)?;
        let start = at;
        while let Some((d, p)) = pieces.get(i) {
            if d != doc {
                break;
            }
            at += piece_len(p) as usize;
            i += 1;
        }
        Some((start, at - start, doc.is_none()))
    })
}

/// Where a batch's document tokens come from: read already ([`TokenDocs::read_into`], at the
/// ids' width, in the order of the rows' `Tokens` pieces), or to be read in place straight
/// into the batch ([`TokenDocs::read_now`] of these spans, in the same order).
pub(crate) enum Tokens<'a> {
    Read(&'a TokenBuf),
    Now(&'a dyn TokenDocs, &'a [(u64, std::ops::Range<u64>)]),
}

/// Append sequence `s`'s key, `seq-` and its number in at least 12 digits (as
/// `format!("seq-{s:012}")` writes it), to `keys`: once a row, without the formatter's
/// machinery or a string of its own (2.5% of an 8-row token epoch's CPU was that `format!`).
fn push_key(keys: &mut String, s: u64) {
    let mut digits = [b'0'; 20];
    let (mut n, mut i) = (s, digits.len());
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    keys.push_str("seq-");
    // ASCII digits: always UTF-8.
    keys.push_str(std::str::from_utf8(&digits[i.min(digits.len() - 12)..]).unwrap_or_default());
}

/// Write `rows` (global sequence number and its pieces) into `out`, each row's document
/// tokens from `tokens`.
pub(crate) fn fill(
    out: &mut BatchBuilder,
    cols: &Columns,
    cfg: &PackConfig,
    rows: &[(u64, Vec<Placed>)],
    tokens: Tokens<'_>,
) -> Result<()> {
    let w = cfg.window();
    for (i, (s, pieces)) in rows.iter().enumerate() {
        if pieces.iter().map(|(_, p)| piece_len(p) as usize).sum::<usize>() != w {
            return Err(Error::internal(format!("sequence {s} planned with the wrong length")));
        }
        out.begin_with(*s, |keys| push_key(keys, *s));
        if !cfg.columns.cu_seqlens {
            continue;
        }
        // The last row also holds the end, so the column's bytes are the batch's whole
        // cu_seqlens as flash-attention takes it.
        let end = (i + 1 == rows.len()).then_some((rows.len() * w) as i32);
        let n = segments(pieces).count() + usize::from(end.is_some());
        let cu = out.field(&cols.cu_seqlens, n * 4);
        let starts = segments(pieces).map(|(start, _, _)| (start + i * w) as i32).chain(end);
        for (dst, v) in cu.chunks_exact_mut(4).zip(starts) {
            dst.copy_from_slice(&v.to_ne_bytes());
        }
    }
    // Ids: each row's pieces in turn, document tokens from `tokens` (at the ids' width; a
    // token too big for int32 ids is refused when read). Read in place, the document pieces'
    // slots are noted here and filled by the read after the loop.
    let width = cfg.ids_width();
    if matches!(tokens, Tokens::Read(t) if t.width() != width) {
        return Err(Error::internal("tokens read at another width than the ids"));
    }
    let col = out.fixed(&cols.input_ids.0, &cols.input_ids.1)?;
    let mut next = 0usize;
    let mut slots = Vec::new();
    for (r, ((_, pieces), row)) in rows.iter().zip(col.chunks_exact_mut(w * width)).enumerate() {
        let mut at = 0usize;
        for (_, p) in pieces {
            let n = piece_len(p) as usize;
            let dst = &mut row[at * width..(at + n) * width];
            match p {
                Piece::Tokens { .. } => match tokens {
                    Tokens::Read(t) => {
                        t.write_ne(next..next + n, dst)
                            .ok_or_else(|| Error::internal("fewer tokens read than planned"))?;
                        next += n;
                    }
                    Tokens::Now(..) => slots.push(((r * w + at) * width, n)),
                },
                Piece::Bos => put_ids(dst, &[cfg.bos.unwrap_or(cfg.pad_id)], width),
                Piece::Eos => put_ids(dst, &[cfg.eos.unwrap_or(cfg.pad_id)], width),
                Piece::Pad(_) => {
                    for d in dst.chunks_exact_mut(width) {
                        put_ids(d, &[cfg.pad_id], width);
                    }
                }
            }
            at += n;
        }
    }
    if let Tokens::Now(docs, wanted) = tokens {
        let mut into = TokenSlots::new(col, &slots, width);
        docs.read_now(wanted, &mut into)?;
        if into.filled() != slots.len() {
            return Err(Error::internal("fewer token pieces read than planned"));
        }
    }
    // Positions restart at every segment; the mask is 0 on padding and, with
    // mask_boundaries, on the first token of every document after the row's first.
    if cfg.columns.position_ids {
        positions(out.fixed(&cols.position_ids.0, &cols.position_ids.1)?, rows, w);
    }
    if cfg.columns.loss_mask {
        mask(out.fixed(&cols.loss_mask.0, &cols.loss_mask.1)?, rows, w, cfg.mask_boundaries);
    }
    Ok(())
}

fn positions(col: &mut [u8], rows: &[(u64, Vec<Placed>)], w: usize) {
    for ((_, pieces), row) in rows.iter().zip(col.chunks_exact_mut(w * 4)) {
        for (start, len, _) in segments(pieces) {
            for (p, dst) in row[start * 4..(start + len) * 4].chunks_exact_mut(4).enumerate() {
                dst.copy_from_slice(&(p as i32).to_ne_bytes());
            }
        }
    }
}

fn mask(col: &mut [u8], rows: &[(u64, Vec<Placed>)], w: usize, boundaries: bool) {
    for ((_, pieces), row) in rows.iter().zip(col.chunks_exact_mut(w)) {
        for (start, len, pad) in segments(pieces) {
            row[start..start + len].fill(u8::from(!pad));
            if boundaries && start > 0 && !pad {
                row[start] = 0;
            }
        }
    }
}

/// `src` ids written native-endian into `dst`, `width` bytes each (2: uint16 and 4: int32,
/// checked by the caller to fit; 8: int64).
#[inline]
fn put_ids(dst: &mut [u8], src: &[i64], width: usize) {
    if width == 2 {
        for (d, &t) in dst.chunks_exact_mut(2).zip(src) {
            d.copy_from_slice(&(t as u16).to_ne_bytes());
        }
    } else if width == 4 {
        for (d, &t) in dst.chunks_exact_mut(4).zip(src) {
            d.copy_from_slice(&(t as i32).to_ne_bytes());
        }
    } else {
        for (d, &t) in dst.chunks_exact_mut(8).zip(src) {
            d.copy_from_slice(&t.to_ne_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sequence_keys_are_the_formatters() {
        for s in [0, 7, 10, 999_999_999_999, 1_000_000_000_000, 123_456_789_012_345, u64::MAX] {
            let mut keys = String::from("before/");
            super::push_key(&mut keys, s);
            assert_eq!(keys, format!("before/seq-{s:012}"));
        }
    }
}
