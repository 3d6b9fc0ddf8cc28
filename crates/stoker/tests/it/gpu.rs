//! Real-GPU checks of the `cuda` build. They skip (and say so) on machines
//! without a driver or device, so they only prove something on a GPU machine:
//! `cargo test -p stoker --features cuda --test it -- gpu:: --nocapture`.
#![cfg(feature = "cuda")]

use stoker::pinned::PinnedError;
use stoker::pinned::{cuda_driver_available, CopierConfig, GpuCopier, HostBuffer, HostPool, PoolConfig};

const MIB: usize = 1 << 20;

/// Pinned pool plus copier on device 0, or `None` (with a note) when CUDA is unusable.
fn setup(buffers: usize, ring: usize, buffer_bytes: usize) -> Option<(HostPool, GpuCopier)> {
    if !cuda_driver_available() {
        eprintln!("skipped: no CUDA driver on this machine");
        return None;
    }
    let pool = HostPool::new(PoolConfig { buffer_bytes, buffers, device: Some(0) });
    let copier = GpuCopier::new(CopierConfig { device: 0, buffer_bytes, ring });
    match (pool, copier) {
        (Ok(p), Ok(c)) => Some((p, c)),
        (Err(PinnedError::CudaUnavailable { reason }), _) | (_, Err(PinnedError::CudaUnavailable { reason })) => {
            eprintln!("skipped: {reason}");
            None
        }
        (p, c) => panic!("setup failed: {:?} / {:?}", p.err(), c.err()),
    }
}

fn fill(b: &mut HostBuffer, len: usize, seed: u8) {
    for (i, x) in b[..len].iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    b.set_len(len).unwrap();
}

fn read_back(copier: &GpuCopier, batch: &stoker::pinned::DeviceBatch) -> Vec<u8> {
    let stream = copier.stream();
    let out = stream.clone_dtoh(&batch.view()).unwrap();
    stream.synchronize().unwrap();
    out
}

#[test]
fn pinned_batch_round_trips_through_the_device() {
    let Some((pool, copier)) = setup(2, 2, 4 * MIB) else {
        return;
    };
    let mut b = pool.acquire().unwrap();
    assert!(b.is_pinned());
    fill(&mut b, 3 * MIB + 7, 5);
    let expected = b.filled().to_vec();
    let batch = copier.copy(&mut b).unwrap();
    assert_eq!(batch.len(), expected.len());
    assert_ne!(batch.device_ptr(), 0);
    batch.wait().unwrap();
    assert!(batch.is_ready());
    assert_eq!(read_back(&copier, &batch), expected);
}

#[test]
fn host_buffer_is_reused_only_after_its_copy_completed() {
    let Some((pool, copier)) = setup(1, 1, 64 * MIB) else {
        return;
    };
    let mut b = pool.acquire().unwrap();
    fill(&mut b, 64 * MIB, 1);
    let id = b.id();
    let batch = copier.copy(&mut b).unwrap();
    drop(b);
    let again = pool.acquire().unwrap(); // only buffer: must wait for the copy
    assert_eq!(again.id(), id);
    assert!(batch.is_ready(), "host buffer handed out while DMA still reads it");
}

#[test]
fn ring_slot_is_reused_after_the_batch_is_released() {
    let Some((pool, copier)) = setup(2, 1, MIB) else {
        return;
    };
    let compute = copier.context().new_stream().unwrap();
    let mut a = pool.acquire().unwrap();
    fill(&mut a, MIB, 2);
    let mut first = copier.copy(&mut a).unwrap();
    first.stream_wait(&compute).unwrap();
    first.release_after(&compute).unwrap();
    let slot = first.slot_id();
    drop(first);
    let mut b = pool.acquire().unwrap();
    fill(&mut b, MIB / 2, 9);
    let expected = b.filled().to_vec();
    let second = copier.copy(&mut b).unwrap();
    assert_eq!(second.slot_id(), slot);
    second.wait().unwrap();
    assert_eq!(read_back(&copier, &second), expected);
    assert_eq!(copier.ring_stats().acquires, 2);
}

#[test]
fn copy_rejects_a_batch_larger_than_the_device_buffer() {
    let Some((_, copier)) = setup(1, 1, MIB) else {
        return;
    };
    let big = HostPool::new(PoolConfig { buffer_bytes: 2 * MIB, buffers: 1, device: None }).unwrap();
    let mut b = big.acquire().unwrap();
    b.set_len(2 * MIB).unwrap();
    let err = copier.copy(&mut b).unwrap_err();
    assert_eq!(err, PinnedError::TooLarge { requested: 2 * MIB, capacity: MIB });
}

#[test]
fn heap_buffers_can_be_copied_too() {
    let Some((_, copier)) = setup(1, 1, MIB) else {
        return;
    };
    let heap = HostPool::new(PoolConfig { buffer_bytes: MIB, buffers: 1, device: None }).unwrap();
    let mut b = heap.acquire().unwrap();
    fill(&mut b, 1000, 3);
    let expected = b.filled().to_vec();
    let batch = copier.copy(&mut b).unwrap();
    let ev = batch.copy_event();
    ev.wait().unwrap();
    assert_eq!(read_back(&copier, &batch), expected);
}
