//! Why samples were lost, as the skip policy and damage reports count it (here, beside the
//! errors it sorts; `crate::stats` re-exports it).

use serde::{Deserialize, Serialize};

/// Why samples were lost: a read that failed (counted in [`SkippedByCause`](crate::stats::SkippedByCause)) or damage found
/// when a shard was opened (a [`Damage`](crate::stats::Damage) entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DamageCause {
    /// A tar header that does not verify, or one other than the index recorded.
    DamagedHeader = 0,
    /// Payload bytes that do not match their recorded checksum.
    ChecksumMismatch = 1,
    /// A shard or object that is missing, unreadable, not a tar at all, or changed since the
    /// source was opened.
    UnreadableShard = 2,
    /// A remote read that still failed after every retry.
    RemoteError = 3,
    /// The shard ends early (cut inside a member, or without its end-of-archive marker).
    Truncated = 4,
    /// Anything else (a sample that fails to decode, ...).
    Other = 5,
}
