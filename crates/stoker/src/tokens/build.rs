//! Rows of a token batch from their pieces and the tokens read for them.

use std::sync::Arc;

use super::plan::{piece_len, Piece, Placed};
use super::{IdType, PackConfig};
use crate::batch::{BatchBuilder, ColumnType, Dtype};
use crate::error::{Error, Result};

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

/// One row's values, before they go into the batch's columns.
struct Row {
    ids: Vec<i64>,
    positions: Vec<i32>,
    mask: Vec<u8>,
    /// Where each segment starts in the row.
    starts: Vec<i32>,
}

/// Write `rows` (global sequence number and its pieces) into `out`, taking each row's
/// document tokens from `tokens` in order (what [`crate::source::TokenDocs::read_into`] gave
/// for the rows' `Tokens` pieces, in the same order).
pub(crate) fn fill(
    out: &mut BatchBuilder,
    cols: &Columns,
    cfg: &PackConfig,
    rows: &[(u64, Vec<Placed>)],
    tokens: &[i64],
) -> Result<()> {
    let w = cfg.window();
    let mut next = 0usize;
    let mut built = Vec::with_capacity(rows.len());
    for (i, (s, pieces)) in rows.iter().enumerate() {
        let row = row(cfg, pieces, tokens, &mut next)?;
        out.begin(*s, &format!("seq-{s:012}"));
        let cu = out.field(&cols.cu_seqlens, row.starts.len() * 4);
        for (dst, start) in cu.chunks_exact_mut(4).zip(&row.starts) {
            dst.copy_from_slice(&(start + (i * w) as i32).to_ne_bytes());
        }
        built.push(row);
    }
    match cfg.ids {
        IdType::Int32 => {
            let col = out.fixed(&cols.input_ids.0, &cols.input_ids.1);
            let all = built.iter().flat_map(|r| &r.ids);
            for (dst, &t) in col.chunks_exact_mut(4).zip(all) {
                let t = i32::try_from(t).map_err(|_| {
                    Error::invalid_option(format!("token id {t} does not fit int32 ids: ask for int64 ids"))
                })?;
                dst.copy_from_slice(&t.to_ne_bytes());
            }
        }
        IdType::Int64 => {
            let col = out.fixed(&cols.input_ids.0, &cols.input_ids.1);
            for (dst, &t) in col.chunks_exact_mut(8).zip(built.iter().flat_map(|r| &r.ids)) {
                dst.copy_from_slice(&t.to_ne_bytes());
            }
        }
    }
    let col = out.fixed(&cols.position_ids.0, &cols.position_ids.1);
    for (dst, &p) in col.chunks_exact_mut(4).zip(built.iter().flat_map(|r| &r.positions)) {
        dst.copy_from_slice(&p.to_ne_bytes());
    }
    let col = out.fixed(&cols.loss_mask.0, &cols.loss_mask.1);
    for (dst, &m) in col.iter_mut().zip(built.iter().flat_map(|r| &r.mask)) {
        *dst = m;
    }
    Ok(())
}

/// One row: its pieces' tokens, positions restarting per segment, mask and segment starts.
fn row(cfg: &PackConfig, pieces: &[Placed], tokens: &[i64], next: &mut usize) -> Result<Row> {
    let w = cfg.window();
    let mut r = Row {
        ids: Vec::with_capacity(w),
        positions: Vec::with_capacity(w),
        mask: Vec::with_capacity(w),
        starts: Vec::new(),
    };
    let mut segment: Option<Option<u64>> = None;
    let mut pos = 0i32;
    for (doc, piece) in pieces {
        let first_of_doc = segment != Some(*doc);
        if first_of_doc {
            r.starts.push(r.ids.len() as i32);
            pos = 0;
        }
        let n = piece_len(piece) as usize;
        let at = r.ids.len();
        match piece {
            Piece::Bos => r.ids.push(cfg.bos.unwrap_or(cfg.pad_id)),
            Piece::Eos => r.ids.push(cfg.eos.unwrap_or(cfg.pad_id)),
            Piece::Pad(_) => r.ids.extend(std::iter::repeat_n(cfg.pad_id, n)),
            Piece::Tokens { .. } => {
                let got =
                    tokens.get(*next..*next + n).ok_or_else(|| Error::internal("fewer tokens read than planned"))?;
                r.ids.extend_from_slice(got);
                *next += n;
            }
        }
        r.positions.extend((0..n as i32).map(|p| pos + p));
        pos += n as i32;
        let real = u8::from(doc.is_some());
        r.mask.extend(std::iter::repeat_n(real, n));
        if first_of_doc && cfg.mask_boundaries && at > 0 && doc.is_some() {
            r.mask[at] = 0;
        }
        segment = Some(*doc);
    }
    if r.ids.len() != w {
        return Err(Error::internal(format!("a row of {} tokens, not {w}", r.ids.len())));
    }
    Ok(r)
}
