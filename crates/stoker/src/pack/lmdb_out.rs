//! Writing the LMDB of a plan: one writer thread owns a working environment and appends
//! records in key order, a commit per chunk, while the source is read ahead of it; at the end
//! a compacted copy is synced and renamed to `data.mdb`.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use heed::types::Bytes as RawBytes;
use heed::{CommitOrAbort, CompactionOption, Database, EnvOpenOptions, PutFlags};
use tokio::sync::{mpsc, oneshot};

use super::plan::Plan;
use super::{chunks, fetch, PackProgress, Written};
use crate::error::{Error, Result};
use crate::sample::{display_key, escape_key, unescape_key};
use crate::source::DynSampleSource;
use crate::store::{publish, temp_name, Store};

/// The hidden working environment inside the destination, kept across interruptions.
pub(crate) const WORK_DIR: &str = ".stoker-pack-lmdb";
pub(super) const DATA: &str = "data.mdb";

pub(crate) fn remove_work(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir.join(WORK_DIR)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

pub(crate) async fn write(
    src: &Arc<DynSampleSource>,
    out: &Store,
    plan: &Plan,
    field: Option<&str>,
    resume: bool,
    progress: &dyn PackProgress,
    shown: &str,
) -> Result<Written> {
    // heed maps the environment's file: LMDB is only ever written in a local directory.
    let Some(dir) = out.local_root() else {
        return Err(Error::NotSupported { what: format!("{shown}: LMDB is written to a local directory") });
    };
    let lmdb_err = |reason: String| Error::Lmdb { path: dir.join(WORK_DIR).display().to_string(), reason };
    // Before anything is written: an empty data.mdb published here would let a rerun
    // "resume" into an empty LMDB.
    if plan.outs.is_empty() {
        return Err(lmdb_err("nothing to write".into()));
    }
    let final_path = dir.join(DATA);
    let all: u64 = plan.file.payload_bytes;
    if resume {
        // data.mdb is only ever renamed into place whole, after every record, then recorded
        // as landed: one there that is not an LMDB of as many records (an empty file, another
        // environment), or no longer what landed (changed in place: LMDB keeps no checksums
        // of its own), was not put there by this pack as it is, and is written again.
        if let Ok(m) = std::fs::metadata(&final_path) {
            let records = crate::source::lmdb::check_data_file(&final_path).ok();
            let as_landed = super::tar_out::landed_as(out, DATA, None).await?.is_some();
            if records == Some(plan.outs.len() as u64) && as_landed {
                // A run stopped between landing data.mdb and removing its working copy.
                remove_work(dir).map_err(|e| Error::io(dir.join(WORK_DIR).display(), e))?;
                progress.advance(plan.outs.len() as u64, all);
                return Ok(Written { bytes: m.len(), resumed: 1, written_samples: 0, sums: Default::default() });
            }
        }
    } else {
        remove_work(dir).map_err(|e| Error::io(dir.join(WORK_DIR).display(), e))?;
    }
    // The bytes each key stands for: an LMDB source's keys go back exactly as they were.
    let keys: Vec<Vec<u8>> = plan.outs.iter().map(|o| unescape_key(&o.key).into_owned()).collect();
    let map_size = map_size(plan);
    let (start_tx, start_rx) = oneshot::channel();
    let (tx, rx) = mpsc::channel::<Vec<Bytes>>(1);
    let (ack_tx, mut ack_rx) = mpsc::unbounded_channel::<()>();
    let work = dir.join(WORK_DIR);
    let (to, err_path) = (final_path.clone(), work.display().to_string());
    let writer = tokio::task::spawn_blocking(move || {
        writer(&work, &to, map_size, &keys, start_tx, rx, ack_tx)
            .map_err(|reason| Error::Lmdb { path: err_path.clone(), reason })
    });
    let Ok(start) = start_rx.await else {
        return Err(writer.await.map_err(Error::task)?.err().unwrap_or_else(|| lmdb_err("writer stopped".into())));
    };
    if start > 0 {
        progress.advance(start as u64, plan.outs[..start].iter().map(|o| o.payload()).sum());
    }
    let outs = &plan.outs[start..];
    let mut fetched = futures::stream::iter(chunks(outs).into_iter().map(|r| {
        let part = &outs[r];
        async move { Ok::<_, Error>((part, fetch(&**src, part, field, shown).await?)) }
    }))
    .buffered(2);
    // Progress follows commits, one chunk behind the sends: the writer never holds more than
    // one uncommitted chunk, and a count reported is a count that survives a crash.
    let mut pending: std::collections::VecDeque<(u64, u64)> = Default::default();
    let fed: Result<()> = async {
        while let Some((part, fields)) = fetched.try_next().await? {
            let values: Vec<Bytes> = fields.into_iter().map(|mut f| f.remove(0).data).collect();
            if tx.send(values).await.is_err() {
                return Ok(()); // the writer failed; its error is reported below
            }
            pending.push_back((part.len() as u64, part.iter().map(|o| o.payload()).sum()));
            if pending.len() > 1 {
                if ack_rx.recv().await.is_none() {
                    return Ok(());
                }
                let (n, b) = pending.pop_front().unwrap_or_default();
                progress.advance(n, b);
            }
        }
        Ok(())
    }
    .await;
    drop(tx);
    if fed.is_ok() {
        while let Some((n, b)) = pending.pop_front() {
            if ack_rx.recv().await.is_none() {
                break;
            }
            progress.advance(n, b);
        }
        progress.stage("compacting");
    }
    let written = writer.await.map_err(Error::task)?;
    fed?;
    let bytes = written?;
    super::tar_out::record_landed(out, DATA).await?;
    Ok(Written { bytes, resumed: 0, written_samples: plan.outs.len() - start, sums: Default::default() })
}

/// Virtual address space for the working map: values round up to pages when they overflow,
/// keys and node headers cost a little each, and B-tree pages are at least half full. Only
/// what is used is allocated; the number is also recorded in `data.mdb`, so it must not
/// depend on anything but the plan.
fn map_size(plan: &Plan) -> usize {
    let per: u64 = plan
        .outs
        .iter()
        .map(|o| {
            let (k, v) = (o.key.len() as u64, o.payload());
            if v + k > 1024 {
                (v + 16).div_ceil(4096) * 4096 + 2 * (k + 32)
            } else {
                2 * (v + k + 32)
            }
        })
        .sum();
    ((per + (64 << 20)).div_ceil(1 << 20) << 20) as usize
}

/// The writer thread: report where to start, append every record it is sent, then publish.
fn writer(
    work: &Path,
    to: &Path,
    map_size: usize,
    keys: &[Vec<u8>],
    start_tx: oneshot::Sender<usize>,
    mut rx: mpsc::Receiver<Vec<Bytes>>,
    ack: mpsc::UnboundedSender<()>,
) -> std::result::Result<u64, String> {
    std::fs::create_dir_all(work).map_err(|e| e.to_string())?;
    // SAFETY: the working environment is private to this pack: nobody else maps it.
    let env =
        unsafe { EnvOpenOptions::new().map_size(map_size).open(work) }.map_err(|e| format!("cannot open: {e}"))?;
    let wtxn = env.write_txn().map_err(|e| e.to_string())?;
    let db: Database<RawBytes, RawBytes> = env
        .create_databases_and_commit(wtxn, |wdo, wtxn| {
            wdo.create_database::<RawBytes, RawBytes>(wtxn, None).map(CommitOrAbort::<_, ()>::Commit)
        })
        .map_err(|e: heed::Error| e.to_string())?
        .unwrap_commit();
    let mut next = {
        let rtxn = env.read_txn().map_err(|e| e.to_string())?;
        let n = db.len(&rtxn).map_err(|e| e.to_string())? as usize;
        let last = db.last(&rtxn).map_err(|e| e.to_string())?.map(|(k, _)| k.to_vec());
        // Resume only from a prefix of this plan; anything else starts over.
        let matches = n <= keys.len() && (n == 0 || last.as_deref() == Some(keys[n - 1].as_slice()));
        drop(rtxn);
        if matches {
            n
        } else {
            let mut w = env.write_txn().map_err(|e| e.to_string())?;
            db.clear(&mut w).map_err(|e| e.to_string())?;
            w.commit().map_err(|e| e.to_string())?;
            0
        }
    };
    if start_tx.send(next).is_err() {
        return Ok(0);
    }
    while let Some(values) = rx.blocking_recv() {
        let mut w = env.write_txn().map_err(|e| e.to_string())?;
        for v in values {
            let key = keys.get(next).ok_or("more records than the plan holds")?;
            db.put_with_flags(&mut w, PutFlags::APPEND, key, &v)
                .map_err(|e| format!("writing key `{}`: {e}", display_key(&escape_key(key))))?;
            next += 1;
        }
        w.commit().map_err(|e| e.to_string())?;
        let _ = ack.send(());
    }
    drop(ack);
    if next < keys.len() {
        return Ok(0); // the reader stopped early; its error is the one to report
    }
    let dir = to.parent().ok_or("destination has no parent directory")?;
    let tmp = dir.join(temp_name(DATA));
    // heed opens the copy's path with create and truncate: a link planted there would be
    // followed. A fresh file is made first, and the copy opens that.
    drop(crate::store::create_fresh(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?);
    let file = env.copy_to_path(&tmp, CompactionOption::Enabled).map_err(|e| format!("compacting: {e}"))?;
    file.sync_all().map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    drop(file);
    env.prepare_for_closing().wait();
    publish(&tmp, to).map_err(|e| e.to_string())?;
    remove_work(dir).map_err(|e| e.to_string())?;
    Ok(len)
}
