//! Where a token run stands ([`TokenState`], what a resume needs) and what it is checked
//! against: the stream's settings ([`TokenStream`]) and the documents' tokens in all.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::PackConfig;
use crate::source::TokenDocs;

/// Where a token run stands: the next global batch of an epoch. The same at every rank and
/// world size, so a job restarted on another number of ranks resumes from it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TokenState {
    /// The epoch in progress.
    pub epoch: u64,
    /// Global batches of it already delivered.
    pub batch: u64,
    /// Documents in the source, to catch a changed dataset on restore.
    pub documents: u64,
    /// Tokens per sequence and sequences per global batch, which define the global batches.
    pub seq_len: usize,
    /// Sequences per global batch.
    pub global_batch: usize,
    /// For a mixture: the weights in force over this epoch, each from the global batch it
    /// applies to (the first from batch 0); empty otherwise.
    #[serde(default)]
    pub weights: Vec<(u64, Vec<f64>)>,
    /// What orders and cuts the token stream besides `seq_len`: a resume under other settings
    /// would continue at the same batch number of another stream. Absent in states of earlier
    /// versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<TokenStream>,
    /// Tokens in the documents (every source's, without BOS or EOS), once an epoch has
    /// started: other data with as many documents (a corpus tokenized again) is caught by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// For a mixture: its sources' names, in order (the weights are per source, by place).
    /// Absent in earlier versions' states, which are taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<Vec<String>>,
}

/// The documents' tokens in all: counted on a thread of its own, taken from it once.
pub(super) struct DataTokens {
    counting: Option<std::thread::JoinHandle<u64>>,
    counted: u64,
}

impl DataTokens {
    /// Start counting `docs`' tokens on a thread of its own (here, when none can be started).
    pub(super) fn start(docs: &Arc<dyn TokenDocs>) -> Self {
        let d = docs.clone();
        match std::thread::Builder::new().name("stoker-count".into()).spawn(move || count_tokens(&*d)) {
            Ok(h) => DataTokens { counting: Some(h), counted: 0 },
            Err(_) => DataTokens { counting: None, counted: count_tokens(&**docs) },
        }
    }

    /// The count, waiting for the thread the first time (counted here if it failed).
    pub(super) fn get(&mut self, docs: &dyn TokenDocs) -> u64 {
        if let Some(h) = self.counting.take() {
            self.counted = h.join().unwrap_or_else(|_| count_tokens(docs));
        }
        self.counted
    }
}

/// Tokens in all of `docs`' documents.
pub(super) fn count_tokens(docs: &dyn TokenDocs) -> u64 {
    (0..docs.documents()).fold(0u64, |n, d| n.saturating_add(docs.tokens_in(d)))
}

/// What orders and cuts a token stream besides `seq_len` ([`TokenState::stream`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TokenStream {
    /// The document order.
    pub order: crate::sampler::Order,
    /// The token before every document.
    #[serde(default)]
    pub bos: Option<i64>,
    /// The token after every document.
    #[serde(default)]
    pub eos: Option<i64>,
    /// How documents become rows.
    #[serde(default)]
    pub packing: super::Packing,
    /// Rows of `seq_len + 1` tokens.
    #[serde(default)]
    pub labels: bool,
}

impl TokenStream {
    /// `cfg`'s stream.
    pub fn of(cfg: &PackConfig) -> Self {
        TokenStream { order: cfg.order.clone(), bos: cfg.bos, eos: cfg.eos, packing: cfg.packing, labels: cfg.labels }
    }
}

impl std::fmt::Display for TokenStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::sampler::Order;
        match &self.order {
            Order::Sequential => f.write_str("in order")?,
            Order::Shuffle { seed } => write!(f, "shuffled with seed {seed}")?,
            Order::ShardShuffle { seed, window } => {
                write!(f, "shard-shuffled with seed {seed} in windows of {window}")?
            }
        }
        let id = |name: &str, t: Option<i64>| t.map_or(format!("no {name}"), |t| format!("{name} {t}"));
        let packing = match self.packing {
            super::Packing::Concat => "documents joined",
            super::Packing::PerDocument => "a document a row",
        };
        let labels = if self.labels { "labels" } else { "no labels" };
        write!(f, ", {}, {}, {packing}, {labels}", id("BOS", self.bos), id("EOS", self.eos))
    }
}
