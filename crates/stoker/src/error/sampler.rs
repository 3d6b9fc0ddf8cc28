//! Why a sampler could not be built.

use std::fmt;

/// Result alias for sampler operations.
pub type SamplerResult<T> = Result<T, SamplerError>;

/// Why a sampler could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SamplerError {
    /// `world_size` is 0, or `rank` is not below it.
    InvalidRank {
        /// The requested rank.
        rank: u64,
        /// The requested world size.
        world_size: u64,
    },
    /// The loader-worker count is 0, or the worker id is not below it.
    InvalidWorker {
        /// The requested worker id.
        worker: u64,
        /// The requested worker count.
        num_workers: u64,
    },
    /// [`Order::ShardShuffle`](crate::sampler::Order::ShardShuffle) had `window == 0`.
    ZeroWindow,
    /// [`Order::ShardShuffle`](crate::sampler::Order::ShardShuffle) needs a
    /// [`ShardLayout`](crate::sampler::ShardLayout) covering exactly `n` samples;
    /// `shard_total` is `None` when no layout was given.
    InvalidShardLayout {
        /// The configured sample count.
        n: u64,
        /// The number of samples the layout covers, if there is one.
        shard_total: Option<u64>,
    },
    /// A [`SamplerState`](crate::sampler::SamplerState) saved for another dataset size was restored.
    StateMismatch {
        /// The sample count recorded in the state.
        state_n: u64,
        /// The sample count of the configuration restoring it.
        n: u64,
    },
    /// A launcher environment variable is unparsable or inconsistent.
    Env {
        /// The variable at fault.
        var: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// Sample positions (total shard size, or `n` plus padding) exceed `u64`.
    Overflow,
    /// A mix's weights, sizes or epoch length cannot make a plan, or an order cannot apply to it.
    Mix {
        /// What is wrong and what to do.
        reason: String,
    },
    /// A span of positions that is empty of meaning: reversed, or past the epoch's end.
    InvalidSpan {
        /// The requested span's start.
        start: u64,
        /// The requested span's end.
        end: u64,
        /// The epoch's length.
        n: u64,
    },
    /// A [`SamplerState`](crate::sampler::SamplerState) saved for another mix (or for no mix) was restored.
    MixMismatch {
        /// Whether the state was saved from a mix.
        state_is_mix: bool,
        /// Whether the configuration restoring it is a mix.
        is_mix: bool,
    },
}

impl fmt::Display for SamplerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidRank { world_size: 0, .. } => write!(f, "world_size must be at least 1"),
            Self::InvalidRank { rank, world_size } => {
                write!(f, "rank {rank} is not below world_size {world_size}")
            }
            Self::InvalidWorker { num_workers: 0, .. } => {
                write!(f, "num_workers must be at least 1")
            }
            Self::InvalidWorker { worker, num_workers } => {
                write!(f, "worker {worker} is not below num_workers {num_workers}")
            }
            Self::ZeroWindow => write!(f, "shard_shuffle window must be at least 1 shard"),
            Self::InvalidShardLayout { shard_total: None, .. } => {
                write!(f, "order shard_shuffle needs a shard layout, but none was given")
            }
            Self::InvalidShardLayout { n, shard_total: Some(t) } => {
                write!(f, "the shard layout covers {t} samples but n is {n}")
            }
            Self::StateMismatch { state_n, n } => {
                write!(f, "sampler state is for {state_n} samples but n is {n}")
            }
            Self::Env { var, message } => write!(f, "environment variable {var}: {message}"),
            Self::Overflow => write!(f, "sample positions overflow u64 (n is too large)"),
            Self::Mix { reason } => write!(f, "mix: {reason}"),
            Self::InvalidSpan { start, end, n } => {
                write!(f, "span {start}..{end} is not a part of an epoch of {n} samples (0 <= start <= end <= {n})")
            }
            Self::MixMismatch { state_is_mix: true, is_mix: true } => write!(
                f,
                "the saved state is for another mix (its sources' sizes, weights, epoch length or replacement \
                 differ); restore it with the mix it was saved from, or start the epoch afresh"
            ),
            Self::MixMismatch { state_is_mix, .. } => write!(
                f,
                "the saved state is {} a mix but this source is {}",
                if *state_is_mix { "for" } else { "not for" },
                if *state_is_mix { "not" } else { "one" }
            ),
        }
    }
}

impl std::error::Error for SamplerError {}
