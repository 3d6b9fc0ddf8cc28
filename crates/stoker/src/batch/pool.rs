//! The pool batches are built in and return their storage to.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::storage::Shell;
use super::{Batch, BatchBuilder};
use crate::pinned::HostPool;
use crate::sample::Sample;

/// Recycles batch storage. Cloning shares the pool.
#[derive(Clone, Debug, Default)]
pub struct BatchPool {
    pub(super) free: Arc<Mutex<Vec<Shell>>>,
    max_kept: usize,
    pub(super) host: Option<HostPool>,
    pub(super) spills: Arc<AtomicU64>,
    /// The fields and bytes of the columns of the last batch finished (up to
    /// [`SIZED_COLUMNS`]): a batch built in new storage (none idle, because the consumer
    /// holds its batches: a Ray block, a list of batches) gives a column of the same field
    /// that size at once, instead of growing it by doubling from nothing (a copy of what it
    /// holds, and the fresh memory written twice, at each step).
    sizes: Arc<Mutex<ColumnSizes>>,
}

/// Each remembered column's field and bytes.
type ColumnSizes = Vec<(Arc<str>, usize)>;

/// Columns whose size a pool remembers ([`BatchPool`]'s `sizes`); others start empty.
const SIZED_COLUMNS: usize = 8;

impl BatchPool {
    /// A pool that keeps up to `max_kept` idle batches' storage.
    pub fn new(max_kept: usize) -> Self {
        BatchPool {
            free: Arc::default(),
            max_kept: max_kept.max(1),
            host: None,
            spills: Arc::default(),
            sizes: Arc::default(),
        }
    }

    /// Like [`new`](Self::new), with columns written straight into buffers of `host` (pinned
    /// when it was made for a device). A column larger than one buffer, or one for which no
    /// buffer is free, lives in ordinary memory instead ("spills", counted).
    pub fn with_host_pool(max_kept: usize, host: HostPool) -> Self {
        BatchPool { host: Some(host), ..Self::new(max_kept) }
    }

    /// Columns that could not use a host-pool buffer.
    pub fn spills(&self) -> u64 {
        self.spills.load(Relaxed)
    }

    /// The host buffer pool, when batches are assembled into one.
    pub fn host_pool(&self) -> Option<&HostPool> {
        self.host.as_ref()
    }

    /// Idle batch storages held for reuse.
    pub fn idle(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Start a batch in recycled storage.
    pub fn builder(&self) -> BatchBuilder {
        let mut shell = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_default();
        shell.indices.clear();
        shell.keys.clear();
        shell.key_ends.clear();
        shell.used = 0;
        BatchBuilder { shell, pool: Some(self.clone()), open: false, next: 0, by_name: Default::default() }
    }

    /// Assemble already-read samples (drawn from `indices`) into a batch (one copy each).
    pub fn assemble(&self, epoch: u64, number: u64, indices: &[u64], samples: &[Sample]) -> Batch {
        let mut b = self.builder();
        for (s, &i) in samples.iter().zip(indices) {
            b.push_sample(i, s);
        }
        b.finish(epoch, number)
    }

    /// Remember the column sizes of a batch just finished (see `sizes`).
    pub(super) fn note_sizes(&self, shell: &Shell) {
        let mut sizes = self.sizes.lock().unwrap_or_else(|e| e.into_inner());
        sizes.clear();
        let named = shell.columns[..shell.used].iter().filter_map(|c| Some((c.name.clone()?, c.len)));
        sizes.extend(named.take(SIZED_COLUMNS));
    }

    /// The bytes field `name`'s column had in the last batch finished (0 if it had none).
    pub(super) fn size_of(&self, name: &str) -> usize {
        let sizes = self.sizes.lock().unwrap_or_else(|e| e.into_inner());
        sizes.iter().find(|(n, _)| &**n == name).map_or(0, |&(_, len)| len)
    }

    pub(super) fn give(&self, shell: Shell) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.max_kept {
            free.push(shell);
        }
    }
}
