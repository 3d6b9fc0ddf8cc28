//! Writing the tar shards of a plan: several shards at once, each read in chunks while the
//! previous chunk is written, under a temporary name until it is whole and synced.

use std::io;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

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
    let (writer, sums, _) = tokio::task::spawn_blocking(move || sink.end())
        .await
        .map_err(Error::task)?
        .map_err(|e| out.write_error(&s.name, e))?;
    let len = writer.written();
    if len != s.bytes {
        return Err(Error::internal(format!("{}: wrote {len} bytes, the plan said {}", s.name, s.bytes)));
    }
    writer.finish().await?;
    Ok(sums)
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
