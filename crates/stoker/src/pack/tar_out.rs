//! Writing the tar shards of a plan: several shards at once, each read in chunks while the
//! previous chunk is written, under a temporary name until it is whole and synced.
//!
//! Each shard that lands gets a landing record beside it ([`record_name`], hidden): its size,
//! version, XXH3-128 and its members' XXH3-64s, computed from the bytes as they were written.
//! A resume keeps a shard only if it is still at that version or still hashes as the record
//! says (one changed in place since, at the same size, is written again), and indexes it with
//! the record's checksums: what the index vouches for is what this pack wrote, never bytes
//! read back from the disk later.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use super::plan::{Plan, ShardPlan};
use super::tar_sink::TarSink;
use super::{chunks, fetch, PackOptions, PackProgress, Written};
use crate::error::{Error, Result};
use crate::sample::Field;
use crate::source::DynSampleSource;
use crate::store::Store;

pub(crate) async fn write(
    src: &Arc<DynSampleSource>,
    out: &Store,
    plan: &Plan,
    opts: &PackOptions,
    resume: bool,
    progress: &dyn PackProgress,
    shown: &str,
) -> Result<Written> {
    let mut todo: Vec<&ShardPlan> = Vec::new();
    let mut kept: HashMap<String, Vec<u64>> = HashMap::new();
    // A resume checks the shards there as many at a time as it would write.
    let found: Vec<Option<Vec<u64>>> = match resume {
        true => {
            futures::stream::iter(plan.file.shards.iter().map(|s| landed(out, s)))
                .buffered(opts.jobs.max(1))
                .try_collect()
                .await?
        }
        false => vec![None; plan.file.shards.len()],
    };
    for (s, sums) in plan.file.shards.iter().zip(found) {
        match sums {
            Some(sums) => {
                kept.insert(s.name.clone(), sums);
                progress.advance(s.samples as u64, payload(plan, s));
            }
            None => todo.push(s),
        }
    }
    let resumed = kept.len();
    let written_samples = todo.iter().map(|s| s.samples).sum();
    let field = opts.field.as_deref();
    // Some remote stores take a shard in one PUT (see REMOTE_BYTES_IN_FLIGHT).
    let jobs = match out.is_remote() {
        false => opts.jobs,
        true => opts.jobs.min((super::REMOTE_BYTES_IN_FLIGHT / opts.shard_size.max(1)) as usize),
    };
    let mut sums: HashMap<String, Vec<u64>> = futures::stream::iter(todo.into_iter().map(|s| async move {
        let sums = write_shard(src, out, plan, s, field, progress, shown).await?;
        Ok::<_, Error>((s.name.clone(), sums))
    }))
    .buffer_unordered(jobs.max(1))
    .try_collect()
    .await?;
    sums.extend(kept);
    Ok(Written { bytes: plan.file.shards.iter().map(|s| s.bytes).sum(), resumed, written_samples, sums })
}

fn payload(plan: &Plan, s: &ShardPlan) -> u64 {
    plan.outs[s.first..s.first + s.samples].iter().map(|o| o.payload()).sum()
}

/// What a shard that landed was ([`record_name`]); kept with the pack, so a rerun of a
/// finished pack keeps its shards too.
#[derive(Serialize, Deserialize)]
struct Landed {
    bytes: u64,
    /// The version the store gave the shard once it landed (its entity tag, or time and size:
    /// [`crate::store::version_key`]): one still at it is kept without reading it again.
    version: String,
    /// The whole shard's XXH3-128, as 32 hex digits: what a shard at another version (touched,
    /// copied back, restored) must still hash as to be kept.
    xxh3_128: String,
    /// Each member's payload XXH3-64, in archive order.
    sums: Vec<u64>,
}

/// The landing record of the shard `name`: hidden, beside it.
pub(super) fn record_name(name: &str) -> String {
    format!(".{name}{RECORD_SUFFIX}")
}

const RECORD_SUFFIX: &str = ".landed.json";

/// Whether `name` is a landing record ([`record_name`]).
pub(super) fn is_record_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(RECORD_SUFFIX)
}

/// The member checksums of the shard `s` if an earlier run of this plan landed it and it still
/// holds the bytes it landed with (the same version, or the same hash); `None` if it is to be
/// written (again). A shard without its record (the run died between the two) is written again.
async fn landed(out: &Store, s: &ShardPlan) -> Result<Option<Vec<u64>>> {
    landed_as(out, &s.name, Some(s.bytes)).await
}

/// [`landed`] for the file `name` of `bytes` (any size, if `None`: LMDB's, known once written).
pub(super) async fn landed_as(out: &Store, name: &str, bytes: Option<u64>) -> Result<Option<Vec<u64>>> {
    let Ok(info) = out.head(name).await else { return Ok(None) };
    if bytes.is_some_and(|b| b != info.size) {
        return Ok(None);
    }
    // About 21 bytes of record a member, and every member takes at least a 512-byte header:
    // a record far past that is not this pack's.
    let most = 64 * 1024 + info.size / 512 * 32;
    let record: Landed = match out.get_at_most(&record_name(name), most).await {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(r) => r,
            Err(_) => return Ok(None),
        },
        Err(e) if matches!(e.kind(), crate::ErrorKind::NotFound | crate::ErrorKind::Corrupt) => return Ok(None),
        Err(e) => return Err(e),
    };
    if record.bytes != info.size {
        return Ok(None);
    }
    if record.version == version(&info) {
        return Ok(Some(record.sums));
    }
    let (store, obj) = (out.clone(), info.clone());
    let hash = tokio::task::spawn_blocking(move || super::stream::hash_of(&store, &obj)).await.map_err(Error::task)?;
    Ok((hash.map(hex128).as_deref() == Some(record.xxh3_128.as_str())).then_some(record.sums))
}

/// Record the file `name`, written whole in `out` by other means (LMDB's compacted copy), as
/// landed: read once to hash it, so a rerun keeps it only while it holds those bytes.
pub(super) async fn record_landed(out: &Store, name: &str) -> Result<()> {
    let info = out.head(name).await?;
    let (store, obj) = (out.clone(), info.clone());
    let hash = tokio::task::spawn_blocking(move || super::stream::hash_of(&store, &obj))
        .await
        .map_err(Error::task)?
        .ok_or_else(|| Error::internal(format!("{name}: not read back to hash it")))?;
    let record = Landed { bytes: info.size, version: version(&info), xxh3_128: hex128(hash), sums: Vec::new() };
    write_record(out, name, &record).await
}

/// Write the landing record of `name`, whole.
async fn write_record(out: &Store, name: &str, record: &Landed) -> Result<()> {
    let json = serde_json::to_vec(record).map_err(|e| Error::internal(format!("{name}: {e}")))?;
    out.put_whole(&record_name(name), bytes::Bytes::from(json)).await
}

fn hex128(h: u128) -> String {
    format!("{h:032x}")
}

fn version(info: &crate::store::ObjectInfo) -> String {
    crate::store::version_key(info.e_tag.as_deref(), info.modified_us, info.size)
}

/// Write one shard; returns the XXH3-64 of every member's payload, in archive order.
async fn write_shard(
    src: &Arc<DynSampleSource>,
    out: &Store,
    plan: &Plan,
    s: &ShardPlan,
    field: Option<&str>,
    progress: &dyn PackProgress,
    shown: &str,
) -> Result<Vec<u64>> {
    let outs = &plan.outs[s.first..s.first + s.samples];
    // Members go out as tar::Builder writes them, but nothing is written when the sink is
    // dropped (an error, a cancelled pack): a remote part's send waits on a blocking thread,
    // never on the runtime's.
    let mut sink = TarSink::new(out.writer(&s.name, s.bytes)?, false);
    let mut fetched = futures::stream::iter(chunks(outs).into_iter().map(|r| {
        let part = &outs[r];
        async move { Ok::<_, Error>((part, fetch(&**src, part, field, shown).await?)) }
    }))
    .buffered(2);
    while let Some((part, fields)) = fetched.try_next().await? {
        let keys: Vec<String> = part.iter().map(|o| o.key.clone()).collect();
        let bytes: u64 = part.iter().map(|o| o.payload()).sum();
        let (back, res) = tokio::task::spawn_blocking(move || {
            let r = keys.iter().zip(&fields).try_for_each(|(k, f)| append(&mut sink, k, f));
            (sink, r)
        })
        .await
        .map_err(Error::task)?;
        sink = back;
        res.map_err(|e| out.write_error(&s.name, e))?;
        progress.advance(part.len() as u64, bytes);
    }
    let (writer, sums, _, hash) = tokio::task::spawn_blocking(move || sink.end())
        .await
        .map_err(Error::task)?
        .map_err(|e| out.write_error(&s.name, e))?;
    let len = writer.written();
    if len != s.bytes {
        return Err(Error::internal(format!("{}: wrote {len} bytes, the plan said {}", s.name, s.bytes)));
    }
    writer.finish().await?;
    // After the shard: a record without its shard would vouch for nothing there.
    let info = out.head(&s.name).await?;
    let record = Landed { bytes: len, version: version(&info), xxh3_128: hex128(hash), sums };
    write_record(out, &s.name, &record).await?;
    Ok(record.sums)
}

/// One sample's members, with fixed metadata (mode 0644, owner 0, mtime 0) so the same input
/// always gives the same bytes; the sink records each payload's XXH3-64 (pack has the bytes in
/// hand, so recording them costs no read).
fn append(sink: &mut TarSink, key: &str, fields: &[Field]) -> io::Result<()> {
    for f in fields {
        sink.member(&format!("{key}.{}", f.name), &f.data)?;
    }
    Ok(())
}
