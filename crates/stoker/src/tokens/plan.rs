//! Where every training sequence of an epoch comes from, worked out from document lengths
//! alone: no rank reads a token to know where its sequences begin, so every rank, at any
//! world size, cuts the same sequences (see [`super`]).

use std::ops::Range;

use crate::sampler::{Order, Partition, Sampler, SamplerConfig, ShardLayout, Tail};
use crate::source::TokenDocs;

use super::mix::{Segments, TokenMix};
use super::{PackConfig, Packing};
use crate::error::{Error, Result};

/// The plan keeps one `u64` offset per `stride` documents and walks at most `stride`
/// documents to find a token (each a document length and, shuffled, a permutation step:
/// the walk at every batch's first row was a tenth of a loader's time at 256). The stride is
/// the smallest power of two from `MIN_STRIDE` that keeps the offsets to `MAX_CHECKPOINTS`
/// (16 MiB): 16 up to 32 million documents, 128 for 256 million.
const MIN_STRIDE: u64 = 16;
const MAX_CHECKPOINTS: u64 = 1 << 21;

/// The documents of an epoch in order: a sampler's (one source), or a list (a mixture).
enum DocOrder {
    Sampler(Box<Sampler>),
    List(Vec<u64>),
}

/// One run of a sequence's tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    /// The configured beginning-of-document token, of the document at this epoch position.
    Bos,
    /// Tokens `span` of document `doc`.
    Tokens { doc: u64, span: Range<u64> },
    /// The configured end-of-document token.
    Eos,
    /// `n` padding tokens (the epoch's end, or a short document in one-per-sequence mode).
    Pad(u64),
}

/// A piece and the document (epoch position) it belongs to, `None` for padding.
pub(crate) type Placed = (Option<u64>, Piece);

/// One epoch's documents in order, with every `stride`th document's first token offset in
/// the epoch's token stream.
pub(crate) struct EpochPlan {
    order: DocOrder,
    /// Tokens each document takes in the stream: its own, plus BOS and EOS when configured.
    extra: u64,
    stride: u64,
    checkpoints: Vec<u64>,
    total: u64,
    pub(crate) sequences: u64,
    cfg: PackConfig,
}

impl EpochPlan {
    /// The plan of `epoch` over `docs` (a pass over every document's length); for a mixture,
    /// its documents interleaved by token share under the weight `segments` (see [`TokenMix`]).
    pub(crate) fn new(
        docs: &dyn TokenDocs,
        cfg: &PackConfig,
        epoch: u64,
        mix: Option<(&TokenMix, &Segments)>,
    ) -> Result<Self> {
        let extra = u64::from(cfg.bos.is_some()) + u64::from(cfg.eos.is_some());
        let order = match mix {
            Some((m, segments)) => {
                // How many documents of `order` the stream before global batch `b` reaches into.
                let cut = |order: &[u64], b: u64| {
                    let g = cfg.global_batch as u64;
                    if cfg.packing == Packing::PerDocument {
                        // A row per document: batch b starts at document b * G.
                        return usize::try_from(b.saturating_mul(g)).unwrap_or(usize::MAX).min(order.len());
                    }
                    let t = b.saturating_mul(cfg.seq_len as u64).saturating_mul(g);
                    let mut at = 0u64;
                    for (k, &d) in order.iter().enumerate() {
                        at += docs.tokens_in(d) + extra;
                        if at > t {
                            return k + 1;
                        }
                    }
                    order.len()
                };
                DocOrder::List(m.order(&cfg.order, epoch, segments, &cut))
            }
            None => {
                let mut sc = SamplerConfig::new(docs.documents(), cfg.order.clone());
                sc.epoch = epoch;
                sc.partition = Partition::single();
                sc.tail = Tail::Drop;
                if matches!(cfg.order, Order::ShardShuffle { .. }) {
                    sc.shards = Some(std::sync::Arc::new(ShardLayout::from_sizes(&docs.shard_sizes())?));
                }
                DocOrder::Sampler(Box::new(Sampler::new(sc)?))
            }
        };
        let n = match &order {
            DocOrder::Sampler(s) => s.len(),
            DocOrder::List(l) => l.len() as u64,
        };
        let stride = n.div_ceil(MAX_CHECKPOINTS).next_power_of_two().max(MIN_STRIDE);
        let mut checkpoints = Vec::with_capacity((n / stride + 1) as usize);
        let mut total = 0u64;
        let docs_in_order: Box<dyn Iterator<Item = u64> + '_> = match &order {
            DocOrder::Sampler(s) => Box::new(s.iter()),
            DocOrder::List(l) => Box::new(l.iter().copied()),
        };
        for (k, doc) in docs_in_order.enumerate() {
            if (k as u64).is_multiple_of(stride) {
                checkpoints.push(total);
            }
            total = total
                .checked_add(docs.tokens_in(doc) + extra)
                .ok_or_else(|| Error::invalid_option(format!("{docs}: more than 2^64 tokens")))?;
        }
        let window = cfg.window() as u64;
        let sequences = match cfg.packing {
            Packing::PerDocument => n,
            // With labels the last token is only a label: no row starts at it.
            Packing::Concat if cfg.pad_tail => total.saturating_sub(u64::from(cfg.labels)).div_ceil(cfg.seq_len as u64),
            Packing::Concat if total >= window => (total - window) / cfg.seq_len as u64 + 1,
            Packing::Concat => 0,
        };
        Ok(EpochPlan { order, extra, stride, checkpoints, total, sequences, cfg: cfg.clone() })
    }

    /// Tokens in the epoch's stream (documents with their BOS and EOS).
    pub(crate) fn total_tokens(&self) -> u64 {
        self.total
    }

    /// The document at epoch position `k`.
    fn doc_at(&self, k: u64) -> u64 {
        match &self.order {
            DocOrder::Sampler(s) => s.get(k).unwrap_or(0),
            DocOrder::List(l) => l.get(k as usize).copied().unwrap_or(0),
        }
    }

    /// The epoch position whose stream range holds token `t` (`t < total`), and where it starts.
    fn position_of(&self, docs: &dyn TokenDocs, t: u64) -> (u64, u64) {
        let c = self.checkpoints.partition_point(|&o| o <= t).saturating_sub(1);
        let (mut k, mut at) = (c as u64 * self.stride, self.checkpoints[c]);
        loop {
            let len = docs.tokens_in(self.doc_at(k)) + self.extra;
            if t < at + len {
                return (k, at);
            }
            at += len;
            k += 1;
        }
    }

    /// The pieces of sequence `s` (`s < sequences`), in order, filling exactly
    /// [`PackConfig::window`] tokens.
    /// The pieces of sequence `s` (`s < sequences`), in order, filling exactly
    /// [`PackConfig::window`] tokens. With a `cursor` (the epoch position and stream offset of a
    /// document at or before the sequence's first token, as the previous sequence of a batch
    /// left it) the walk goes on from there instead of searching; it is left for `s + 1`.
    pub(crate) fn pieces_after(&self, docs: &dyn TokenDocs, s: u64, cursor: &mut Option<(u64, u64)>) -> Vec<Placed> {
        let window = self.cfg.window() as u64;
        let mut out = Vec::new();
        match self.cfg.packing {
            Packing::PerDocument => {
                let doc = self.doc_at(s);
                // Truncated to the window, keeping BOS and EOS (as tokenizers truncate).
                let keep = docs.tokens_in(doc).min(window.saturating_sub(self.extra));
                if self.cfg.bos.is_some() {
                    out.push((Some(s), Piece::Bos));
                }
                if keep > 0 {
                    out.push((Some(s), Piece::Tokens { doc, span: 0..keep }));
                }
                if self.cfg.eos.is_some() && window > u64::from(self.cfg.bos.is_some()) {
                    out.push((Some(s), Piece::Eos));
                }
            }
            Packing::Concat => {
                let mut t = s * self.cfg.seq_len as u64;
                let end = (t + window).min(self.total);
                if t < end {
                    let (mut k, mut at) = match *cursor {
                        Some((k, at)) if at <= t => (k, at),
                        _ => self.position_of(docs, t),
                    };
                    // Documents wholly before `t` (the cursor may lag by a few).
                    loop {
                        let stream = docs.tokens_in(self.doc_at(k)) + self.extra;
                        if t < at + stream {
                            break;
                        }
                        at += stream;
                        k += 1;
                    }
                    while t < end {
                        *cursor = Some((k, at));
                        let doc = self.doc_at(k);
                        let len = docs.tokens_in(doc);
                        let stream = len + self.extra;
                        let span = t - at..(end - at).min(stream);
                        t = at + span.end;
                        self.document(&mut out, k, doc, len, span);
                        at += stream;
                        k += 1;
                    }
                }
            }
        }
        let filled: u64 = out.iter().map(|(_, p)| piece_len(p)).sum();
        if filled < window {
            out.push((None, Piece::Pad(window - filled)));
        }
        out
    }

    /// The pieces of stream positions `span` of a document of `len` tokens (its stream: BOS,
    /// tokens, EOS) at epoch position `k`.
    fn document(&self, out: &mut Vec<Placed>, k: u64, doc: u64, len: u64, span: Range<u64>) {
        let bos = u64::from(self.cfg.bos.is_some());
        if bos == 1 && span.start == 0 && span.end > 0 {
            out.push((Some(k), Piece::Bos));
        }
        let tokens = span.start.saturating_sub(bos).min(len)..span.end.saturating_sub(bos).min(len);
        if !tokens.is_empty() {
            out.push((Some(k), Piece::Tokens { doc, span: tokens }));
        }
        let eos_at = bos + len;
        if self.cfg.eos.is_some() && span.start <= eos_at && eos_at < span.end {
            out.push((Some(k), Piece::Eos));
        }
    }
}

/// Tokens a piece fills.
pub(crate) fn piece_len(p: &Piece) -> u64 {
    match p {
        Piece::Bos | Piece::Eos => 1,
        Piece::Tokens { span, .. } => span.end - span.start,
        Piece::Pad(n) => *n,
    }
}
