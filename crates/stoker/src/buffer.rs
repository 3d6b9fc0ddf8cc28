//! Recycled read buffers.
//!
//! Reading from the page cache is a memory copy, and a fresh multi-MiB allocation per read
//! adds page faults and zeroing that cost more than the copy: measured on the 2-core dev box,
//! 64 KiB samples through tar ran at 0.26x a raw read with fresh buffers and above 1x with
//! recycled ones. Buffers come back when the last `Bytes` slice of them drops.

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

use bytes::Bytes;

/// Smaller reads use plain allocations: the heap serves them without faults.
pub(crate) const MIN_POOLED: usize = 32 << 10;
/// Most buffers kept for reuse, and most bytes they may hold together.
const MAX_KEPT: usize = 256;
const MAX_KEPT_BYTES: usize = 512 << 20;
/// Buffers are sized in these steps so a buffer fits many nearby request sizes.
const GRANULE: usize = 64 << 10;

struct Pool {
    /// Oldest returned first: when the pool is full, the oldest go, so it holds what the
    /// reads of late need. Keeping the first comers instead let the large buffers of one
    /// phase (a shard-shuffled epoch's window read-ahead) fill it for good, and every later
    /// read of another size took a fresh allocation, its pages faulted and zeroed: a
    /// decoding Loader's second shard-shuffled epoch ran at a third of its rate.
    free: Vec<Vec<u8>>,
    bytes: usize,
}

impl Pool {
    /// Keep `buf`, letting the oldest buffers go while the pool would hold more than
    /// [`MAX_KEPT`] of them or [`MAX_KEPT_BYTES`]; returns those (or `buf` itself, when it
    /// alone is larger than the pool may hold), for the caller to free outside the lock.
    fn put(&mut self, buf: Vec<u8>) -> Vec<Vec<u8>> {
        if buf.len() > MAX_KEPT_BYTES {
            return vec![buf];
        }
        let (mut n, mut freed) = (0, 0);
        while n < self.free.len()
            && (self.free.len() - n >= MAX_KEPT || self.bytes - freed + buf.len() > MAX_KEPT_BYTES)
        {
            freed += self.free[n].len();
            n += 1;
        }
        let gone = self.free.drain(..n).collect();
        self.bytes = self.bytes - freed + buf.len();
        self.free.push(buf);
        gone
    }
}

/// This process's pool, and the process generation it belongs to ([`crate::fork`]).
struct Owned {
    born: u32,
    pool: Mutex<Pool>,
}

/// This process's pool. A forked child starts a pool of its own: a thread of the parent may
/// have held the lock at the fork (a read's buffer coming back), and that thread does not
/// exist in the child, so the inherited lock could never be taken again (DataLoader fork
/// workers hung on it). The parent's pool is left behind, never freed: its buffers are the
/// parent's pages, copied on write.
static POOL: AtomicPtr<Owned> = AtomicPtr::new(std::ptr::null_mut());

fn pool() -> &'static Mutex<Pool> {
    // Asked first: fork is watched from before any thread can hold a pool's lock.
    let now = crate::fork::generation();
    let p = POOL.load(Ordering::Acquire);
    // SAFETY: pools are leaked, never freed: a non-null pointer stays valid.
    let current = unsafe { p.as_ref() };
    if let Some(o) = current.filter(|o| o.born == now) {
        return &o.pool;
    }
    let fresh = Box::into_raw(Box::new(Owned { born: now, pool: Mutex::new(Pool { free: Vec::new(), bytes: 0 }) }));
    match POOL.compare_exchange(p, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just made, and leaked like every pool.
        Ok(_) => unsafe { &(*fresh).pool },
        Err(first) => {
            // SAFETY: `fresh` was never shared; another thread of this process made one
            // first, and it is valid for ever (leaked).
            unsafe {
                drop(Box::from_raw(fresh));
                &(*first).pool
            }
        }
    }
}

/// An initialised buffer of at least `len` bytes, recycled when possible. Its contents are
/// stale, never uninitialised: callers overwrite what they use.
pub(crate) fn take(len: usize) -> Vec<u8> {
    if len >= MIN_POOLED {
        let mut p = pool().lock().unwrap_or_else(|e| e.into_inner());
        // Best fit, but never a buffer more than 4x too big: it would pin memory for little.
        let best = p
            .free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len && b.len() / 4 <= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        if let Some(i) = best {
            // `remove`, not `swap_remove`: the others keep their age order.
            let buf = p.free.remove(i);
            p.bytes -= buf.len();
            return buf;
        }
        return vec![0u8; len.div_ceil(GRANULE) * GRANULE];
    }
    vec![0u8; len]
}

/// [`take`], failing with `OutOfMemory` instead of aborting when `len` bytes cannot be had:
/// for sizes that come from data (a span an index names), where a lie must cost an error.
pub(crate) fn try_take(len: usize) -> std::io::Result<Vec<u8>> {
    if len < MIN_POOLED {
        return Ok(vec![0u8; len]);
    }
    {
        let p = pool().lock().unwrap_or_else(|e| e.into_inner());
        if p.free.iter().any(|b| b.len() >= len && b.len() / 4 <= len) {
            drop(p);
            return Ok(take(len));
        }
    }
    let want = len.div_ceil(GRANULE) * GRANULE;
    let mut v = Vec::new();
    v.try_reserve_exact(want).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::OutOfMemory, format!("cannot allocate {want} bytes for a read"))
    })?;
    v.resize(want, 0);
    Ok(v)
}

/// Freeze the first `len` bytes of `buf` into `Bytes`; a pooled-size buffer goes back to the
/// pool when the last slice of it drops.
pub(crate) fn freeze(mut buf: Vec<u8>, len: usize) -> Bytes {
    if buf.len() < MIN_POOLED {
        buf.truncate(len);
        return Bytes::from(buf);
    }
    Bytes::from_owner(Pooled { buf, len })
}

struct Pooled {
    buf: Vec<u8>,
    len: usize,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        // Those let go are freed after the lock is released.
        let gone = pool().lock().unwrap_or_else(|e| e.into_inner()).put(buf);
        drop(gone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_after_the_last_slice_drops() {
        let mut b = take(100_000);
        let ptr = b.as_ptr();
        b[..5].copy_from_slice(b"hello");
        let bytes = freeze(b, 5);
        let slice = bytes.slice(1..3);
        drop(bytes);
        assert_eq!(&slice[..], b"el");
        drop(slice);
        // Another thread may race us for the pool in other tests; look for our buffer.
        let again: Vec<Vec<u8>> = (0..MAX_KEPT).map_while(|_| Some(take(100_000))).take(8).collect();
        assert!(again.iter().any(|v| v.as_ptr() == ptr), "the buffer was recycled");
        let small = freeze(take(10), 3);
        assert_eq!(small.len(), 3);
    }

    /// Buffers of one size filling the pool do not keep it from holding those of another
    /// size returned since: the oldest go.
    #[test]
    fn a_full_pool_lets_its_oldest_buffers_go_for_new_ones() {
        // A pool of the test's own: the process's is shared with other tests.
        let mut p = Pool { free: Vec::new(), bytes: 0 };
        let big = 64 << 20;
        for _ in 0..MAX_KEPT_BYTES / big {
            assert!(p.put(vec![1u8; big]).is_empty());
        }
        assert_eq!(p.bytes, MAX_KEPT_BYTES);
        // Full of large buffers, it still keeps a small one returned now: the oldest goes.
        let gone = p.put(vec![2u8; 64 << 10]);
        assert_eq!(gone.iter().map(Vec::len).collect::<Vec<_>>(), [big]);
        assert_eq!(p.free.last().map(|v| (v.len(), v[0])), Some((64 << 10, 2)));
        assert_eq!(p.bytes, MAX_KEPT_BYTES - big + (64 << 10));
        assert_eq!(p.bytes, p.free.iter().map(Vec::len).sum::<usize>());
        // And at most MAX_KEPT buffers, the oldest going first.
        for i in 0..MAX_KEPT {
            p.put(vec![3u8; MIN_POOLED + i]);
        }
        assert_eq!(p.free.len(), MAX_KEPT);
        assert_eq!(p.free[0].len(), MIN_POOLED, "the oldest small one is first, every large one gone");
        assert_eq!(p.bytes, p.free.iter().map(Vec::len).sum::<usize>());
    }

    /// A child forked while another thread holds the pool's lock (here: this thread, as a
    /// reader's buffer coming back would) takes and returns buffers all the same.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_child_forked_while_the_pool_is_locked_has_a_pool_of_its_own() {
        drop(take(MIN_POOLED));
        let held = pool().lock().unwrap();
        let child = crate::fork::in_child(held, || {
            drop(freeze(take(MIN_POOLED * 2), 10));
            take(MIN_POOLED * 2).len() >= MIN_POOLED * 2
        });
        assert_eq!(child, Ok(()), "a forked child could not use the buffer pool");
    }
}
