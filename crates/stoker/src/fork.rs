//! Which fork of the process this is.
//!
//! A child made by `fork` (PyTorch DataLoader's fork workers) has one thread, a copy of its
//! parent's memory, and every lock as it was at the fork: one held by a parent thread that
//! the child lacks is never let go, and work queued for a parent's thread pool is never done.
//! What the parent's threads use must therefore not be touched in a child: it makes its own
//! (the buffer pool), leaves the parent's alone (a batch made in the parent is not given back
//! to the parent's pool), and tokenizes without rayon's pool.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Once;

/// Forks this process's line has been through since the handler was set (0 in a process
/// that was not forked since).
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// Run by `fork` in the child, while it has one thread.
extern "C" fn forked() {
    GENERATION.fetch_add(1, Relaxed);
    // The tokenizers crate encodes batches on rayon's global pool, whose threads are the
    // parent's: once it has run, a batch in the child would wait for them forever. Serial
    // from here on, as the tokenizers Python package does after a fork (only atomics).
    #[cfg(feature = "tokenizers")]
    if tokenizers::utils::parallelism::has_parallelism_been_used() {
        tokenizers::utils::parallelism::set_parallelism(false);
    }
}

/// This process's generation: a value made under one generation and seen under another was
/// made in a parent process. The first call sets the handler that counts forks, so a value
/// to be checked later must ask for it when it is made.
pub fn generation() -> u32 {
    static WATCH: Once = Once::new();
    WATCH.call_once(|| {
        #[cfg(unix)]
        // SAFETY: nothing is done before the fork or in the parent; the child's handler only
        // changes atomics (and the library stays loaded while the process lives).
        unsafe {
            libc::pthread_atfork(None, None, Some(forked));
        }
    });
    GENERATION.load(Relaxed)
}

/// `m` locked if it is free now (poisoned or not), never waited for: a forked child reading
/// what its parent's object knows, whose lock a parent thread may have held at the fork.
pub(crate) fn lock_if_free<T>(m: &std::sync::Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Fork; run `child` in the child and leave with its verdict; in the parent, `holding` is
/// dropped (a lock held across the fork, as a thread of the parent would) and the child
/// waited for, up to a deadline after which it is killed: `Err` says how it ended.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn in_child<H>(holding: H, child: impl FnOnce() -> bool) -> Result<(), String> {
    use std::time::{Duration, Instant};
    // SAFETY: the test process's allocator (glibc's) is fork-safe, and the child leaves by
    // `_exit`, running nothing of the parent's.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = child();
        // SAFETY: ends the child only.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    drop(holding);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut status = 0;
    // SAFETY: `pid` is this process's child, waited for (and ended if it hangs) here only.
    unsafe {
        while libc::waitpid(pid, &mut status, libc::WNOHANG) != pid {
            if Instant::now() > deadline {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
                return Err("the child hung".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    match libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        true => Ok(()),
        false => Err(format!("the child ended with status {status}")),
    }
}
