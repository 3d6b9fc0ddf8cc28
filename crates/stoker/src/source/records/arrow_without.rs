//! LitData's Arrow-footer chunks in a build without the `parquet` feature (which brings the
//! Arrow IPC reader): such a chunk is refused with an error naming the feature; every other
//! chunk reads as in a full build.

use std::ops::Range;

use super::Inner;
use crate::error::Result;
use crate::sample::Sample;

/// No Arrow-footer chunk is indexed in this build: the type has no values.
#[derive(Debug)]
pub(super) enum ArrowIndex {}

impl Inner {
    /// Refused: the chunk at `shard` is an Arrow-footer chunk (its trailer says so), which
    /// this build cannot read.
    pub(super) async fn arrow_index(&self, shard: usize, _: Range<u64>) -> Result<ArrowIndex> {
        let shown = format!("{} (chunk {})", self.display, self.shards[shard].path);
        Err(crate::error::Error::without_feature(&shown, "LitData's Arrow-table chunks", "parquet"))
    }

    /// Never called: no [`ArrowIndex`] exists in this build.
    pub(super) async fn arrow_samples(&self, _: usize, index: &ArrowIndex, _: &[usize]) -> Result<Vec<Sample>> {
        match *index {}
    }
}
