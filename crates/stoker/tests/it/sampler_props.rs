use proptest::prelude::*;
use std::collections::HashSet;
use std::sync::Arc;
use stoker::sampler::*;

fn assert_bijection(p: &Permutation) {
    let n = p.len() as usize;
    let mut seen = vec![false; n];
    for i in 0..p.len() {
        let y = p.apply(i);
        assert!(y < p.len(), "apply({i}) = {y} out of range for n = {n}");
        assert!(!seen[y as usize], "apply hit {y} twice for n = {n}");
        seen[y as usize] = true;
    }
}

/// A random order; ShardShuffle gets a random layout summing to `n`.
fn order_strategy() -> impl Strategy<Value = (Order, Vec<u64>)> {
    prop_oneof![
        Just((Order::Sequential, vec![])),
        any::<u64>().prop_map(|seed| (Order::Shuffle { seed }, vec![])),
        (any::<u64>(), 1usize..5, prop::collection::vec(0u64..40, 0..25))
            .prop_map(|(seed, window, sizes)| (Order::ShardShuffle { seed, window }, sizes)),
    ]
}

/// Builds a config; `n` comes from the layout for ShardShuffle.
fn config(order: &Order, sizes: &[u64], n: u64) -> SamplerConfig {
    let mut cfg = SamplerConfig::new(n, order.clone());
    if let Order::ShardShuffle { .. } = order {
        let layout = ShardLayout::from_sizes(sizes).unwrap();
        cfg.n = layout.total();
        cfg.shards = Some(Arc::new(layout));
    }
    cfg
}

fn with_rank(cfg: &SamplerConfig, rank: u64, world: u64, tail: Tail) -> SamplerConfig {
    let mut c = cfg.clone();
    c.partition = Partition::new(rank, world).unwrap();
    c.tail = tail;
    c
}

fn tail_strategy() -> impl Strategy<Value = Tail> {
    prop_oneof![Just(Tail::Drop), Just(Tail::Wrap)]
}

#[test]
fn permutation_bijection_on_edge_sizes() {
    let mut sizes = vec![0u64, 1, 2, 3, 5, 7, 11, 101, 65537];
    for b in 1..=16 {
        sizes.extend([(1u64 << b) - 1, 1 << b, (1 << b) + 1]);
    }
    for &n in &sizes {
        for (seed, epoch) in [(0, 0), (42, 7)] {
            assert_bijection(&Permutation::new(n, seed, epoch));
        }
    }
    // Out-of-range inputs are passed through instead of panicking.
    assert_eq!(Permutation::new(0, 1, 2).apply(5), 5);
    assert_eq!(Permutation::new(10, 1, 2).apply(u64::MAX), u64::MAX);
}

#[test]
fn permutation_large_domains() {
    let mut rng_state = 12345u64;
    let mut next = move || {
        rng_state = rng_state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        rng_state >> 1
    };
    for n in [1_000_000_000u64, 1 << 40, u64::MAX] {
        let p = Permutation::new(n, 9, 3);
        let inputs: HashSet<u64> = (0..3000).map(|_| next() % n).collect();
        let outputs: HashSet<u64> = inputs.iter().map(|&i| p.apply(i)).collect();
        assert_eq!(inputs.len(), outputs.len(), "collision for n = {n}");
        assert!(outputs.iter().all(|&y| y < n));
        let sample: Vec<u64> = inputs.iter().copied().take(50).collect();
        let run = |p: &Permutation| sample.iter().map(|&i| p.apply(i)).collect::<Vec<_>>();
        assert_eq!(run(&p), run(&Permutation::new(n, 9, 3)), "not deterministic");
        assert_ne!(run(&p), run(&Permutation::new(n, 9, 4)), "epoch ignored");
        assert_ne!(run(&p), run(&Permutation::new(n, 10, 3)), "seed ignored");
    }
}

#[test]
fn shuffle_is_not_identity_and_changes_per_epoch() {
    let a: Vec<u64> = (0..1000).map(|i| Permutation::new(1000, 1, 0).apply(i)).collect();
    let b: Vec<u64> = (0..1000).map(|i| Permutation::new(1000, 1, 1).apply(i)).collect();
    let fixed = a.iter().enumerate().filter(|&(i, &x)| i as u64 == x).count();
    assert!(fixed < 20, "{fixed} fixed points");
    assert_ne!(a, b);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn permutation_bijection_random(n in 0u64..100_000, seed: u64, epoch: u64) {
        assert_bijection(&Permutation::new(n, seed, epoch));
    }

    /// The iterator (which computes a shuffle's indices a run at a time) gives `get(k)` for
    /// every k, also after `nth` skips inside and past a run, at every rank and tail.
    #[test]
    fn iter_and_nth_give_get_of_each_position(
        (order, sizes) in order_strategy(),
        n in 0u64..3_000,
        world in 1u64..4,
        tail in tail_strategy(),
        skips in prop::collection::vec(0usize..40, 0..30),
    ) {
        let base = config(&order, &sizes, n);
        for rank in 0..world {
            let s = Sampler::new(with_rank(&base, rank, world, tail)).unwrap();
            let want: Vec<u64> = (0..s.len()).map(|k| s.get(k).unwrap()).collect();
            prop_assert_eq!(s.iter().collect::<Vec<_>>(), want.clone());
            let mut it = s.iter();
            let mut k = 0usize;
            for &skip in &skips {
                let got = it.nth(skip);
                k = k.saturating_add(skip);
                prop_assert_eq!(got, want.get(k).copied(), "nth({}) at position {}", skip, k);
                k += 1;
                prop_assert_eq!(it.len(), want.len().saturating_sub(k));
            }
            let rest: Vec<u64> = it.collect();
            prop_assert_eq!(&rest[..], want.get(k.min(want.len())..).unwrap_or(&[]));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn shard_shuffle_bijection_and_locality(
        sizes in prop::collection::vec(0u64..60, 0..40),
        window in 1usize..6,
        seed: u64,
        epoch in 0u64..4,
    ) {
        let layout = Arc::new(ShardLayout::from_sizes(&sizes).unwrap());
        let n = layout.total();
        let mut cfg = SamplerConfig::new(n, Order::ShardShuffle { seed, window });
        cfg.epoch = epoch;
        cfg.shards = Some(layout.clone());
        let s = Sampler::new(cfg).unwrap();
        let order: Vec<u64> = s.iter().collect();
        prop_assert_eq!(order.len() as u64, n);
        let mut seen = vec![false; n as usize];
        for &x in &order {
            prop_assert!(!seen[x as usize]);
            seen[x as usize] = true;
        }
        // Random access agrees with iteration.
        for (k, &x) in order.iter().enumerate() {
            prop_assert_eq!(s.get(k as u64), Some(x));
        }
        // Locality: the epoch is the concatenation of the window groups, each
        // containing exactly the samples of its shards.
        let shard_order: Vec<u64> = s.shard_order().unwrap().collect();
        let mut sorted = shard_order.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..sizes.len() as u64).collect::<Vec<_>>());
        let mut pos = 0usize;
        for group in shard_order.chunks(window) {
            let mut expected: Vec<u64> =
                group.iter().flat_map(|&sh| layout.range(sh).unwrap()).collect();
            let mut got = order[pos..pos + expected.len()].to_vec();
            pos += expected.len();
            expected.sort_unstable();
            got.sort_unstable();
            prop_assert_eq!(got, expected);
        }
        prop_assert_eq!(pos as u64, n);
    }

    /// `shard_windows` cuts every sampler's items, in order, into the windows they lie in,
    /// for any rank, worker, tail and resume point; only padding positions are left out.
    #[test]
    fn shard_windows_cut_each_sampler_at_window_boundaries(
        sizes in prop::collection::vec(0u64..30, 1..20),
        window in 1usize..5,
        seed: u64,
        (world, rank) in (1u64..=4).prop_flat_map(|w| (Just(w), 0..w)),
        (workers, worker) in (1u64..=3).prop_flat_map(|w| (Just(w), 0..w)),
        tail in tail_strategy(),
        consumed_share in 0u64..=100,
    ) {
        let mut cfg = config(&Order::ShardShuffle { seed, window }, &sizes, 0);
        let layout = cfg.shards.clone().unwrap();
        cfg = with_rank(&cfg, rank, world, tail);
        (cfg.worker, cfg.num_workers) = (worker, workers);
        let state = SamplerState { n: cfg.n, order: cfg.order.clone(), epoch: 0, consumed: cfg.n * consumed_share / 100, mix: None };
        let s = Sampler::resume(cfg.clone(), &state).unwrap();
        let windows = s.shard_windows().unwrap();
        let shard_order: Vec<u64> = s.shard_order().unwrap().collect();
        let mut next = 0;
        for w in &windows {
            prop_assert!(w.items.start >= next && w.items.start < w.items.end, "{:?}", windows);
            // Each window's shards are one run of `window` in the epoch's shard order.
            let at = shard_order.iter().position(|&x| x == w.shards[0]).unwrap();
            prop_assert_eq!(at % window, 0);
            prop_assert_eq!(&shard_order[at..(at + window).min(shard_order.len())], &w.shards[..]);
            for k in w.items.clone() {
                let i = s.get(k).unwrap();
                prop_assert!(w.shards.iter().any(|&sh| layout.range(sh).unwrap().contains(&i)));
            }
            next = w.items.end;
        }
        // Items outside every window are padding (positions past the end of the epoch).
        let covered: u64 = windows.iter().map(|w| w.items.end - w.items.start).sum();
        let padding = (0..s.len()).filter(|&k| s.position(k).unwrap() >= cfg.n).count() as u64;
        prop_assert_eq!(covered + padding, s.len());
    }

    #[test]
    fn spans_cut_an_epoch_into_parts_that_read_it_whole(
        (order, sizes) in order_strategy(),
        n in 0u64..300,
        cuts in prop::collection::vec(0f64..1.0, 0..5),
        world in 1u64..=4,
        epoch in 0u64..3,
    ) {
        let mut base = config(&order, &sizes, n);
        base.epoch = epoch;
        let n = base.n;
        let whole: Vec<u64> = Sampler::new(SamplerConfig { tail: Tail::Drop, ..base.clone() }).unwrap().iter().collect();
        let mut bounds: Vec<u64> = cuts.iter().map(|c| (c * n as f64) as u64).chain([0, n]).collect();
        bounds.sort_unstable();
        // One reader per span: the spans in turn are the epoch, each sample with its own index.
        let mut joined = Vec::new();
        for b in bounds.windows(2) {
            let s = Sampler::new(SamplerConfig { span: Some(b[0]..b[1]), ..base.clone() }).unwrap();
            joined.extend(s.iter());
        }
        prop_assert_eq!(&joined, &whole);
        // Ranks split a span as they split an epoch: disjoint, equal, never past its end.
        for b in bounds.windows(2) {
            let mut got = Vec::new();
            for rank in 0..world {
                let c = SamplerConfig { span: Some(b[0]..b[1]), ..with_rank(&base, rank, world, Tail::Wrap) };
                let s = Sampler::new(c).unwrap();
                prop_assert_eq!(s.len(), (b[1] - b[0]) / world);
                got.extend(s.iter());
            }
            got.sort_unstable();
            let mut want = whole[b[0] as usize..b[1] as usize].to_vec();
            want.sort_unstable();
            prop_assert!(got.iter().all(|i| want.binary_search(i).is_ok()), "a rank read outside its span");
            prop_assert_eq!(got.len() as u64, (b[1] - b[0]) / world * world);
        }
    }

    #[test]
    fn partitions_are_equal_disjoint_and_complete(
        (order, sizes) in order_strategy(),
        n in 0u64..300,
        world in 1u64..=8,
        workers in 1u64..=4,
        tail in tail_strategy(),
        epoch in 0u64..3,
    ) {
        let mut base = config(&order, &sizes, n);
        base.epoch = epoch;
        let n = base.n;
        let global: Vec<u64> = Sampler::new(base.clone()).unwrap().iter().collect();
        let mut all = Vec::new();
        let mut rank_lens = HashSet::new();
        for rank in 0..world {
            let cfg = with_rank(&base, rank, world, tail);
            let rank_seq: Vec<u64> = Sampler::new(cfg.clone()).unwrap().iter().collect();
            rank_lens.insert(rank_seq.len());
            for (k, &x) in rank_seq.iter().enumerate() {
                prop_assert_eq!(x, global[(rank as usize + world as usize * k) % n as usize]);
            }
            let mut worker_total = 0;
            for w in 0..workers {
                let mut wc = cfg.clone();
                wc.worker = w;
                wc.num_workers = workers;
                let s = Sampler::new(wc).unwrap();
                let seq: Vec<u64> = s.iter().collect();
                prop_assert_eq!(seq.len() as u64, s.len());
                for (i, &x) in seq.iter().enumerate() {
                    prop_assert_eq!(x, rank_seq[w as usize + workers as usize * i]);
                }
                worker_total += seq.len();
            }
            prop_assert_eq!(worker_total, rank_seq.len());
            all.extend(rank_seq);
        }
        prop_assert_eq!(rank_lens.len(), 1, "unequal rank lengths");
        let distinct: HashSet<u64> = all.iter().copied().collect();
        match tail {
            Tail::Drop => {
                prop_assert_eq!(all.len() as u64, n / world * world);
                prop_assert_eq!(distinct.len(), all.len(), "duplicate under Drop");
                let prefix: HashSet<u64> = global[..all.len()].iter().copied().collect();
                prop_assert_eq!(distinct, prefix);
            }
            Tail::Wrap => {
                prop_assert_eq!(all.len() as u64, n.div_ceil(world) * world);
                prop_assert_eq!(distinct.len() as u64, n);
            }
        }
    }

    #[test]
    fn resume_same_world_equals_uninterrupted_tail(
        (order, sizes) in order_strategy(),
        n in 0u64..300,
        world in 1u64..=8,
        tail in tail_strategy(),
        frac in 0.0f64..=1.0,
    ) {
        let base = config(&order, &sizes, n);
        let ranks: Vec<Sampler> = (0..world)
            .map(|r| Sampler::new(with_rank(&base, r, world, tail)).unwrap())
            .collect();
        let steps = (ranks[0].rank_len() as f64 * frac) as u64;
        let state = ranks[0].state_after(steps);
        for (r, s) in ranks.iter().enumerate() {
            prop_assert_eq!(&s.state_after(steps), &state, "state depends on rank");
            let resumed = Sampler::resume(with_rank(&base, r as u64, world, tail), &state).unwrap();
            let expected: Vec<u64> = s.iter().skip(steps as usize).collect();
            prop_assert_eq!(resumed.iter().collect::<Vec<_>>(), expected);
            // A second resume from the resumed run composes the same way.
            let later = resumed.state_after(1);
            let again = Sampler::resume(with_rank(&base, r as u64, world, tail), &later).unwrap();
            let expected: Vec<u64> = s.iter().skip(steps as usize + 1).collect();
            prop_assert_eq!(again.iter().collect::<Vec<_>>(), expected);
        }
    }

    #[test]
    fn elastic_resume_delivers_each_sample_at_most_once(
        (order, sizes) in order_strategy(),
        n in 0u64..300,
        old_world in 1u64..=8,
        new_world in 1u64..=8,
        tail in tail_strategy(),
        frac in 0.0f64..=1.0,
    ) {
        check_elastic(&config(&order, &sizes, n), old_world, new_world, tail, frac)?;
    }

    #[test]
    fn elastic_resume_4_to_3(
        n in prop_oneof![Just(120u64), Just(121u64), 0u64..200],
        seed: u64,
        tail in tail_strategy(),
        frac in 0.0f64..=1.0,
    ) {
        check_elastic(&config(&Order::Shuffle { seed }, &[], n), 4, 3, tail, frac)?;
    }

    #[test]
    fn state_serde_round_trip(
        (order, _) in order_strategy(),
        n: u64,
        epoch: u64,
        consumed: u64,
    ) {
        let state = SamplerState { n, order, epoch, consumed, mix: None };
        let json = serde_json::to_string(&state).unwrap();
        prop_assert_eq!(serde_json::from_str::<SamplerState>(&json).unwrap(), state);
    }
}

/// Runs `old_world` ranks for a random number of steps, resumes with
/// `new_world` ranks, and checks what the two runs deliver together.
fn check_elastic(
    base: &SamplerConfig,
    old_world: u64,
    new_world: u64,
    tail: Tail,
    frac: f64,
) -> Result<(), TestCaseError> {
    let n = base.n;
    let old: Vec<Sampler> =
        (0..old_world).map(|r| Sampler::new(with_rank(base, r, old_world, tail)).unwrap()).collect();
    let steps = (old[0].rank_len() as f64 * frac) as u64;
    let mut first: Vec<u64> = Vec::new();
    for s in &old {
        first.extend(s.iter().take(steps as usize));
    }
    // Round trip through JSON, as a checkpoint would.
    let json = serde_json::to_string(&old[0].state_after(steps)).unwrap();
    let state: SamplerState = serde_json::from_str(&json).unwrap();
    prop_assert_eq!(state.consumed, steps * old_world);

    let mut second: Vec<u64> = Vec::new();
    let mut lens = HashSet::new();
    for r in 0..new_world {
        let s = Sampler::resume(with_rank(base, r, new_world, tail), &state).unwrap();
        lens.insert(s.len());
        second.extend(s.iter());
    }
    prop_assert!(lens.len() <= 1, "unequal rank lengths after resume");
    let remaining = n.saturating_sub(state.consumed);
    let all: Vec<u64> = first.iter().chain(&second).copied().collect();
    let distinct: HashSet<u64> = all.iter().copied().collect();
    prop_assert!(all.iter().all(|&x| x < n));
    match tail {
        Tail::Drop => {
            prop_assert_eq!(second.len() as u64, remaining / new_world * new_world);
            prop_assert_eq!(distinct.len(), all.len(), "a sample was delivered twice");
            // Only the dropped tails of the two runs can be missing.
            prop_assert_eq!(n - all.len() as u64, (n - steps * old_world) % new_world);
        }
        Tail::Wrap => {
            prop_assert_eq!(second.len() as u64, remaining.div_ceil(new_world) * new_world);
            prop_assert_eq!(distinct.len() as u64, n, "a sample was never delivered");
            // Repeats only come from padding: fewer than world_size per run.
            let pad = old_world.max(new_world) as usize;
            prop_assert!(all.len() - distinct.len() < pad);
            if state.consumed < n {
                let first_set: HashSet<u64> = first.iter().copied().collect();
                prop_assert_eq!(first_set.len(), first.len());
            }
        }
    }
    Ok(())
}

#[test]
fn epoch_end_state_resumes_empty() {
    for tail in [Tail::Drop, Tail::Wrap] {
        let base = SamplerConfig::new(10, Order::Shuffle { seed: 1 });
        let s = Sampler::new(with_rank(&base, 1, 4, tail)).unwrap();
        let done = s.state_after(u64::MAX);
        let resumed = Sampler::resume(with_rank(&base, 1, 4, tail), &done).unwrap();
        assert!(resumed.is_empty());
        assert_eq!(resumed.iter().next(), None);
    }
}

#[test]
fn invalid_configs_are_errors_not_panics() {
    for (start, end) in [(5, 3), (0, 11), (11, 11)] {
        let c = SamplerConfig { span: Some(start..end), ..SamplerConfig::new(10, Order::Sequential) };
        let e = Sampler::new(c).unwrap_err();
        assert_eq!(e, SamplerError::InvalidSpan { start, end, n: 10 });
        assert!(e.to_string().contains(&format!("span {start}..{end}")), "{e}");
    }
    assert_eq!(Partition::new(0, 0), Err(SamplerError::InvalidRank { rank: 0, world_size: 0 }));
    assert!(matches!(Partition::new(4, 4), Err(SamplerError::InvalidRank { .. })));
    let base = SamplerConfig::new(10, Order::Sequential);
    let mut c = base.clone();
    c.partition.world_size = 0;
    assert!(Sampler::new(c.clone()).is_err());
    c.partition.world_size = 2;
    c.partition.rank = 2;
    let e = Sampler::new(c).unwrap_err();
    assert!(e.to_string().contains("rank 2"), "{e}");

    let mut c = base.clone();
    c.num_workers = 0;
    assert!(matches!(Sampler::new(c.clone()), Err(SamplerError::InvalidWorker { .. })));
    c.num_workers = 2;
    c.worker = 2;
    assert!(matches!(Sampler::new(c), Err(SamplerError::InvalidWorker { .. })));

    let mut c = base.clone();
    c.order = Order::ShardShuffle { seed: 0, window: 0 };
    c.shards = Some(Arc::new(ShardLayout::from_sizes(&[5, 5]).unwrap()));
    assert_eq!(Sampler::new(c.clone()).unwrap_err(), SamplerError::ZeroWindow);
    c.order = Order::ShardShuffle { seed: 0, window: 1 };
    c.shards = None;
    assert!(matches!(Sampler::new(c.clone()), Err(SamplerError::InvalidShardLayout { shard_total: None, .. })));
    c.shards = Some(Arc::new(ShardLayout::from_sizes(&[5, 6]).unwrap()));
    assert!(matches!(Sampler::new(c), Err(SamplerError::InvalidShardLayout { shard_total: Some(11), .. })));

    let state = SamplerState { n: 11, order: Order::Sequential, epoch: 0, consumed: 0, mix: None };
    assert!(matches!(Sampler::resume(base.clone(), &state), Err(SamplerError::StateMismatch { .. })));
    assert_eq!(ShardLayout::from_sizes(&[u64::MAX, 1]), Err(SamplerError::Overflow));
    let mut c = SamplerConfig::new(u64::MAX, Order::Sequential);
    c.partition = Partition::new(0, 2).unwrap();
    assert_eq!(Sampler::new(c).unwrap_err(), SamplerError::Overflow);

    // Out-of-range access is None, not a panic.
    let s = Sampler::new(base).unwrap();
    assert_eq!(s.get(10), None);
    assert_eq!(s.iter().nth(usize::MAX), None);
    for e in [SamplerError::ZeroWindow, SamplerError::Overflow] {
        assert!(!e.to_string().is_empty());
    }
}

#[test]
fn partition_from_environment() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    };
    assert_eq!(Partition::from_lookup(env(&[])).unwrap(), Partition::single());
    let p = Partition::from_lookup(env(&[("RANK", "3"), ("WORLD_SIZE", " 4"), ("LOCAL_RANK", "1")])).unwrap();
    assert_eq!((p.rank, p.world_size, p.local_rank), (3, 4, Some(1)));
    assert_eq!(p.node_ranks(), 3..4, "without LOCAL_WORLD_SIZE the node is this rank alone");
    static NODE: [(&str, &str); 4] =
        [("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "4")];
    let p = Partition::from_lookup(env(&NODE)).unwrap();
    assert_eq!((p.local_world_size, p.node_ranks()), (Some(4), 2..6), "ranks 2-5 share rank 3's node");
    // Node numbers that do not fit are dropped (they only say who shares a cache), never fatal.
    static ODD: [(&str, &str); 4] =
        [("RANK", "0"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "4")];
    assert_eq!(Partition::from_lookup(env(&ODD)).unwrap().node_ranks(), 0..1);
    assert!(Partition::new(0, 2).unwrap().on_node(0, 4).is_err(), "more ranks on the node than in the job");
    for bad in [
        &[("RANK", "x"), ("WORLD_SIZE", "4")][..],
        &[("RANK", "-1"), ("WORLD_SIZE", "4")],
        &[("RANK", "1")],
        &[("WORLD_SIZE", "2")],
        &[("RANK", "4"), ("WORLD_SIZE", "4")],
        &[("RANK", "0"), ("WORLD_SIZE", "0")],
        &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "z")],
        &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "2")],
    ] {
        let e = Partition::from_lookup(env(bad)).unwrap_err();
        assert!(!e.to_string().is_empty());
    }
    let e = Partition::from_lookup(env(&[("RANK", "x"), ("WORLD_SIZE", "4")])).unwrap_err();
    assert!(e.to_string().contains("RANK") && e.to_string().contains("\"x\""), "{e}");
    // The real environment of the test process has no launcher variables
    // (or consistent ones); either way this must not panic.
    let _ = Partition::from_env();
}
