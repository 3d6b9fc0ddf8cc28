//! Writing the tar shards of a plan: several shards at once, each read in chunks while the
//! previous chunk is written, under a temporary name until it is whole and synced.

use std::io::{self, Write};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use super::plan::{Plan, ShardPlan};
use super::{chunks, fetch, PackOptions, PackProgress, Written};
use crate::error::{Error, Result};
use crate::sample::Field;
use crate::source::DynSampleSource;
use crate::store::{ObjectWriter, Store};

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
    let mut resumed = 0;
    for s in &plan.file.shards {
        if resume && is_complete(out, s).await? {
            resumed += 1;
            progress.advance(s.samples as u64, payload(plan, s));
        } else {
            todo.push(s);
        }
    }
    let written_samples = todo.iter().map(|s| s.samples).sum();
    let field = opts.field.as_deref();
    // Some remote stores take a shard in one PUT (see REMOTE_BYTES_IN_FLIGHT).
    let jobs = match out.is_remote() {
        false => opts.jobs,
        true => opts.jobs.min((super::REMOTE_BYTES_IN_FLIGHT / opts.shard_size.max(1)) as usize),
    };
    let sums = futures::stream::iter(todo.into_iter().map(|s| async move {
        let sums = write_shard(src, out, plan, s, field, progress, shown).await?;
        Ok::<_, Error>((s.name.clone(), sums))
    }))
    .buffer_unordered(jobs.max(1))
    .try_collect()
    .await?;
    Ok(Written { bytes: plan.file.shards.iter().map(|s| s.bytes).sum(), resumed, written_samples, sums })
}

fn payload(plan: &Plan, s: &ShardPlan) -> u64 {
    plan.outs[s.first..s.first + s.samples].iter().map(|o| o.payload()).sum()
}

/// A shard under its final name was renamed there whole; its size confirms it is this plan's.
async fn is_complete(out: &Store, s: &ShardPlan) -> Result<bool> {
    Ok(out.head(&s.name).await.is_ok_and(|o| o.size == s.bytes))
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
    let sink: ObjectWriter = out.writer(&s.name, s.bytes)?;
    let mut builder = tar::Builder::new(sink);
    let io_err = |e: io::Error| Error::Io { path: format!("{shown}/{}", s.name), source: e };
    let mut fetched = futures::stream::iter(chunks(outs).into_iter().map(|r| {
        let part = &outs[r];
        async move { Ok::<_, Error>((part, fetch(&**src, part, field, shown).await?)) }
    }))
    .buffered(2);
    let mut sums: Vec<u64> = Vec::new();
    while let Some((part, fields)) = fetched.try_next().await? {
        let keys: Vec<String> = part.iter().map(|o| o.key.clone()).collect();
        let bytes: u64 = part.iter().map(|o| o.payload()).sum();
        let (b, c, res) = tokio::task::spawn_blocking(move || {
            let r = keys.iter().zip(&fields).try_for_each(|(k, f)| append(&mut builder, k, f, &mut sums));
            (builder, sums, r)
        })
        .await
        .map_err(Error::task)?;
        (builder, sums) = (b, c);
        res.map_err(io_err)?;
        progress.advance(part.len() as u64, bytes);
    }
    let sink = tokio::task::spawn_blocking(move || builder.into_inner()).await.map_err(Error::task)?.map_err(io_err)?;
    let len = sink.written();
    if len != s.bytes {
        return Err(Error::internal(format!("{}: wrote {len} bytes, the plan said {}", s.name, s.bytes)));
    }
    sink.finish().await?;
    Ok(sums)
}

/// One sample's members, with fixed metadata (mode 0644, owner 0, mtime 0) so the same input
/// always gives the same bytes; each payload's XXH3-64 goes to `sums` (pack has the bytes in
/// hand, so recording them costs no read).
fn append<W: Write>(b: &mut tar::Builder<W>, key: &str, fields: &[Field], sums: &mut Vec<u64>) -> io::Result<()> {
    for f in fields {
        append_member(b, &format!("{key}.{}", f.name), &f.data, sums)?;
    }
    Ok(())
}

/// One member, as [`append`] writes it.
pub(crate) fn append_member<W: Write>(
    b: &mut tar::Builder<W>,
    name: &str,
    data: &[u8],
    sums: &mut Vec<u64>,
) -> io::Result<()> {
    sums.push(twox_hash::XxHash3_64::oneshot(data));
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    b.append_data(&mut h, name, data)
}
