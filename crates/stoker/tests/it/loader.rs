//! The Loader over real sources: order, completeness, resume (also elastic), error policies,
//! transforms, the byte budget and the starvation figures.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use stoker::loader::{ErrorPolicy, Loader, LoaderConfig, LoaderState};
use stoker::sampler::{Order, Partition, Sampler, SamplerConfig, Tail};
use stoker::{DynSampleSource, Sample};

/// A tar source of `n` samples in shards of 10, and the samples.
async fn tar_source(dir: &std::path::Path, n: usize) -> (Arc<DynSampleSource>, Vec<Sample>) {
    let mut all = Vec::new();
    for s in 0..n.div_ceil(10) {
        let samples = tar_samples(s, 10.min(n - s * 10));
        write_tar(&dir.join(format!("s-{s:03}.tar")), &samples);
        all.extend(samples);
    }
    (open(dir.to_str().unwrap()).await, all)
}

fn blocking_indices(loader: &Loader, epoch: u64, max_batches: usize) -> Vec<u64> {
    let mut out = Vec::new();
    for b in loader.epoch_blocking(epoch).unwrap().take(max_batches) {
        out.extend_from_slice(b.unwrap().indices());
    }
    out
}

#[test]
fn every_sample_once_in_sampler_order_with_right_bytes() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (src, samples) = rt.block_on(tar_source(dir.path(), 95));
    let mut cfg = LoaderConfig::new(8);
    cfg.order = Order::Shuffle { seed: 7 };
    let loader = Loader::new(src, cfg).unwrap();
    assert_eq!(loader.batches_per_epoch().unwrap(), 12);
    let mut seen = Vec::new();
    for batch in loader.epoch_blocking(3).unwrap() {
        let batch = batch.unwrap();
        assert_eq!(batch.epoch, 3);
        let jpg = batch.field("jpg").unwrap();
        for (row, &i) in batch.indices().iter().enumerate() {
            let want = &samples[i as usize];
            assert_eq!(batch.key(row), Some(want.key.as_str()));
            assert_eq!(jpg.get(row).unwrap(), &want.fields[0].data[..]);
        }
        seen.extend_from_slice(batch.indices());
    }
    let expected: Vec<u64> =
        Sampler::new(SamplerConfig { epoch: 3, ..SamplerConfig::new(95, Order::Shuffle { seed: 7 }) })
            .unwrap()
            .iter()
            .collect();
    assert_eq!(seen, expected, "batches arrive in sampler order");
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(sorted, (0..95).collect::<Vec<_>>(), "each sample once");
    assert_ne!(blocking_indices(&loader, 4, 100), seen, "a new epoch is a new order");
    let stats = loader.stats();
    assert_eq!(stats.samples, 190);
    assert!(stats.fetch_p50_ms > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_stream_drop_last_and_shard_shuffle() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = tar_source(dir.path(), 45).await;
    let mut cfg = LoaderConfig::new(10);
    cfg.drop_last = true;
    cfg.order = Order::ShardShuffle { seed: 1, window: 2 };
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let mut stream = loader.epoch(0).unwrap();
    let mut sizes = Vec::new();
    let mut idx = Vec::new();
    while let Some(b) = stream.next().await {
        let b = b.unwrap();
        sizes.push(b.len());
        idx.extend_from_slice(b.indices());
    }
    assert_eq!(sizes, [10, 10, 10, 10], "the short last batch is dropped");
    // With a window of 2 shards, the first 20 samples come from exactly 2 shards.
    let shards: std::collections::BTreeSet<_> = idx[..20].iter().map(|&i| src.locality(i as usize)).collect();
    assert_eq!(shards.len(), 2, "{shards:?}");
}

#[test]
fn resume_continues_with_exactly_the_rest() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = rt.block_on(tar_source(dir.path(), 77));
    let mut cfg = LoaderConfig::new(6);
    cfg.order = Order::Shuffle { seed: 99 };
    let full = blocking_indices(&Loader::new(src.clone(), cfg.clone()).unwrap(), 2, usize::MAX);

    let first = Loader::new(src.clone(), cfg.clone()).unwrap();
    let head = blocking_indices(&first, 2, 5);
    let state: LoaderState = first.state().unwrap();
    let json = serde_json::to_string(&state).unwrap();

    let second = Loader::new(src, cfg).unwrap();
    assert!(matches!(second.pending_state_now(), Some(None)), "nothing loaded");
    second.load_state(serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(second.resume_epoch(), Some(2));
    // What a forked child's loader starts from: the loaded state, as `state` gives it.
    let now = second.pending_state_now().flatten().map(|s| serde_json::to_string(&s).unwrap());
    assert_eq!(now, Some(json.clone()));
    let tail = blocking_indices(&second, 2, usize::MAX);
    assert_eq!([head, tail].concat(), full);
}

/// A state taken after an epoch's last batch (drop_last too) is the next epoch's start: resumed
/// as its own epoch it gave an empty one. A state for another order, or past the data's
/// end, is refused.
#[test]
fn a_state_at_an_epochs_end_is_the_next_epochs_start_and_a_foreign_one_is_refused() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = rt.block_on(tar_source(dir.path(), 77));
    for drop_last in [false, true] {
        let mut cfg = LoaderConfig::new(6);
        cfg.order = Order::Shuffle { seed: 4 };
        cfg.drop_last = drop_last;
        let l = Loader::new(src.clone(), cfg.clone()).unwrap();
        blocking_indices(&l, 2, usize::MAX);
        let state = l.state().unwrap();
        assert_eq!((state.sampler.epoch, state.sampler.consumed), (3, 0), "drop_last {drop_last}");
        // Kept at its end (as earlier versions wrote it), it is read the same way.
        let mut old = state.clone();
        old.sampler.epoch = 2;
        old.sampler.consumed = 77 - if drop_last { 77 % 6 } else { 0 };
        let resumed = Loader::new(src.clone(), cfg.clone()).unwrap();
        resumed.load_state(old).unwrap();
        assert_eq!(resumed.resume_epoch(), Some(3), "drop_last {drop_last}");
    }
    let mut cfg = LoaderConfig::new(6);
    cfg.order = Order::Shuffle { seed: 4 };
    let l = Loader::new(src.clone(), cfg.clone()).unwrap();
    blocking_indices(&l, 0, 2);
    let state = l.state().unwrap();
    cfg.order = Order::Shuffle { seed: 5 };
    let e = Loader::new(src.clone(), cfg.clone()).unwrap().load_state(state.clone()).unwrap_err();
    assert!(e.to_string().contains("order"), "{e}");
    cfg.order = Order::Shuffle { seed: 4 };
    // Past the end by the padding of a last global batch (4 ranks, 77 samples: 80): the end.
    let mut padded = state.clone();
    padded.sampler.consumed = 80;
    let resumed = Loader::new(src.clone(), cfg.clone()).unwrap();
    resumed.load_state(padded).unwrap();
    assert_eq!(resumed.resume_epoch(), Some(1));
    let mut past = state;
    past.sampler.consumed = 77 + (1 << 20) + 1;
    let e = Loader::new(src, cfg).unwrap().load_state(past).unwrap_err();
    assert!(e.to_string().contains(&format!("consumed {} of 77", 77 + (1 << 20) + 1)), "{e}");
}

#[test]
fn elastic_resume_from_four_ranks_to_three() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = rt.block_on(tar_source(dir.path(), 120));
    let cfg = |rank, world| {
        let mut c = LoaderConfig::new(5);
        c.order = Order::Shuffle { seed: 5 };
        c.tail = Tail::Drop;
        c.partition = Partition::new(rank, world).unwrap();
        c
    };
    // Four ranks each take 3 batches (rank-synchronous), then "crash".
    let mut done = Vec::new();
    let mut states = Vec::new();
    for r in 0..4 {
        let l = Loader::new(src.clone(), cfg(r, 4)).unwrap();
        done.extend(blocking_indices(&l, 0, 3));
        states.push(l.state().unwrap());
    }
    assert!(states.windows(2).all(|w| w[0] == w[1]), "every rank saves the same state");
    // Three ranks resume from rank 0's state.
    let mut rest = Vec::new();
    let mut lens = Vec::new();
    for r in 0..3 {
        let l = Loader::new(src.clone(), cfg(r, 3)).unwrap();
        l.load_state(states[0].clone()).unwrap();
        let got = blocking_indices(&l, 0, usize::MAX);
        lens.push(got.len());
        rest.extend(got);
    }
    assert!(lens.windows(2).all(|w| w[0] == w[1]), "equal lengths per rank: {lens:?}");
    let mut counts = BTreeMap::new();
    for i in done.iter().chain(&rest) {
        *counts.entry(*i).or_insert(0) += 1;
    }
    assert!(counts.values().all(|&c| c == 1), "no sample twice");
    assert_eq!(counts.len(), 120, "every sample once (120 - 60 = 60 remaining divide by 3)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_policy_drops_bad_samples_and_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..20 {
        std::fs::write(dir.path().join(format!("{i:03}.bin")), payload(i, 100)).unwrap();
    }
    let src = open(dir.path().to_str().unwrap()).await;
    std::fs::remove_file(dir.path().join("007.bin")).unwrap();
    std::fs::create_dir(dir.path().join("007.bin")).unwrap();

    let mut cfg = LoaderConfig::new(5);
    cfg.on_error = ErrorPolicy::Skip;
    let loader = Loader::new(src.clone(), cfg.clone()).unwrap();
    let mut got = Vec::new();
    let mut stream = loader.epoch(0).unwrap();
    while let Some(b) = stream.next().await {
        got.extend_from_slice(b.unwrap().indices());
    }
    assert_eq!(got, (0..20).filter(|&i| i != 7).collect::<Vec<u64>>());
    assert_eq!(loader.stats().skipped, 1);

    cfg.on_error = ErrorPolicy::Raise;
    let loader = Loader::new(src, cfg).unwrap();
    let mut stream = loader.epoch(0).unwrap();
    let mut outcomes = Vec::new();
    while let Some(b) = stream.next().await {
        outcomes.push(b.map(|b| b.len()).map_err(|e| e.to_string()));
    }
    assert_eq!(outcomes.len(), 4, "the stream goes on after a failed batch");
    assert!(outcomes[1].as_ref().is_err_and(|e| e.contains("007.bin")), "{outcomes:?}");
    assert_eq!((&outcomes[0], &outcomes[2]), (&Ok(5), &Ok(5)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transform_runs_on_every_sample_and_errors_surface() {
    let dir = tempfile::tempdir().unwrap();
    let (src, samples) = tar_source(dir.path(), 30).await;
    let mut cfg = LoaderConfig::new(7);
    cfg.transform = Some(Arc::new(|mut s: Sample| {
        for f in &mut s.fields {
            f.data = f.data.iter().rev().copied().collect::<Vec<u8>>().into();
        }
        Ok(s)
    }));
    let loader = Loader::new(src.clone(), cfg.clone()).unwrap();
    let mut stream = loader.epoch(0).unwrap();
    while let Some(b) = stream.next().await {
        let b = b.unwrap();
        for (row, &i) in b.indices().iter().enumerate() {
            let want: Vec<u8> = samples[i as usize].fields[0].data.iter().rev().copied().collect();
            assert_eq!(b.field("jpg").unwrap().get(row).unwrap(), &want[..]);
        }
    }
    assert!(loader.stats().transform_mean_ms > 0.0);

    cfg.transform = Some(Arc::new(|s: Sample| {
        if s.key.ends_with("00003") {
            Err(stoker::Error::NotSupported { what: format!("cannot decode {}", s.key) })
        } else {
            Ok(s)
        }
    }));
    let loader = Loader::new(src, cfg).unwrap();
    let first = loader.epoch(0).unwrap().next().await.unwrap();
    assert!(first.is_err_and(|e| e.to_string().contains("cannot decode")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_budget_bounds_data_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = tar_source(dir.path(), 100).await;
    let mut cfg = LoaderConfig::new(5);
    cfg.prefetch = 8;
    cfg.max_bytes_in_flight = 64 << 10;
    let loader = Loader::new(src, cfg).unwrap();
    let mut stream = loader.epoch(0).unwrap();
    let mut max_batch = 0;
    while let Some(b) = stream.next().await {
        let b = b.unwrap();
        max_batch = max_batch.max(b.payload_bytes());
        tokio::task::yield_now().await;
    }
    let peak = loader.stats().peak_bytes_in_flight;
    assert!(peak > 0);
    // The budget holds up to estimation error: at most one batch over.
    assert!(peak <= (64 << 10) + 2 * max_batch, "peak {peak} vs budget 64 KiB, batches up to {max_batch}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_and_stall_figures_point_at_the_slow_side() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = tar_source(dir.path(), 40).await;
    // Slow producer (an expensive transform): the consumer waits.
    let mut slow = LoaderConfig::new(4);
    slow.transform_threads = 1;
    slow.transform = Some(Arc::new(|s| {
        std::thread::sleep(Duration::from_millis(3));
        Ok(s)
    }));
    let l = Loader::new(src.clone(), slow).unwrap();
    let mut s = l.epoch(0).unwrap();
    while s.next().await.is_some() {}
    let starving = l.stats();
    // Slow consumer: producers stall, the consumer hardly waits.
    let l = Loader::new(src, LoaderConfig::new(4)).unwrap();
    let mut s = l.epoch(0).unwrap();
    while s.next().await.is_some() {
        // Far slower than the fetch and transform above, so the figures hold on a loaded machine.
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let fed = l.stats();
    assert!(starving.consumer_wait_fraction > 0.5, "{starving:?}");
    assert!(fed.consumer_wait_fraction < starving.consumer_wait_fraction, "{fed:?}");
    assert!(fed.producer_stall_s > starving.producer_stall_s, "{fed:?} vs {starving:?}");
}

#[test]
fn bad_configs_are_errors() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = rt.block_on(tar_source(dir.path(), 10));
    assert!(Loader::new(src.clone(), LoaderConfig::new(0)).is_err());
    // Counts past any use are errors naming them, not a channel or a thread pool that cannot
    // be made (a panic, or an abort of the whole process for 2^40 decode threads).
    let mut huge = LoaderConfig::new(2);
    huge.prefetch = usize::MAX;
    let e = Loader::new(src.clone(), huge).err().unwrap().to_string();
    assert!(e.contains("prefetch"), "{e}");
    let mut huge = LoaderConfig::new(2);
    huge.transform_threads = 1 << 40;
    huge.decode = Some(stoker::decode::DecodeSpec::from_args(&["__key__=int"]).unwrap());
    let e = Loader::new(src.clone(), huge).err().unwrap().to_string();
    assert!(e.contains("threads"), "{e}");
    let l = Loader::new(src.clone(), LoaderConfig::new(2)).unwrap();
    let wrong = LoaderState {
        sampler: stoker::sampler::SamplerState { n: 11, order: Order::Sequential, epoch: 0, consumed: 0, mix: None },
        batch_size: 2,
        source: None,
        mix_sources: None,
    };
    assert!(l.load_state(wrong).unwrap_err().to_string().contains("11"));
}

#[test]
fn workers_of_a_rank_split_its_samples() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = rt.block_on(tar_source(dir.path(), 50));
    let mut all = Vec::new();
    for w in 0..3 {
        let mut c = LoaderConfig::new(4);
        c.order = Order::Shuffle { seed: 3 };
        c.partition = Partition::new(1, 2).unwrap();
        c.worker = w;
        c.num_workers = 3;
        all.extend(blocking_indices(&Loader::new(src.clone(), c).unwrap(), 0, usize::MAX));
    }
    let mut rank = LoaderConfig::new(4);
    rank.order = Order::Shuffle { seed: 3 };
    rank.partition = Partition::new(1, 2).unwrap();
    let mut whole = blocking_indices(&Loader::new(src, rank).unwrap(), 0, usize::MAX);
    all.sort();
    whole.sort();
    assert_eq!(all, whole, "the workers of rank 1 together read exactly rank 1's samples");
}

#[test]
fn batches_assembled_into_host_pool_buffers_are_right_and_recycled() {
    use stoker::loader::HostBuffers;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (src, samples) = rt.block_on(tar_source(dir.path(), 60));
    for (buffer_bytes, expect_spills) in [(1 << 20, false), (4096, true)] {
        let mut cfg = LoaderConfig::new(6);
        cfg.prefetch = 2;
        cfg.host_buffers = Some(HostBuffers { device: None, buffer_bytes, buffers: 24, device_ring: 0 });
        let loader = Loader::new(src.clone(), cfg).unwrap();
        for epoch in 0..3 {
            for b in loader.epoch_blocking(epoch).unwrap() {
                let b = b.unwrap();
                let (jpg, cls) = (b.field("jpg").unwrap(), b.field("cls").unwrap());
                for (row, &i) in b.indices().iter().enumerate() {
                    assert_eq!(jpg.get(row).unwrap(), &samples[i as usize].fields[0].data[..]);
                    assert_eq!(cls.get(row).unwrap(), &samples[i as usize].fields[1].data[..]);
                }
            }
        }
        assert_eq!(loader.host_spills() > 0, expect_spills, "buffer {buffer_bytes}: spills {}", loader.host_spills());
        let pool = loader.host_pool_stats().unwrap();
        // 30 batches x 2 columns, but buffers live with recycled batch storage: few acquires.
        assert!(pool.acquires < 30, "{pool:?}");
    }
}

#[test]
fn asking_for_a_gpu_without_a_driver_is_a_clear_error() {
    use stoker::loader::HostBuffers;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = rt.block_on(tar_source(dir.path(), 10));
    let mut cfg = LoaderConfig::new(2);
    cfg.host_buffers = Some(HostBuffers::for_batches(Some(0), 1 << 20, 2, 2));
    match Loader::new(src, cfg) {
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("CUDA"), "{msg}");
            assert!(matches!(e, stoker::Error::Pinned(stoker::pinned::PinnedError::CudaUnavailable { .. })), "{e:?}");
        }
        Ok(_) => assert!(stoker::pinned::cuda_driver_available(), "a loader on device 0 without a driver must fail"),
    }
}

/// A source with a bug: it panics when the loader asks it to fit its cache to the run, which
/// the epoch's producer does before reading anything.
#[derive(Debug)]
struct PanicsAtStart;

impl std::fmt::Display for PanicsAtStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("panics-at-start")
    }
}

#[async_trait::async_trait]
impl stoker::SampleSource for PanicsAtStart {
    fn len(&self) -> usize {
        4
    }
    fn capability(&self) -> stoker::source::Capability {
        Default::default()
    }
    fn info(&self) -> stoker::source::SourceInfo {
        stoker::source::SourceInfo::new("panics-at-start", 1)
    }
    async fn get(&self, index: usize) -> stoker::Result<Sample> {
        Err(stoker::Error::IndexOutOfRange { index, len: 4 })
    }
    fn fit_cache_blocks(&self) -> bool {
        panic!("a bug in the source")
    }
}

/// A panic in the epoch's producer is an error in the batches' place, naming it: not a
/// stream that ends as if the epoch were over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_producer_is_an_error_not_an_empty_epoch() {
    let loader = Loader::new(Arc::new(PanicsAtStart), LoaderConfig::new(2)).unwrap();
    let mut epoch = loader.epoch(0).unwrap();
    let first = epoch.next().await.expect("an item, not the end of the epoch");
    let e = first.err().unwrap().to_string();
    assert!(e.contains("a bug in the source"), "{e}");
    assert!(epoch.next().await.is_none(), "nothing after the error");
}
