//! Fixed set of reusable items with fence-aware recycling, shared by the host
//! pool and the device ring so both follow the same reuse rules.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use super::{lock, CopyEvent, PinnedError, PoolStats};

/// An item with a stable identity, so tests and stats can follow it around.
pub(super) struct Slot<T> {
    pub(super) id: usize,
    item: T,
}

struct Pending<T> {
    seq: u64,
    slot: Slot<T>,
    fences: Vec<Arc<dyn CopyEvent>>,
}

struct State<T> {
    free: VecDeque<Slot<T>>,
    /// Sorted by fence sequence number: reclaim and waiting go oldest first.
    pending: VecDeque<Pending<T>>,
    /// Kept alive rather than freed: the device may still be reading them.
    lost: Vec<Slot<T>>,
    in_use: usize,
    acquires: u64,
    waits: u64,
    waiting: usize,
}

/// Every slot of a recycler was withdrawn after failed copy events.
#[derive(Debug)]
pub(super) struct AllLost;

impl<T> State<T> {
    fn reclaim_completed(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            p.fences.retain(|f| !f.is_complete());
            if p.fences.is_empty() {
                let p = self.pending.remove(i).expect("index checked");
                self.free.push_back(p.slot);
            } else {
                i += 1;
            }
        }
    }
}

/// The pool itself; see the module docs.
pub(super) struct Recycler<T> {
    state: Mutex<State<T>>,
    returned: Condvar,
    next_seq: AtomicU64,
    total: usize,
}

impl<T: Send> Recycler<T> {
    pub(super) fn new(items: Vec<T>) -> Arc<Self> {
        let total = items.len();
        let free = items.into_iter().enumerate().map(|(id, item)| Slot { id, item }).collect();
        Arc::new(Recycler {
            state: Mutex::new(State {
                free,
                pending: VecDeque::new(),
                lost: Vec::new(),
                in_use: 0,
                acquires: 0,
                waits: 0,
                waiting: 0,
            }),
            returned: Condvar::new(),
            next_seq: AtomicU64::new(0),
            total,
        })
    }

    fn lease(self: &Arc<Self>, st: &mut State<T>, slot: Slot<T>) -> Lease<T> {
        st.in_use += 1;
        st.acquires += 1;
        Lease { home: Arc::clone(self), slot: Some(slot), fences: Vec::new(), seq: 0 }
    }

    pub(super) fn try_acquire(self: &Arc<Self>) -> Option<Lease<T>> {
        let mut st = lock(&self.state);
        st.reclaim_completed();
        let slot = st.free.pop_front()?;
        Some(self.lease(&mut st, slot))
    }

    /// A free slot, waiting for one; `Err(AllLost)` once every slot was withdrawn after a
    /// failed copy event (nothing will ever come back).
    pub(super) fn acquire(self: &Arc<Self>) -> Result<Lease<T>, AllLost> {
        let mut st = lock(&self.state);
        let mut waited = false;
        loop {
            st.reclaim_completed();
            if let Some(slot) = st.free.pop_front() {
                st.waits += u64::from(waited);
                st.waiting -= usize::from(waited);
                let lease = self.lease(&mut st, slot);
                if !st.free.is_empty() || !st.pending.is_empty() {
                    // We may have reclaimed several; pass the wake-up on.
                    self.returned.notify_one();
                }
                return Ok(lease);
            }
            if !waited {
                waited = true;
                st.waiting += 1;
            }
            if let Some(oldest) = st.pending.front() {
                // Only the event can tell us when this buffer frees up, so block
                // on it, outside the lock so releases and other acquirers proceed.
                let (seq, fences) = (oldest.seq, oldest.fences.clone());
                drop(st);
                let waited_ok = fences.iter().try_for_each(|f| f.wait());
                st = lock(&self.state);
                if waited_ok.is_err() {
                    if let Some(i) = st.pending.iter().position(|p| p.seq == seq) {
                        let p = st.pending.remove(i).expect("index checked");
                        st.lost.push(p.slot);
                    }
                }
            } else if st.in_use == 0 {
                st.waiting -= 1;
                return Err(AllLost);
            } else {
                st = self.returned.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
        }
    }

    fn release(&self, slot: Slot<T>, mut fences: Vec<Arc<dyn CopyEvent>>, seq: u64) {
        fences.retain(|f| !f.is_complete());
        let mut st = lock(&self.state);
        st.in_use -= 1;
        if fences.is_empty() {
            st.free.push_back(slot);
        } else {
            let at = st.pending.partition_point(|p| p.seq < seq);
            st.pending.insert(at, Pending { seq, slot, fences });
        }
        // Also on a pending insert: a waiter parked on the condvar must start
        // waiting on the event instead.
        self.returned.notify_one();
    }

    pub(super) fn stats(&self) -> PoolStats {
        let st = lock(&self.state);
        PoolStats {
            buffers: self.total,
            free: st.free.len(),
            pending: st.pending.len(),
            in_use: st.in_use,
            acquires: st.acquires,
            waits: st.waits,
            waiting: st.waiting,
            lost: st.lost.len(),
        }
    }
}

impl<T> Drop for Recycler<T> {
    fn drop(&mut self) {
        // Freeing memory that a copy still reads is unsound for pinned memory;
        // errors are ignored because there is nobody left to report them to.
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        for p in &st.pending {
            for f in &p.fences {
                let _ = f.wait();
            }
        }
    }
}

/// Exclusive use of one item; gives it back to its recycler on drop.
pub(super) struct Lease<T: Send> {
    home: Arc<Recycler<T>>,
    slot: Option<Slot<T>>,
    fences: Vec<Arc<dyn CopyEvent>>,
    seq: u64,
}

impl<T: Send> Lease<T> {
    pub(super) fn slot(&self) -> &Slot<T> {
        self.slot.as_ref().expect("slot is present until drop")
    }
    pub(super) fn item(&self) -> &T {
        &self.slot().item
    }
    pub(super) fn item_mut(&mut self) -> &mut T {
        &mut self.slot.as_mut().expect("slot is present until drop").item
    }
    pub(super) fn fence(&mut self, ev: Arc<dyn CopyEvent>) {
        self.seq = self.home.next_seq.fetch_add(1, Ordering::Relaxed);
        self.fences.push(ev);
    }
    /// Fences not yet seen complete.
    pub(super) fn open_fences(&self) -> usize {
        self.fences.iter().filter(|f| !f.is_complete()).count()
    }
    pub(super) fn wait_fences(&mut self) -> Result<(), PinnedError> {
        while let Some(f) = self.fences.first() {
            f.wait()?;
            self.fences.remove(0);
        }
        Ok(())
    }
}

impl<T: Send> Drop for Lease<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let fences = std::mem::take(&mut self.fences);
            self.home.release(slot, fences, self.seq);
        }
    }
}
