//! One producer's work: a global batch's rows planned, their document tokens read, the batch
//! filled ([`super::loader::TokenLoader::epoch`] runs it on its producer threads or tasks).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::build::{fill, Columns, Tokens};
use super::mix::TokenMix;
use super::plan::{EpochPlan, Piece, Placed};
use super::PackConfig;
use crate::batch::{Batch, BatchPool};
use crate::error::Result;
use crate::source::{TokenBuf, TokenDocs};

/// What a producer needs to build batches.
pub(super) struct Job {
    pub(super) docs: Arc<dyn TokenDocs>,
    pub(super) mix: Option<Arc<TokenMix>>,
    pub(super) source_tokens: Arc<Vec<AtomicU64>>,
    pub(super) cfg: PackConfig,
    pub(super) cols: Arc<Columns>,
    pub(super) pool: BatchPool,
    pub(super) plan: Arc<EpochPlan>,
    pub(super) epoch: u64,
}

/// A batch's rows (global sequence number and pieces) and the document spans they read.
type RowPlan = (Vec<(u64, Vec<Placed>)>, Vec<(u64, std::ops::Range<u64>)>);

impl Job {
    /// This rank's rows of global batch `b`.
    pub(super) async fn batch(&self, b: u64) -> Result<Batch> {
        let (planned, wanted) = self.plan_rows(b);
        let mut tokens = TokenBuf::with_capacity(self.cfg.ids_width(), planned.len() * self.cfg.window());
        self.docs.read_into(&wanted, &mut tokens).await?;
        self.build(b, &planned, Tokens::Read(&tokens))
    }

    /// [`batch`](Self::batch) on a blocking thread, for documents read in place.
    pub(super) fn batch_now(&self, b: u64) -> Result<Batch> {
        let (planned, wanted) = self.plan_rows(b);
        self.build(b, &planned, Tokens::Now(&*self.docs, &wanted))
    }

    fn build(&self, b: u64, planned: &[(u64, Vec<Placed>)], tokens: Tokens<'_>) -> Result<Batch> {
        let mut out = self.pool.builder();
        fill(&mut out, &self.cols, &self.cfg, planned, tokens)?;
        Ok(out.finish(self.epoch, b))
    }

    /// The pieces of this rank's rows of global batch `b`, and the document spans to read for
    /// them (counted per mixture source).
    fn plan_rows(&self, b: u64) -> RowPlan {
        let docs = &*self.docs;
        let rows = self.cfg.rows() as u64;
        let first = b * self.cfg.global_batch as u64 + self.cfg.partition.rank * rows;
        let window = self.cfg.window() as u64;
        let mut cursor = None;
        let planned: Vec<(u64, Vec<_>)> = (first..first + rows)
            .map(|s| {
                let pieces = if s < self.plan.sequences {
                    self.plan.pieces_after(docs, s, &mut cursor)
                } else {
                    vec![(None, Piece::Pad(window))] // past the epoch's last sequence: the padded tail
                };
                (s, pieces)
            })
            .collect();
        let wanted: Vec<(u64, std::ops::Range<u64>)> = planned
            .iter()
            .flat_map(|(_, p)| p.iter())
            .filter_map(|(_, p)| match p {
                Piece::Tokens { doc, span } => Some((*doc, span.clone())),
                _ => None,
            })
            .collect();
        if let Some(m) = &self.mix {
            for (doc, span) in &wanted {
                self.source_tokens[m.source_of(*doc)].fetch_add(span.end - span.start, Relaxed);
            }
        }
        (planned, wanted)
    }
}
