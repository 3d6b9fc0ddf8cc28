//! A small pool of decode threads that runs one borrowed job at a time, allocation-free.
//!
//! A general-purpose pool (rayon) queues jobs in blocks it allocates now and then; a batch is
//! one job here, and every thread claims rows from it until none are left, so no queue is
//! needed: the job is a pointer to the caller's closure, published under a mutex, and the
//! caller waits until every thread has left it. Each thread keeps its own image scratch.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::image::ImageScratch;

/// The job: called once on every thread with that thread's scratch.
type Job<'a> = dyn Fn(&mut ImageScratch) + Sync + 'a;

/// A job's address with its lifetime erased. Only [`Workers::run`] makes one, and it does not
/// return before every thread is done with it.
#[derive(Clone, Copy)]
struct JobPtr(*const Job<'static>);

// SAFETY: the closure behind the pointer is `Sync` and outlives every use (see `run`).
unsafe impl Send for JobPtr {}

struct State {
    job: Option<JobPtr>,
    /// Bumped per job, so a thread runs each job once.
    generation: u64,
    /// Threads still inside the current job.
    active: usize,
    /// A thread's call panicked during the current job.
    panicked: bool,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
    /// One job at a time: batches decoded concurrently take turns, each using every thread.
    turn: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `threads` decode threads.
pub(crate) struct Workers {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    pub(crate) fn new(threads: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { job: None, generation: 0, active: 0, panicked: false, shutdown: false }),
            work: Condvar::new(),
            done: Condvar::new(),
            turn: Mutex::new(()),
        });
        // The pool is made first and the threads pushed into it, so a thread that cannot be
        // started drops the pool, whose drop stops and joins the ones already running (they
        // would otherwise wait for work forever).
        let mut workers = Workers { shared, handles: Vec::new() };
        for i in 0..threads {
            let s = workers.shared.clone();
            let handle = std::thread::Builder::new().name(format!("stoker-decode-{i}")).spawn(move || serve(&s))?;
            workers.handles.push(handle);
        }
        // Every thread has started and run once before the first batch: a thread's own
        // start-up allocations belong to making the pool, not to decoding.
        workers.run(&|_: &mut ImageScratch| {});
        Ok(workers)
    }

    pub(crate) fn threads(&self) -> usize {
        self.handles.len()
    }

    /// Run `job` once on every thread and return when all are done. `false` if a call panicked.
    pub(crate) fn run(&self, job: &Job<'_>) -> bool {
        let _turn = lock(&self.shared.turn);
        // SAFETY: erasing the lifetime is sound because this function does not return (and
        // `job` stays borrowed) until `active` is back to 0 and the pointer is withdrawn.
        let ptr = JobPtr(unsafe { std::mem::transmute::<*const Job<'_>, *const Job<'static>>(job) });
        let mut st = lock(&self.shared.state);
        st.job = Some(ptr);
        st.generation += 1;
        st.active = self.handles.len();
        st.panicked = false;
        self.shared.work.notify_all();
        while st.active > 0 {
            st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.job = None;
        !st.panicked
    }
}

fn serve(shared: &Shared) {
    let mut scratch = ImageScratch::default();
    let mut seen = 0u64;
    loop {
        let job = {
            let mut st = lock(&shared.state);
            loop {
                if st.shutdown {
                    return;
                }
                match st.job {
                    Some(j) if st.generation != seen => {
                        seen = st.generation;
                        break j;
                    }
                    _ => st = shared.work.wait(st).unwrap_or_else(|e| e.into_inner()),
                }
            }
        };
        // SAFETY: `run` keeps the closure alive until this thread reports done below.
        let f = unsafe { &*job.0 };
        let ok = catch_unwind(AssertUnwindSafe(|| f(&mut scratch))).is_ok();
        if !ok {
            // The scratch may be half-updated; start the next job from a fresh one.
            scratch = ImageScratch::default();
        }
        let mut st = lock(&shared.state);
        st.panicked |= !ok;
        st.active -= 1;
        if st.active == 0 {
            shared.done.notify_all();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        self.shared.work.notify_all();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    #[test]
    fn every_thread_runs_each_job_once_and_borrows_end_with_run() {
        let w = Workers::new(3).unwrap();
        for round in 0..50 {
            let next = AtomicUsize::new(0);
            let mut out = vec![0usize; 100];
            let slots: Vec<Mutex<&mut usize>> = out.iter_mut().map(Mutex::new).collect();
            let calls = AtomicUsize::new(0);
            assert!(w.run(&|_: &mut ImageScratch| {
                calls.fetch_add(1, Relaxed);
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    let Some(s) = slots.get(i) else { break };
                    **lock(s) = i + round;
                }
            }));
            assert_eq!(calls.load(Relaxed), 3);
            drop(slots);
            assert!(out.iter().enumerate().all(|(i, &v)| v == i + round));
        }
    }

    #[test]
    fn a_panicking_job_is_reported_and_the_pool_keeps_working() {
        let w = Workers::new(2).unwrap();
        assert!(!w.run(&|_: &mut ImageScratch| panic!("boom")));
        let n = AtomicUsize::new(0);
        assert!(w.run(&|_: &mut ImageScratch| {
            n.fetch_add(1, Relaxed);
        }));
        assert_eq!(n.load(Relaxed), 2);
    }
}
