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
/// (16 MiB): 4 up to 8 million documents, 128 for 256 million.
const MIN_STRIDE: u64 = 4;
const MAX_CHECKPOINTS: u64 = 1 << 21;

/// The documents of an epoch in order: a sampler's (one source), or a list (a mixture).
enum DocOrder {
    Sampler(Box<Sampler>),
    List(Vec<u64>),
}

/// Where the previous row of a batch ended: the epoch position `k` of a document at or before
/// the next row's first token, where its stream starts, and the document itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cursor {
    k: u64,
    at: u64,
    doc: u64,
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
    /// A sampler's order written out, for corpora of at most [`KEEP_ORDER`] documents: the
    /// pass over the lengths computes every position's document anyway, and a batch then
    /// looks each up in this array instead of taking a permutation step (which was a tenth
    /// of a producer's time).
    kept: Option<Vec<u32>>,
    /// With `kept`, each position's document length ([`LONG`] for one of `u32::MAX` tokens
    /// or more, looked up instead): a batch's rows walk positions in order, so their lengths
    /// are read in order too, not looked up at random in the sources' indexes (which was
    /// the largest cost of planning a batch after the permutation).
    kept_lens: Option<Vec<u32>>,
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
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get()).min(PLAN_THREADS) as u64;
        let keep = matches!(order, DocOrder::Sampler(_)) && n <= KEEP_ORDER;
        let Pass { checkpoints, total, kept, kept_lens } =
            checkpoints(docs, &order, n, stride, extra, (n / PLAN_CHUNK).clamp(1, cores), keep)?;
        let window = cfg.window() as u64;
        let sequences = match cfg.packing {
            Packing::PerDocument => n,
            // With labels the last token is only a label: no row starts at it.
            Packing::Concat if cfg.pad_tail => total.saturating_sub(u64::from(cfg.labels)).div_ceil(cfg.seq_len as u64),
            Packing::Concat if total >= window => (total - window) / cfg.seq_len as u64 + 1,
            Packing::Concat => 0,
        };
        Ok(EpochPlan { order, kept, kept_lens, extra, stride, checkpoints, total, sequences, cfg: cfg.clone() })
    }

    /// Tokens in the epoch's stream (documents with their BOS and EOS).
    pub(crate) fn total_tokens(&self) -> u64 {
        self.total
    }

    /// The document at epoch position `k`.
    fn doc_at(&self, k: u64) -> u64 {
        if let Some(kept) = &self.kept {
            return kept.get(k as usize).map_or(0, |&d| u64::from(d));
        }
        match &self.order {
            DocOrder::Sampler(s) => s.get(k).unwrap_or(0),
            DocOrder::List(l) => l.get(k as usize).copied().unwrap_or(0),
        }
    }

    /// The length of `doc`, the document at epoch position `k`: kept, or from `docs`.
    #[inline]
    fn len_at(&self, docs: &dyn TokenDocs, k: u64, doc: u64) -> u64 {
        match self.kept_lens.as_ref().and_then(|l| l.get(k as usize)) {
            Some(&len) if len != LONG => u64::from(len),
            _ => docs.tokens_in(doc),
        }
    }

    /// The epoch position whose stream range holds token `t` (`t < total`), and where it starts.
    fn position_of(&self, docs: &dyn TokenDocs, t: u64) -> (u64, u64) {
        let c = self.checkpoints.partition_point(|&o| o <= t).saturating_sub(1);
        let (mut k, mut at) = (c as u64 * self.stride, self.checkpoints[c]);
        loop {
            let len = self.len_at(docs, k, self.doc_at(k)) + self.extra;
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
    pub(crate) fn pieces_after(&self, docs: &dyn TokenDocs, s: u64, cursor: &mut Option<Cursor>) -> Vec<Placed> {
        let window = self.cfg.window() as u64;
        let mut out = Vec::new();
        match self.cfg.packing {
            Packing::PerDocument => {
                let doc = self.doc_at(s);
                // Truncated to the window, keeping BOS and EOS (as tokenizers truncate).
                let keep = self.len_at(docs, s, doc).min(window.saturating_sub(self.extra));
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
                    // Each epoch position's document is looked up once (a permutation step
                    // when shuffled: the largest cost of planning a batch): the cursor
                    // carries the one a row ends in to the next row.
                    let Cursor { mut k, mut at, mut doc } = match *cursor {
                        Some(c) if c.at <= t => c,
                        _ => {
                            let (k, at) = self.position_of(docs, t);
                            Cursor { k, at, doc: self.doc_at(k) }
                        }
                    };
                    // Documents wholly before `t` (the cursor may lag by a few).
                    loop {
                        let stream = self.len_at(docs, k, doc) + self.extra;
                        if t < at + stream {
                            break;
                        }
                        at += stream;
                        k += 1;
                        doc = self.doc_at(k);
                    }
                    loop {
                        *cursor = Some(Cursor { k, at, doc });
                        let len = self.len_at(docs, k, doc);
                        let stream = len + self.extra;
                        let span = t - at..(end - at).min(stream);
                        t = at + span.end;
                        self.document(&mut out, k, doc, len, span);
                        if t >= end {
                            break;
                        }
                        at += stream;
                        k += 1;
                        doc = self.doc_at(k);
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

/// Below this many documents per thread, the plan's pass is not split (a thread costs more than
/// it saves).
const PLAN_CHUNK: u64 = 16 * 1024;
/// At most this many threads split the pass (every rank of a node plans its own epochs).
const PLAN_THREADS: usize = 8;

/// Sampler orders of at most this many documents are kept written out ([`EpochPlan`]'s `kept`):
/// 16 MiB of `u32`s, as much as the checkpoints may take.
const KEEP_ORDER: u64 = 1 << 22;

/// A kept length that does not fit: the document's length is looked up instead.
const LONG: u32 = u32::MAX;

/// Documents whose lengths a plan's pass asks for before reading the first of them.
const LOOKAHEAD: usize = 32;

/// What the pass over an epoch's documents finds.
struct Pass {
    /// Every `stride`th document's first token offset in the stream.
    checkpoints: Vec<u64>,
    /// The stream's length.
    total: u64,
    /// The documents in order, when asked to keep them.
    kept: Option<Vec<u32>>,
    /// Their lengths, when kept ([`LONG`] for one that does not fit).
    kept_lens: Option<Vec<u32>>,
}

/// Every `stride`th document's first token offset in the stream of the `n` documents of
/// `order`, the stream's length, and with `keep` the documents in order. A pass over every
/// document's length (and, shuffled, a permutation step each: ~40 ns a document, 4 s an epoch
/// for 100 million), so it is split over `threads` threads: each sums a run of documents that
/// starts at a multiple of `stride`, then the runs' offsets are added up.
fn checkpoints(
    docs: &dyn TokenDocs,
    order: &DocOrder,
    n: u64,
    stride: u64,
    extra: u64,
    threads: u64,
    keep: bool,
) -> Result<Pass> {
    let too_many = || Error::invalid_option(format!("{docs}: more than 2^64 tokens"));
    let run = |lo: u64, hi: u64| -> Result<Pass> {
        let in_order: Box<dyn Iterator<Item = u64> + '_> = match order {
            DocOrder::Sampler(s) => Box::new(s.iter().skip(lo as usize).take((hi - lo) as usize)),
            DocOrder::List(l) => Box::new(l[lo as usize..hi as usize].iter().copied()),
        };
        let mut cps = Vec::with_capacity((hi - lo).div_ceil(stride) as usize);
        let mut kept = keep.then(|| Vec::with_capacity((hi - lo) as usize));
        let mut kept_lens = keep.then(|| Vec::with_capacity((hi - lo) as usize));
        let mut total = 0u64;
        // Documents taken a run at a time, their lengths asked for first (see
        // `TokenDocs::prefetch_len`): in shuffled order each is a miss at a random place of
        // the index, and a run's misses overlap.
        let mut run_of = [0u64; LOOKAHEAD];
        let mut in_order = in_order.peekable();
        let mut i = 0u64;
        while in_order.peek().is_some() {
            let mut got = 0;
            for (slot, doc) in run_of.iter_mut().zip(in_order.by_ref()) {
                docs.prefetch_len(doc);
                *slot = doc;
                got += 1;
            }
            for &doc in &run_of[..got] {
                if i.is_multiple_of(stride) {
                    cps.push(total);
                }
                i += 1;
                let len = docs.tokens_in(doc);
                if let (Some(k), Some(l)) = (&mut kept, &mut kept_lens) {
                    // Below KEEP_ORDER documents, every document number fits.
                    k.push(doc as u32);
                    l.push(u32::try_from(len).ok().filter(|&l| l != LONG).unwrap_or(LONG));
                }
                total = total.checked_add(len + extra).ok_or_else(too_many)?;
            }
        }
        Ok(Pass { checkpoints: cps, total, kept, kept_lens })
    };
    if threads <= 1 {
        return run(0, n);
    }
    let chunk = n.div_ceil(threads).div_ceil(stride) * stride;
    let bounds: Vec<(u64, u64)> =
        (0..threads).map(|t| (t * chunk, ((t + 1) * chunk).min(n))).filter(|(lo, hi)| lo < hi).collect();
    let runs: Vec<Result<Pass>> = std::thread::scope(|sc| {
        // A run whose thread cannot be started (a pids limit) is summed here instead.
        let started: Vec<_> = bounds
            .iter()
            .map(|&(lo, hi)| std::thread::Builder::new().spawn_scoped(sc, move || run(lo, hi)).map_err(|_| (lo, hi)))
            .collect();
        started
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|p| {
                    Err(Error::internal(format!("planning an epoch: {}", crate::error::panic_message(p))))
                }),
                Err((lo, hi)) => run(lo, hi),
            })
            .collect()
    });
    let mut all = Pass {
        checkpoints: Vec::with_capacity((n / stride + 1) as usize),
        total: 0,
        kept: keep.then(|| Vec::with_capacity(n as usize)),
        kept_lens: keep.then(|| Vec::with_capacity(n as usize)),
    };
    for r in runs {
        let run = r?;
        let base = all.total;
        all.total = all.total.checked_add(run.total).ok_or_else(too_many)?;
        // Each offset is at most its run's sum, so none passes the total just checked.
        all.checkpoints.extend(run.checkpoints.into_iter().map(|c| c + base));
        if let (Some(k), Some(more)) = (&mut all.kept, run.kept) {
            k.extend(more);
        }
        if let (Some(l), Some(more)) = (&mut all.kept_lens, run.kept_lens) {
            l.extend(more);
        }
    }
    Ok(all)
}

/// Tokens a piece fills.
pub(crate) fn piece_len(p: &Piece) -> u64 {
    match p {
        Piece::Bos | Piece::Eos => 1,
        Piece::Tokens { span, .. } => span.end - span.start,
        Piece::Pad(n) => *n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::TokenBuf;
    use crate::store::IoCounters;

    /// Document lengths only (the plan reads nothing else): `lens[d]` tokens in document `d`,
    /// in shards of `shard` documents.
    #[derive(Debug)]
    struct Lengths {
        lens: Vec<u64>,
        shard: u64,
    }

    impl std::fmt::Display for Lengths {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{} documents", self.lens.len())
        }
    }

    #[async_trait::async_trait]
    impl TokenDocs for Lengths {
        fn documents(&self) -> u64 {
            self.lens.len() as u64
        }
        fn tokens_in(&self, doc: u64) -> u64 {
            self.lens[doc as usize]
        }
        fn shard_sizes(&self) -> Vec<u64> {
            let n = self.lens.len() as u64;
            (0..n.div_ceil(self.shard)).map(|s| self.shard.min(n - s * self.shard)).collect()
        }
        async fn read_into(&self, _: &[(u64, Range<u64>)], _: &mut TokenBuf) -> Result<()> {
            unreachable!("planning reads no token")
        }
        fn io_counters(&self) -> Option<IoCounters> {
            None
        }
    }

    /// The pass split over threads gives the offsets and total of one pass in order, for
    /// every order (a shard shuffle's iterator skipped into the middle included), and a
    /// corpus large enough to be split whatever the cores.
    #[test]
    fn the_split_pass_over_document_lengths_equals_one_pass_in_order() {
        let n = 5 * PLAN_CHUNK + 123;
        let docs = Lengths { lens: (0..n).map(|d| (d * 7919) % 3001).collect(), shard: 1000 };
        let orders = [Order::Sequential, Order::Shuffle { seed: 3 }, Order::ShardShuffle { seed: 5, window: 4 }];
        for order in orders {
            let mut cfg = PackConfig::new(2048, 8);
            cfg.order = order.clone();
            cfg.eos = Some(0);
            let plan = EpochPlan::new(&docs, &cfg, 2, None).unwrap();
            let DocOrder::Sampler(s) = &plan.order else { panic!("one source plans by its sampler") };
            let (mut want, mut total, mut order_want) = (Vec::new(), 0u64, Vec::new());
            for (k, d) in s.iter().enumerate() {
                if (k as u64).is_multiple_of(plan.stride) {
                    want.push(total);
                }
                total += docs.tokens_in(d) + 1;
                order_want.push(d as u32);
            }
            assert_eq!((plan.checkpoints.len(), plan.total), (want.len(), total), "{order:?}");
            assert!(plan.checkpoints == want, "{order:?}");
            assert!(plan.kept.as_ref() == Some(&order_want), "{order:?}: the order is kept");
            let lens_want: Vec<u32> = order_want.iter().map(|&d| docs.lens[d as usize] as u32).collect();
            assert!(plan.kept_lens.as_ref() == Some(&lens_want), "{order:?}: and its lengths");
            assert!((0..n).all(|k| plan.doc_at(k) == s.get(k).unwrap()), "{order:?}");
            // Split over any number of threads, whatever this machine's cores: the same.
            for threads in [1, 2, 3, 7] {
                for keep in [false, true] {
                    let got = checkpoints(&docs, &plan.order, s.len(), plan.stride, 1, threads, keep).unwrap();
                    assert!(got.checkpoints == want && got.total == total, "{order:?}, {threads} threads");
                    assert_eq!(got.kept.is_some(), keep);
                    assert!(got.kept.is_none_or(|k| k == order_want), "{order:?}, {threads} threads");
                    assert!(got.kept_lens.is_none_or(|l| l == lens_want), "{order:?}, {threads} threads");
                }
            }
        }
    }

    /// A document too long for a kept length is looked up instead, and every row is cut as
    /// from the sources' own lengths.
    #[test]
    fn a_length_past_u32_is_looked_up_and_rows_are_cut_the_same() {
        let mut lens: Vec<u64> = (0..3000u64).map(|d| 1 + (d * 7919) % 3001).collect();
        lens[1234] = u64::from(u32::MAX) + 5;
        let docs = Lengths { lens, shard: 100 };
        let mut cfg = PackConfig::new(2048, 4);
        cfg.order = Order::Shuffle { seed: 9 };
        cfg.eos = Some(0);
        let plan = EpochPlan::new(&docs, &cfg, 1, None).unwrap();
        let kept = plan.kept_lens.as_ref().expect("a small corpus keeps its lengths");
        for k in 0..docs.documents() {
            let doc = plan.doc_at(k);
            let want = if doc == 1234 { LONG } else { docs.lens[doc as usize] as u32 };
            assert_eq!(kept[k as usize], want, "position {k}");
            assert_eq!(plan.len_at(&docs, k, doc), docs.lens[doc as usize], "position {k}");
        }
        // The same rows as a plan that keeps nothing (every length looked up).
        let mut bare = EpochPlan::new(&docs, &cfg, 1, None).unwrap();
        bare.kept_lens = None;
        let (mut a, mut b) = (None, None);
        for s in (0..plan.sequences).step_by(997).chain([plan.sequences - 1]) {
            assert_eq!(plan.pieces_after(&docs, s, &mut a), bare.pieces_after(&docs, s, &mut b), "sequence {s}");
        }
    }
}
