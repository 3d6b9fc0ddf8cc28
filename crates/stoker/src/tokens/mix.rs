//! Mixtures weighted by tokens: several token corpora read as one stream in which each has its
//! weight's share of the tokens, in every window of batches, not just over the epoch.
//!
//! Each source's documents come in their own order (its own permutation per `(seed, epoch,
//! source)` when shuffled). The stream takes, document by document, from the source furthest
//! below its share (least tokens taken over weight, ties to the first), so at any point every
//! source's tokens are within one document of its share. The epoch ends when the source to
//! take from has no document left: its share would otherwise fall behind.
//!
//! **Weights changed at a resume** (a data schedule): the stream up to the next global batch is
//! what it was, the document it is in included, so the batches already delivered stay as they
//! were; from there the documents not yet in the stream are taken in the new proportions (each
//! source's order unchanged, shares counted afresh from that point), and the epoch ends when a
//! source runs out under them. Every change is kept in the state (`changes`), so a later resume
//! rebuilds the same stream.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::sampler::{Order, Permutation};
use crate::source::{TokenBuf, TokenDocs, TokenSlots};
use crate::stats::IoCounters;

/// A mixture's weights over an epoch: each from the global batch it applies to.
pub(crate) type Segments = [(u64, Vec<f64>)];

/// A source of a mixture.
pub struct MixPart {
    /// Its name (in stats).
    pub name: String,
    /// Its documents.
    pub docs: Arc<dyn TokenDocs>,
    /// Its weight: positive; only ratios matter.
    pub weight: f64,
}

/// Token corpora read as one, documents numbered source after source.
pub struct TokenMix {
    parts: Vec<MixPart>,
    starts: Vec<u64>,
}

impl fmt::Debug for TokenMix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.parts.iter().map(|p| (&p.name, p.weight))).finish()
    }
}

impl fmt::Display for TokenMix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.parts.iter().map(|p| format!("{} ({})", p.docs, p.weight)).collect();
        write!(f, "token mix of {}", names.join(", "))
    }
}

impl TokenMix {
    /// A mixture of `parts`; weights must be positive and finite.
    pub fn new(parts: Vec<MixPart>) -> Result<Self> {
        if parts.is_empty() {
            return Err(Error::invalid_option("a token mix needs at least one source"));
        }
        check_weights(&parts.iter().map(|p| p.weight).collect::<Vec<_>>())?;
        let mut starts = vec![0u64];
        for p in &parts {
            starts.push(starts.last().copied().unwrap_or(0) + p.docs.documents());
        }
        Ok(TokenMix { parts, starts })
    }

    /// The sources' names and weights.
    pub fn weights(&self) -> Vec<f64> {
        self.parts.iter().map(|p| p.weight).collect()
    }

    /// The sources' names.
    pub fn names(&self) -> Vec<String> {
        self.parts.iter().map(|p| p.name.clone()).collect()
    }

    /// Which source global document `doc` is from.
    pub fn source_of(&self, doc: u64) -> usize {
        self.starts.partition_point(|&s| s <= doc).saturating_sub(1).min(self.parts.len() - 1)
    }

    fn locate(&self, doc: u64) -> (usize, u64) {
        let k = self.source_of(doc);
        (k, doc - self.starts[k])
    }

    /// The epoch's document order: global document numbers, each source's documents in its own
    /// order, interleaved by token share under `segments` (the weights from batch 0, then each
    /// change: the first global batch it applies to and the new weights); `cut(order, batch)`
    /// gives how many documents of `order` the stream before that global batch reaches into.
    pub(crate) fn order(
        &self,
        order: &Order,
        epoch: u64,
        segments: &Segments,
        cut: &dyn Fn(&[u64], u64) -> usize,
    ) -> Vec<u64> {
        let mut queues: Vec<VecDeque<u64>> = self
            .parts
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let n = p.docs.documents();
                let base = self.starts[k];
                match order {
                    Order::Sequential => (0..n).map(|d| base + d).collect(),
                    Order::Shuffle { seed } | Order::ShardShuffle { seed, .. } => {
                        let perm = Permutation::new(
                            n,
                            seed.wrapping_add((k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                            epoch,
                        );
                        (0..n).map(|d| base + perm.apply(d)).collect()
                    }
                }
            })
            .collect();
        let mut out: Vec<u64> = Vec::new();
        for (i, (_, weights)) in segments.iter().enumerate() {
            // Every document placed (the changes left apply past the epoch's end): each
            // would cost a copy of the order for nothing.
            if queues.iter().all(VecDeque::is_empty) {
                break;
            }
            // A change followed by another at the same batch never applies.
            if segments.get(i + 1).is_some_and(|(next, _)| *next == segments[i].0) {
                continue;
            }
            if let Some((next_batch, _)) = segments.get(i + 1) {
                // Plan this segment whole, keep what the stream reaches before the next
                // change's batch, and put the rest back in its sources' queues.
                let mut trial = out.clone();
                let mut q = queues.clone();
                self.schedule(&mut trial, &mut q, weights);
                let keep = cut(&trial, *next_batch).max(out.len());
                for &d in &trial[out.len()..keep] {
                    let k = self.source_of(d);
                    queues[k].pop_front();
                }
                out.truncate(out.len());
                out.extend_from_slice(&trial[out.len()..keep]);
            } else {
                self.schedule(&mut out, &mut queues, weights);
            }
        }
        out
    }

    /// Take documents from `queues` into `out` by token share until the source to take from
    /// is empty.
    fn schedule(&self, out: &mut Vec<u64>, queues: &mut [VecDeque<u64>], weights: &[f64]) {
        // Only ratios matter (see `scaled_weights`): tiny weights (1e-320 each) divided every
        // count to infinity and tied, draining the first source alone.
        let weights = crate::sampler::mix::scaled_weights(weights);
        let mut taken = vec![0u64; self.parts.len()];
        loop {
            let k = (0..self.parts.len())
                .min_by(|&a, &b| (taken[a] as f64 / weights[a]).total_cmp(&(taken[b] as f64 / weights[b])))
                .unwrap_or(0);
            let Some(doc) = queues[k].pop_front() else { return };
            let (_, local) = self.locate(doc);
            taken[k] += self.parts[k].docs.tokens_in(local).max(1);
            out.push(doc);
        }
    }
}

/// A document and a span of its tokens.
type Span = (u64, Range<u64>);

impl TokenMix {
    /// Runs of `pieces` from one source, in order, each with its source and the pieces in
    /// that source's own document numbers (one read call per run).
    fn runs(&self, pieces: &[Span]) -> Vec<(usize, Vec<Span>)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < pieces.len() {
            let k = self.source_of(pieces[at].0);
            let mut end = at + 1;
            while end < pieces.len() && self.source_of(pieces[end].0) == k {
                end += 1;
            }
            out.push((k, pieces[at..end].iter().map(|(d, r)| (d - self.starts[k], r.clone())).collect()));
            at = end;
        }
        out
    }
}

/// The most weight changes an epoch may carry (each costs a pass over the epoch's documents
/// when it is planned): far more than any data schedule makes, and few enough that a saved
/// state cannot make planning run for hours.
pub(crate) const MAX_WEIGHT_CHANGES: usize = 1000;

/// What is said of `n` weight changes in one epoch, more than [`MAX_WEIGHT_CHANGES`].
pub(crate) fn too_many_changes(n: usize) -> String {
    format!(
        "{n} weight changes in one epoch, more than {MAX_WEIGHT_CHANGES}: a data schedule changes weights at a resume \
         or an epoch's start, not at every batch"
    )
}

/// Weights must be positive and finite.
pub(crate) fn check_weights(w: &[f64]) -> Result<()> {
    if let Some(bad) = w.iter().find(|x| !x.is_finite() || **x <= 0.0) {
        return Err(Error::invalid_option(format!("mix weights must be positive and finite, not {bad}")));
    }
    Ok(())
}

#[async_trait]
impl TokenDocs for TokenMix {
    fn documents(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    fn tokens_in(&self, doc: u64) -> u64 {
        let (k, local) = self.locate(doc);
        self.parts[k].docs.tokens_in(local)
    }

    fn prefetch_len(&self, doc: u64) {
        let (k, local) = self.locate(doc);
        self.parts[k].docs.prefetch_len(local);
    }

    fn shard_sizes(&self) -> Vec<u64> {
        self.parts.iter().flat_map(|p| p.docs.shard_sizes()).collect()
    }

    async fn read_into(&self, pieces: &[(u64, Range<u64>)], out: &mut TokenBuf) -> Result<()> {
        for (k, local) in self.runs(pieces) {
            self.parts[k].docs.read_into(&local, out).await?;
        }
        Ok(())
    }

    fn reads_in_place(&self) -> bool {
        self.parts.iter().all(|p| p.docs.reads_in_place())
    }

    fn read_now(&self, pieces: &[(u64, Range<u64>)], out: &mut TokenSlots<'_>) -> Result<()> {
        for (k, local) in self.runs(pieces) {
            out.next_run();
            self.parts[k].docs.read_now(&local, out)?;
        }
        Ok(())
    }

    fn io_counters(&self) -> Option<IoCounters> {
        self.parts.iter().filter_map(|p| p.docs.io_counters()).reduce(|mut a, b| {
            a.requests += b.requests;
            a.bytes += b.bytes;
            a.remote_requests += b.remote_requests;
            a.remote_bytes += b.remote_bytes;
            a
        })
    }
}

/// A source's token documents as an owned [`TokenDocs`] (what a mixture holds).
pub struct SourceDocs(pub Arc<crate::source::DynSampleSource>);

impl fmt::Debug for SourceDocs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SourceDocs({})", self.0)
    }
}

impl fmt::Display for SourceDocs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl SourceDocs {
    /// `source`'s documents, if it holds tokens.
    pub fn new(source: Arc<crate::source::DynSampleSource>) -> Result<Self> {
        if source.as_tokens().is_none() {
            return Err(Error::invalid_option(format!(
                "{source} ({} layout) holds no token documents: packing reads tokenized corpora (layout=tokens: \
                 Megatron .bin/.idx), or text with a tokenizer",
                source.info().layout
            )));
        }
        Ok(SourceDocs(source))
    }

    fn docs(&self) -> &dyn TokenDocs {
        self.0.as_tokens().expect("checked when made")
    }
}

#[async_trait]
impl TokenDocs for SourceDocs {
    fn documents(&self) -> u64 {
        self.docs().documents()
    }

    fn tokens_in(&self, doc: u64) -> u64 {
        self.docs().tokens_in(doc)
    }

    fn prefetch_len(&self, doc: u64) {
        self.docs().prefetch_len(doc);
    }

    fn shard_sizes(&self) -> Vec<u64> {
        self.docs().shard_sizes()
    }

    async fn read_into(&self, pieces: &[(u64, Range<u64>)], out: &mut TokenBuf) -> Result<()> {
        self.docs().read_into(pieces, out).await
    }

    fn reads_in_place(&self) -> bool {
        self.docs().reads_in_place()
    }

    fn read_now(&self, pieces: &[(u64, Range<u64>)], out: &mut TokenSlots<'_>) -> Result<()> {
        self.docs().read_now(pieces, out)
    }

    fn io_counters(&self) -> Option<IoCounters> {
        self.0.io_counters()
    }
}
