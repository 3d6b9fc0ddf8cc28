//! Reuse rules of `HostPool` on the plain (heap) path, driven by `FakeEvent`,
//! plus the CUDA-unavailable behaviour of both builds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use stoker::pinned::PinnedError;
use stoker::pinned::{
    cuda_driver_available, CopierConfig, CopyEvent, FakeEvent, GpuCopier, HostBuffer, HostPool, PoolConfig,
};

fn pool(buffers: usize, buffer_bytes: usize) -> HostPool {
    HostPool::new(PoolConfig { buffer_bytes, buffers, device: None }).expect("heap pool")
}

fn event() -> Arc<FakeEvent> {
    Arc::new(FakeEvent::new())
}

/// Polls `cond` for up to 5 s; threads in these tests need real time to block.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn buffers_have_fixed_capacity_and_track_used_length() {
    let p = pool(2, 64);
    let mut b = p.acquire().unwrap();
    assert_eq!((b.capacity(), b.len(), b.is_empty()), (64, 0, true));
    assert_eq!(b[..].len(), 64, "deref covers the whole capacity");
    b[..3].copy_from_slice(b"abc");
    b.set_len(3).unwrap();
    assert_eq!(b.filled(), b"abc");
    assert_eq!(b.set_len(65), Err(PinnedError::TooLarge { requested: 65, capacity: 64 }));
    assert_eq!(b.len(), 3, "a rejected set_len leaves the length alone");
    assert!(!b.is_pinned());
}

#[test]
fn zero_sizes_are_config_errors() {
    for (buffers, buffer_bytes) in [(0, 8), (2, 0)] {
        let err = HostPool::new(PoolConfig { buffer_bytes, buffers, device: None }).unwrap_err();
        assert!(matches!(err, PinnedError::Config { .. }), "{err:?}");
    }
    let err = GpuCopier::new(CopierConfig { device: 0, buffer_bytes: 8, ring: 0 }).unwrap_err();
    assert!(matches!(err, PinnedError::Config { .. }), "{err:?}");
}

#[test]
fn unfenced_buffer_is_reused_immediately() {
    let p = pool(1, 8);
    let id = p.acquire().unwrap().id();
    assert_eq!(p.try_acquire().map(|b| b.id()), Some(id));
    let s = p.stats();
    assert_eq!((s.free, s.pending, s.in_use, s.acquires), (1, 0, 0, 2));
}

#[test]
fn fenced_buffer_is_not_reused_before_completion() {
    let p = pool(1, 8);
    let ev = event();
    let mut b = p.acquire().unwrap();
    b.fence(ev.clone());
    assert!(b.is_fenced());
    drop(b);
    let s = p.stats();
    assert_eq!((s.free, s.pending, s.in_use), (0, 1, 0));
    assert!(p.try_acquire().is_none(), "reused while the copy is in flight");
    ev.complete();
    let b = p.try_acquire().expect("reclaimed after completion");
    assert!(!b.is_fenced());
    assert_eq!(p.stats().pending, 0);
}

#[test]
fn fence_completed_before_drop_goes_straight_to_free() {
    let p = pool(1, 8);
    let ev = event();
    let mut b = p.acquire().unwrap();
    b.fence(ev.clone());
    ev.complete();
    drop(b);
    assert_eq!((p.stats().free, p.stats().pending), (1, 0));
}

#[test]
fn every_fence_must_complete() {
    let p = pool(1, 8);
    let (e1, e2) = (event(), event());
    let mut b = p.acquire().unwrap();
    b.fence(e1.clone());
    b.fence(e2.clone());
    drop(b);
    e2.complete();
    assert!(p.try_acquire().is_none());
    e1.complete();
    assert!(p.try_acquire().is_some());
}

#[test]
fn pending_buffers_are_reclaimed_in_fence_order() {
    let p = pool(3, 8);
    let mut bufs: Vec<HostBuffer> = (0..3).map(|_| p.acquire().unwrap()).collect();
    let ids: Vec<usize> = bufs.iter().map(HostBuffer::id).collect();
    let evs: Vec<_> = (0..3).map(|_| event()).collect();
    // Fence order 1, 2, 0 differs from both acquisition and drop order.
    for i in [1, 2, 0] {
        bufs[i].fence(evs[i].clone());
    }
    drop(bufs); // drops 0, 1, 2
    assert_eq!(p.stats().pending, 3);
    evs.iter().for_each(|e| e.complete());
    let order: Vec<usize> = (0..3).map(|_| p.try_acquire().unwrap().id()).collect();
    assert_eq!(order, vec![ids[1], ids[2], ids[0]]);
}

#[test]
fn completed_buffers_are_reclaimed_past_an_older_incomplete_one() {
    let p = pool(2, 8);
    let (mut a, mut b) = (p.acquire().unwrap(), p.acquire().unwrap());
    let (ea, eb) = (event(), event());
    a.fence(ea.clone());
    b.fence(eb.clone());
    let b_id = b.id();
    drop((a, b));
    eb.complete();
    let got = p.try_acquire().expect("b is complete");
    assert_eq!(got.id(), b_id);
    assert_eq!(p.stats().pending, 1, "a still waits for its copy");
    ea.complete(); // dropping the pool waits for pending copies
}

#[test]
fn acquire_waits_on_the_oldest_pending_event() {
    let p = pool(2, 8);
    let (mut a, mut b) = (p.acquire().unwrap(), p.acquire().unwrap());
    let (ea, eb) = (event(), event());
    let a_id = a.id();
    a.fence(ea.clone());
    b.fence(eb.clone());
    drop(b); // dropped first, but fenced later
    drop(a);
    let p2 = p.clone();
    let waiter = thread::spawn(move || p2.acquire().unwrap().id());
    eventually("acquire to wait on a's event", || ea.wait_calls() == 1);
    assert_eq!(eb.wait_calls(), 0, "waited on the younger event");
    assert!(!waiter.is_finished());
    ea.complete();
    assert_eq!(waiter.join().unwrap(), a_id);
    let s = p.stats();
    assert_eq!((s.waits, s.pending, s.in_use), (1, 1, 0));
    eb.complete();
}

#[test]
fn acquire_blocks_until_a_buffer_is_dropped() {
    let p = pool(1, 8);
    let held = p.acquire().unwrap();
    let p2 = p.clone();
    let waiter = thread::spawn(move || p2.acquire().unwrap().id());
    eventually("acquire to block", || p.stats().waiting == 1);
    assert!(!waiter.is_finished());
    let id = held.id();
    drop(held);
    assert_eq!(waiter.join().unwrap(), id);
    assert_eq!((p.stats().waits, p.stats().waiting), (1, 0));
}

#[test]
fn acquire_parked_on_condvar_switches_to_a_newly_pending_event() {
    let p = pool(1, 8);
    let mut held = p.acquire().unwrap();
    let p2 = p.clone();
    let waiter = thread::spawn(move || p2.acquire().unwrap().id());
    eventually("acquire to park on the condvar", || p.stats().waiting == 1);
    let ev = event();
    held.fence(ev.clone());
    drop(held);
    eventually("waiter to wait on the event", || ev.wait_calls() == 1);
    assert!(!waiter.is_finished());
    ev.complete();
    waiter.join().unwrap();
}

#[test]
fn writing_a_fenced_buffer_waits_for_its_copy() {
    let p = pool(1, 8);
    let ev = event();
    let mut b = p.acquire().unwrap();
    b.fence(ev.clone());
    let _ = &b[..]; // reads do not wait
    let completer = {
        let ev = ev.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            ev.complete();
        })
    };
    b[0] = 7; // blocks until `complete`
    assert!(ev.is_complete());
    assert!(!b.is_fenced());
    completer.join().unwrap();
}

#[test]
fn failed_event_withdraws_the_buffer_for_good() {
    let p = pool(2, 8);
    let mut a = p.acquire().unwrap();
    let held = p.acquire().unwrap();
    let ev = event();
    a.fence(ev.clone());
    let a_id = a.id();
    drop(a);
    ev.fail("context lost");
    // Nothing is free, so the waiter must try a's event; the failure withdraws
    // a, and the waiter then gets the other buffer once it is dropped.
    let p2 = p.clone();
    let waiter = thread::spawn(move || p2.acquire().unwrap().id());
    eventually("a to be withdrawn", || p.stats().lost == 1);
    let held_id = held.id();
    drop(held);
    assert_eq!(waiter.join().unwrap(), held_id);
    let b = p.acquire().unwrap();
    assert_ne!(b.id(), a_id);
    assert!(p.try_acquire().is_none(), "a must never come back");
    let s = p.stats();
    assert_eq!((s.lost, s.pending, s.free, s.in_use, s.waiting), (1, 0, 0, 1, 0));
}

#[test]
fn wait_fences_reports_the_error() {
    let p = pool(1, 8);
    let ev = event();
    let mut b = p.acquire().unwrap();
    b.fence(ev.clone());
    ev.fail("boom");
    assert!(matches!(b.wait_fences(), Err(PinnedError::Cuda { .. })));
}

#[test]
fn acquire_fails_clearly_when_every_buffer_is_lost() {
    let p = pool(1, 8);
    let ev = event();
    let mut b = p.acquire().unwrap();
    b.fence(ev.clone());
    drop(b);
    ev.fail("context lost");
    let e = p.acquire().unwrap_err();
    assert!(matches!(e, PinnedError::Cuda { .. }), "{e:?}");
    assert!(e.to_string().contains("lost to failed copy events"), "{e}");
    assert!(p.acquire().is_err(), "and stays an error, never a hang");
    assert_eq!(p.stats().waiting, 0, "nobody waits after the error");
}

#[test]
fn dropping_the_pool_waits_for_pending_copies() {
    let p = pool(1, 8);
    let ev = event();
    let mut b = p.acquire().unwrap();
    b.fence(ev.clone());
    drop(b);
    let dropper = thread::spawn(move || drop(p));
    eventually("pool drop to wait on the event", || ev.wait_calls() == 1);
    assert!(!dropper.is_finished(), "memory freed under a running copy");
    ev.complete();
    dropper.join().unwrap();
}

#[test]
fn buffers_outlive_their_pool_handle() {
    let p = pool(1, 8);
    let b = p.acquire().unwrap();
    drop(p);
    drop(b);
}

#[test]
fn device_pool_without_driver_is_cuda_unavailable() {
    let res = HostPool::new(PoolConfig { buffer_bytes: 1024, buffers: 2, device: Some(0) });
    if cfg!(feature = "cuda") && cuda_driver_available() {
        // A GPU machine: the pinned path must work instead.
        let p = res.expect("pinned pool on a machine with a driver");
        assert!(p.acquire().unwrap().is_pinned());
        return;
    }
    match res {
        Err(PinnedError::CudaUnavailable { reason }) => {
            let expected = if cfg!(feature = "cuda") { "libcuda.so" } else { "without the `cuda` cargo feature" };
            assert!(reason.contains(expected), "{reason}");
            assert!(reason.contains("device=None"), "{reason}");
        }
        other => panic!("expected CudaUnavailable, got {other:?}"),
    }
}

#[test]
fn copier_without_driver_is_cuda_unavailable() {
    if cfg!(feature = "cuda") && cuda_driver_available() {
        return; // covered by tests/it/gpu.rs on a GPU machine
    }
    let err = GpuCopier::new(CopierConfig { device: 0, buffer_bytes: 1024, ring: 2 }).unwrap_err();
    assert!(matches!(err, PinnedError::CudaUnavailable { .. }), "{err:?}");
}

#[test]
fn this_machine_has_no_driver_or_the_build_has_no_cuda() {
    // Documents the environment the two tests above ran in.
    if !cfg!(feature = "cuda") {
        assert!(!cuda_driver_available());
    }
    eprintln!("cuda driver available: {}", cuda_driver_available());
}

#[test]
fn stats_add_up_under_contention() {
    let p = pool(3, 8);
    let stop = Arc::new(AtomicBool::new(false));
    let events: Arc<Mutex<Vec<Arc<FakeEvent>>>> = Arc::default();
    let gpu = {
        let (stop, events) = (stop.clone(), events.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                events.lock().unwrap().drain(..).for_each(|e| e.complete());
                thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (p, events) = (p.clone(), events.clone());
            thread::spawn(move || {
                for i in 0..500 {
                    let mut b = p.acquire().unwrap();
                    if i % 2 == 0 {
                        let ev = event();
                        b.fence(ev.clone());
                        events.lock().unwrap().push(ev);
                    }
                }
            })
        })
        .collect();
    workers.into_iter().for_each(|w| w.join().unwrap());
    stop.store(true, Ordering::SeqCst);
    gpu.join().unwrap();
    events.lock().unwrap().drain(..).for_each(|e| e.complete());
    let s = p.stats();
    assert_eq!(s.acquires, 1000);
    assert_eq!((s.in_use, s.free + s.pending, s.lost), (0, 3, 0));
}

#[test]
fn handles_cross_threads() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send_sync::<HostPool>();
    send::<HostBuffer>();
    send_sync::<GpuCopier>();
    send::<stoker::pinned::DeviceBatch>();
    send_sync::<FakeEvent>();
    send_sync::<PinnedError>();
}
