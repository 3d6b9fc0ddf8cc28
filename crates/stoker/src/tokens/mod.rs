//! Language-model input: token documents packed into fixed-length training sequences, the
//! same global batches at any world size, resumable exactly.
//!
//! An epoch is the documents in the sampler's order (sequential, shuffled, or by shards),
//! each followed by the configured EOS (and preceded by BOS), joined into one token stream.
//! Sequence `s` is the stream's tokens `[s * seq_len, s * seq_len + window)` where the window
//! is `seq_len`, or `seq_len + 1` with `labels` (consecutive sequences then share one token,
//! as Megatron's GPT samples do, so every token is an input once and a label once). Global
//! batch `k` is sequences `[k * G, (k + 1) * G)` for a global batch of `G` sequences; rank `r`
//! of `w` takes rows `[r * G / w, (r + 1) * G / w)` of it. None of this depends on the world
//! size, and the plan (`tokens::plan`) needs document lengths only, so every rank cuts the same
//! sequences without reading another rank's tokens, and a resume at another world size goes
//! on with the next global batch.
//!
//! A batch has, per row: `input_ids` (`[window]`, int32, int64 or uint16), `position_ids`
//! (`[window]` int32, restarting at 0 where a document starts and at the row's start),
//! `loss_mask` (`[window]` uint8: 0 on padding and, with `mask_boundaries`, on the first
//! token of every document after the row's first, which no token of its own document
//! predicts), and `cu_seqlens` (raw int32: where each segment of the row starts, counted in
//! the flattened `[rows * window]` batch, and in the last row also `rows * window`, so the
//! column's bytes are the offsets flash-attention's varlen functions take). Padding happens
//! only at the epoch's end
//! (`pad_tail`; else the last partial sequence and global batch are dropped), or in
//! one-document-per-sequence mode ([`Packing::PerDocument`]). [`TokenColumns`] leaves out the
//! columns a model does not use (Megatron's GPT defaults and nanoGPT take `input_ids` alone).

mod build;
mod epoch;
mod job;
mod loader;
mod manifest;
mod mix;
pub(crate) mod plan;
mod produce;
mod state;
#[cfg(test)]
mod tests;
mod write;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sampler::{Order, Partition};

pub use crate::decode::TextTokenizer;
pub use epoch::TokenEpoch;
pub use loader::{TextInput, TokenLoader};
pub use manifest::{Part, TokenizedManifest, LISTED_SKIPS, MANIFEST};
pub use mix::{MixPart, SourceDocs, TokenMix};
pub use state::{TokenState, TokenStream};
pub use write::{pack_arrays, pretokenize, tokenized, TokenizeOptions};

/// How documents become sequences.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Packing {
    /// Documents joined into one stream, cut every `seq_len` tokens: no padding but at the
    /// epoch's end (pretraining).
    #[default]
    Concat,
    /// One document per sequence, truncated to the window or padded to it (fine-tuning).
    PerDocument,
}

/// Which columns a token batch carries besides `input_ids` (all of them by default). A
/// column left out is neither computed nor copied: Megatron's GPT defaults and nanoGPT train
/// from `input_ids` alone (positions `0..L` in every row, every token in the loss). Without
/// `loss_mask`, padding (`pad_tail`, one document per row) is not marked: leave it in for
/// those.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenColumns {
    /// `position_ids`, restarting at every document.
    pub position_ids: bool,
    /// `loss_mask` (0 on padding and, with `mask_boundaries`, at document boundaries).
    pub loss_mask: bool,
    /// `cu_seqlens` (and, in Python, `max_seqlen`): the segments for varlen attention.
    pub cu_seqlens: bool,
}

impl Default for TokenColumns {
    fn default() -> Self {
        TokenColumns { position_ids: true, loss_mask: true, cu_seqlens: true }
    }
}

impl TokenColumns {
    /// The column names a batch can carry, `input_ids` first.
    pub const NAMES: [&'static str; 4] = ["input_ids", "position_ids", "loss_mask", "cu_seqlens"];

    /// The columns named in `names` (each of [`NAMES`](Self::NAMES), `input_ids` among them).
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Self> {
        let mut cols = TokenColumns { position_ids: false, loss_mask: false, cu_seqlens: false };
        let mut ids = false;
        for n in names {
            match n.as_ref() {
                "input_ids" => ids = true,
                "position_ids" => cols.position_ids = true,
                "loss_mask" => cols.loss_mask = true,
                "cu_seqlens" => cols.cu_seqlens = true,
                other => {
                    return Err(Error::invalid_option(format!(
                        "no token column {other:?}: the columns are {}",
                        Self::NAMES.join(", ")
                    )))
                }
            }
        }
        if !ids {
            return Err(Error::invalid_option("the token columns must include input_ids"));
        }
        Ok(cols)
    }

    /// The names of the columns carried, `input_ids` first.
    pub fn names(&self) -> Vec<&'static str> {
        let on = [true, self.position_ids, self.loss_mask, self.cu_seqlens];
        Self::NAMES.iter().zip(on).filter(|(_, on)| *on).map(|(n, _)| *n).collect()
    }
}

/// Integer type of `input_ids`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdType {
    /// 32-bit ids (every vocabulary in use fits).
    #[default]
    Int32,
    /// 64-bit ids (what `torch.nn.Embedding` indexes with by default).
    Int64,
    /// 16-bit unsigned ids, for vocabularies of at most 65,536 tokens (GPT-2's, and what
    /// nanoGPT stores): half the bytes of int32 to copy and to move to the GPU, where they
    /// are widened (`.long()`) before the embedding. A uint16 token file's ids are copied
    /// as they are; an id past 65,535 is an error naming its file.
    Uint16,
}

impl IdType {
    /// The type named `name` (`int32`, `int64` or `uint16`, numpy's names).
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "int32" => Ok(IdType::Int32),
            "int64" => Ok(IdType::Int64),
            "uint16" => Ok(IdType::Uint16),
            other => Err(Error::invalid_option(format!(
                "ids dtype {other:?}: choose int32 (the default), int64, or uint16 (vocabularies of at most \
                 65,536 tokens)"
            ))),
        }
    }
}

/// What a [`TokenLoader`] makes of a token source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackConfig {
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Whether rows hold `seq_len + 1` tokens (inputs and shifted labels in one row).
    pub labels: bool,
    /// Sequences per global batch, over all ranks; a multiple of the world size.
    pub global_batch: usize,
    /// This process's rank and the world size (rows of each global batch are split evenly).
    pub partition: Partition,
    /// Document order of each epoch.
    pub order: Order,
    /// Token put before every document, if any.
    pub bos: Option<i64>,
    /// Token put after every document, if any (Megatron's preprocessing usually stored it
    /// already: then leave this unset).
    pub eos: Option<i64>,
    /// Token that fills padding.
    pub pad_id: i64,
    /// Whether the epoch's last partial sequence and global batch are padded (true) or
    /// dropped (false).
    pub pad_tail: bool,
    /// How documents become sequences.
    pub packing: Packing,
    /// Integer type of `input_ids`.
    pub ids: IdType,
    /// Whether `loss_mask` is 0 on a document's first token after another document in the
    /// same row.
    pub mask_boundaries: bool,
    /// Global batches being read at once, ahead of the consumer. Local batches are built in
    /// groups of consecutive batches (up to 2^20 tokens and 64 batches; one batch when it is
    /// larger), at most `max(threads + 1, prefetch / group)` groups ahead, so small batches
    /// are read up to a few million tokens ahead.
    pub prefetch: usize,
    /// The columns besides `input_ids` each batch carries.
    pub columns: TokenColumns,
}

impl PackConfig {
    /// Sequences of `seq_len` tokens, `global_batch` of them per global batch, one rank,
    /// documents in order, no BOS/EOS added, no padding, int32 ids.
    pub fn new(seq_len: usize, global_batch: usize) -> Self {
        PackConfig {
            seq_len,
            labels: false,
            global_batch,
            partition: Partition::single(),
            order: Order::Sequential,
            bos: None,
            eos: None,
            pad_id: 0,
            pad_tail: false,
            packing: Packing::Concat,
            ids: IdType::Int32,
            mask_boundaries: false,
            prefetch: 4,
            columns: TokenColumns::default(),
        }
    }

    /// Tokens per row.
    pub fn window(&self) -> usize {
        // Saturating: a seq_len at usize::MAX is refused by `check`, not an overflow before it.
        self.seq_len.saturating_add(usize::from(self.labels))
    }

    /// Bytes per id of `input_ids`.
    pub(crate) fn ids_width(&self) -> usize {
        match self.ids {
            IdType::Uint16 => 2,
            IdType::Int32 => 4,
            IdType::Int64 => 8,
        }
    }

    /// Rows of each global batch this rank takes.
    pub fn rows(&self) -> usize {
        self.global_batch / self.partition.world_size.max(1) as usize
    }

    /// Refuse a batch so large that the `held` of them the loader keeps at once (read ahead,
    /// being built, with the consumer) would take more than half of `memory` (the machine's
    /// or cgroup's): the first allocation that failed would end the process.
    fn check_memory(&self, held: u64, memory: Option<u64>) -> Result<()> {
        let c = &self.columns;
        let per_token = self.ids_width() + 4 * usize::from(c.position_ids) + usize::from(c.loss_mask);
        let batch = (self.rows() as u64).saturating_mul(self.window() as u64).saturating_mul(per_token as u64);
        match memory {
            Some(m) if batch.saturating_mul(held) > m / 2 => Err(Error::invalid_option(format!(
                "a batch of {} rows of {} tokens takes {batch} bytes, and the loader holds {held} at once (prefetch \
                 {} and those being built): more than half of the {m} bytes of memory here; give a smaller \
                 global_batch, seq_len or prefetch",
                self.rows(),
                self.window(),
                self.prefetch
            ))),
            _ => Ok(()),
        }
    }

    fn check(&self) -> Result<()> {
        let extra = usize::from(self.bos.is_some()) + usize::from(self.eos.is_some());
        if self.seq_len == 0 || self.window() <= extra {
            return Err(Error::invalid_option(format!(
                "seq_len {} leaves no room for a document's tokens beside its BOS/EOS",
                self.seq_len
            )));
        }
        let w = self.partition.world_size;
        if self.global_batch == 0 || !(self.global_batch as u64).is_multiple_of(w) {
            return Err(Error::invalid_option(format!(
                "global_batch {} is not a positive multiple of the world size {w}: every rank takes the same \
                 number of rows of each global batch (choose a global batch that {w} divides)",
                self.global_batch
            )));
        }
        if (self.rows() as u64).saturating_mul(self.window() as u64) > i32::MAX as u64 {
            return Err(Error::invalid_option("a batch of more than 2^31 tokens (cu_seqlens are int32)"));
        }
        crate::loader::check_prefetch(self.prefetch)?;
        let held = produce::Shape::of(self).batches_kept(self.prefetch);
        self.check_memory(held as u64, crate::memory::memory_bytes())?;
        if self.mask_boundaries && !self.columns.loss_mask {
            return Err(Error::invalid_option("mask_boundaries masks loss_mask, which the columns leave out"));
        }
        // Token ids index an embedding: a negative one fails only in the training step (a
        // pad id may be negative: labels are often padded with -100, which losses ignore).
        if let Some(t) = [self.bos, self.eos].into_iter().flatten().find(|&t| t < 0) {
            return Err(Error::invalid_option(format!("a BOS or EOS id of {t}: token ids are 0 or more")));
        }
        let ids = [self.bos, self.eos, Some(self.pad_id)];
        if self.ids == IdType::Int32 && ids.iter().flatten().any(|&t| i32::try_from(t).is_err()) {
            return Err(Error::invalid_option("a BOS, EOS or pad id does not fit int32: ask for int64 ids"));
        }
        // A pad id of -100 (what losses ignore) has no uint16 form: it would wrap to 65,436.
        if self.ids == IdType::Uint16 && ids.iter().flatten().any(|&t| u16::try_from(t).is_err()) {
            return Err(Error::invalid_option(
                "a BOS, EOS or pad id does not fit uint16 ids (0 to 65,535): ask for int32 ids",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[test]
fn a_batch_past_half_the_memory_is_refused_saying_what_to_change() {
    let gib = 1u64 << 30;
    let mut c = PackConfig::new(2048, 64);
    // 64 rows of 2,048 int32 ids, positions and mask bytes: 1.2 MB, six held.
    assert!(c.check_memory(6, Some(gib)).is_ok());
    c.global_batch = 1 << 18;
    let e = c.check_memory(6, Some(16 * gib)).unwrap_err().to_string();
    assert!(e.contains("262144 rows") && e.contains("global_batch") && e.contains("prefetch"), "{e}");
    assert!(c.check_memory(6, None).is_ok(), "memory unknown: nothing refused");
    // The ids alone at uint16: 2 bytes a token, against the default columns' 9.
    c.columns = TokenColumns { position_ids: false, loss_mask: false, cu_seqlens: false };
    c.ids = IdType::Uint16;
    assert!(c.check_memory(6, Some(16 * gib)).is_ok());
}
