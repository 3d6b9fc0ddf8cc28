//! MDS (MosaicML Streaming) and LitData sources: shards written by `MDSWriter` and
//! `litdata.optimize`, local and over S3.

#[allow(unused_imports)]
use crate::common;
