//! The driver's side of an epoch read in parts by other processes (Ray read tasks): what it
//! lists once, and where it may cut.

use crate::error::Result;
use crate::source::{names_snapshot, open_and_snapshot};
use crate::uri::SourceOptions;

/// What the driver of a read split among processes needs, from [`list_for_tasks`].
#[derive(Debug)]
pub struct TaskListing {
    /// The source's samples.
    pub samples: usize,
    /// The index of each shard's first sample, in order (`[0]` for a source without shards):
    /// where a split keeps shards whole ([`super::shard_layout`]).
    pub shard_starts: Vec<u64>,
    /// The listing snapshot the processes open from
    /// ([`open_with_listing`](crate::source::open_with_listing)), `None` where opening lists
    /// nothing; [`snapshot_spans`](crate::source::snapshot_spans) cuts it into each process's
    /// part, and each part's reader numbers its samples from its run's start
    /// ([`LoaderConfig::first_index`](super::LoaderConfig::first_index)).
    pub snapshot: Option<Vec<u8>>,
}

/// List `uri` once for a read split among processes that each open it from the snapshot. A
/// local directory of files is listed by name only ([`names_snapshot`]): no file is looked
/// up here, each process looking up its own part's; anything else is opened as
/// [`open_and_snapshot`] opens it.
pub async fn list_for_tasks(uri: &str, options: SourceOptions) -> Result<TaskListing> {
    if let Some((samples, snapshot)) = names_snapshot(uri, options.clone()).await? {
        return Ok(TaskListing { samples, shard_starts: vec![0], snapshot: Some(snapshot) });
    }
    let (src, snapshot) = open_and_snapshot(uri, options).await?;
    let shards = super::shard_layout(&*src)?;
    let shard_starts = (0..shards.num_shards()).filter_map(|s| shards.range(s).map(|r| r.start)).collect();
    Ok(TaskListing { samples: src.len(), shard_starts, snapshot })
}
