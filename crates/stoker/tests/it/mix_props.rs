//! Properties of a weighted mix's plan through the ordinary sampler: exact per-source counts,
//! exactly-once draws within each source's share, resume at any position, elastic resume at
//! another world size, and window proportions within sampling noise of the weights.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use stoker::sampler::*;

fn plan(sizes: &[u64], weights: &[f64], len: EpochLength, replacement: bool) -> Arc<MixPlan> {
    Arc::new(MixPlan::new(sizes, weights, len, replacement).unwrap())
}

fn config(plan: &Arc<MixPlan>, order: Order, epoch: u64) -> SamplerConfig {
    let mut cfg = SamplerConfig::new(plan.len(), order);
    cfg.mix = Some(plan.clone());
    cfg.epoch = epoch;
    cfg
}

fn ranked(cfg: &SamplerConfig, rank: u64, world: u64, tail: Tail) -> SamplerConfig {
    let mut c = cfg.clone();
    c.partition = Partition::new(rank, world).unwrap();
    c.tail = tail;
    c
}

/// The whole epoch's global indices in position order (one rank, one worker).
fn epoch_indices(plan: &Arc<MixPlan>, order: Order, epoch: u64) -> Vec<u64> {
    Sampler::new(config(plan, order, epoch)).unwrap().iter().collect()
}

fn per_source(plan: &MixPlan, indices: &[u64]) -> Vec<u64> {
    let mut counts = vec![0u64; plan.sources()];
    for &i in indices {
        counts[plan.locate(i).expect("index inside the mix").0] += 1;
    }
    counts
}

fn order_strategy() -> impl Strategy<Value = Order> {
    prop_oneof![Just(Order::Sequential), any::<u64>().prop_map(|seed| Order::Shuffle { seed })]
}

/// Sources (sizes and weights), an epoch length, replacement.
fn mix_strategy() -> impl Strategy<Value = (Vec<u64>, Vec<f64>, EpochLength, bool)> {
    (1usize..5)
        .prop_flat_map(|s| {
            (
                prop::collection::vec(1u64..120, s),
                prop::collection::vec(0.05f64..10.0, s),
                prop_oneof![Just(None), (1u64..400).prop_map(Some)],
                any::<bool>(),
            )
        })
        .prop_filter_map("an explicit length without replacement must fit", |(sizes, weights, len, repl)| {
            let len = len.map_or(EpochLength::Auto, EpochLength::Fixed);
            MixPlan::new(&sizes, &weights, len, repl).ok().map(|_| (sizes, weights, len, repl))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Every source gets exactly its count, each within one of its weight's share; without
    /// replacement no sample repeats; with it, samples repeat as evenly as possible.
    #[test]
    fn exact_counts_and_exactly_once((sizes, weights, len, repl) in mix_strategy(), order in order_strategy(), epoch in 0u64..5) {
        let p = plan(&sizes, &weights, len, repl);
        let w: f64 = weights.iter().sum();
        let counts: Vec<u64> = p.counts().collect();
        prop_assert_eq!(counts.iter().sum::<u64>(), p.len());
        for (s, &c) in counts.iter().enumerate() {
            let share = p.len() as f64 * weights[s] / w;
            prop_assert!((c as f64 - share).abs() < 1.0 + 1e-6, "source {} count {} share {}", s, c, share);
        }
        let idx = epoch_indices(&p, order, epoch);
        prop_assert_eq!(idx.len() as u64, p.len());
        prop_assert_eq!(per_source(&p, &idx), counts.clone());
        let mut seen: HashMap<u64, u64> = HashMap::new();
        for &i in &idx {
            *seen.entry(i).or_default() += 1;
        }
        for (s, &n) in sizes.iter().enumerate() {
            let c = counts[s];
            let (lo, hi) = (c / n, c.div_ceil(n));
            for local in 0..n {
                let times = seen.get(&p.global(s, local).unwrap()).copied().unwrap_or(0);
                prop_assert!(times >= lo && times <= hi, "source {} sample {} drawn {} times (count {} of {})", s, local, times, c, n);
            }
        }
        if !repl {
            prop_assert!(seen.values().all(|&t| t == 1), "a sample repeated without replacement");
        }
    }

    /// Without replacement the automatic length is the longest that fits: it fits, one more
    /// does not.
    #[test]
    fn auto_length_is_set_by_the_source_that_runs_out(sizes in prop::collection::vec(1u64..300, 1..5), raw in prop::collection::vec(0.05f64..10.0, 5)) {
        let weights = &raw[..sizes.len()];
        let p = plan(&sizes, weights, EpochLength::Auto, false);
        prop_assert!(p.counts().zip(&sizes).all(|(c, &n)| c <= n));
        let total: u64 = sizes.iter().sum();
        if p.len() < total {
            prop_assert!(MixPlan::new(&sizes, weights, EpochLength::Fixed(p.len() + 1), false).is_err());
        }
        // With replacement it is the sizes added up, and any length is allowed.
        prop_assert_eq!(plan(&sizes, weights, EpochLength::Auto, true).len(), total);
    }

    /// A run resumed from `state_after(k)` delivers exactly the rest of each rank's sequence.
    #[test]
    fn resume_equals_uninterrupted_tail((sizes, weights, len, repl) in mix_strategy(), order in order_strategy(), world in 1u64..5, frac in 0.0f64..1.0, tail in prop_oneof![Just(Tail::Drop), Just(Tail::Wrap)]) {
        let p = plan(&sizes, &weights, len, repl);
        let base = config(&p, order, 2);
        let runs: Vec<Sampler> = (0..world).map(|r| Sampler::new(ranked(&base, r, world, tail)).unwrap()).collect();
        let steps = (runs[0].rank_len() as f64 * frac) as u64;
        let state = runs[0].state_after(steps);
        prop_assert_eq!(state.mix, Some(p.fingerprint()));
        // Through JSON, as a checkpoint would carry it.
        let state: SamplerState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
        for (r, run) in runs.iter().enumerate() {
            let resumed = Sampler::resume(ranked(&base, r as u64, world, tail), &state).unwrap();
            let full: Vec<u64> = run.iter().collect();
            prop_assert_eq!(resumed.iter().collect::<Vec<_>>(), full[steps as usize..].to_vec());
        }
    }

    /// Four ranks stop mid-epoch, three resume: every planned draw not yet delivered is
    /// delivered once (Drop loses at most the last two positions; Wrap pads from the head).
    #[test]
    fn elastic_four_to_three((sizes, weights, len, repl) in mix_strategy(), order in order_strategy(), frac in 0.0f64..1.0, tail in prop_oneof![Just(Tail::Drop), Just(Tail::Wrap)]) {
        let p = plan(&sizes, &weights, len, repl);
        let base = config(&p, order.clone(), 1);
        let planned = epoch_indices(&p, order, 1);
        let four: Vec<Sampler> = (0..4).map(|r| Sampler::new(ranked(&base, r, 4, Tail::Drop)).unwrap()).collect();
        let steps = (four[0].rank_len() as f64 * frac) as u64;
        let mut delivered: Vec<u64> = Vec::new();
        for s in &four {
            delivered.extend(s.iter().take(steps as usize));
        }
        let state = four[0].state_after(steps);
        let three: Vec<Sampler> = (0..3).map(|r| Sampler::resume(ranked(&base, r, 3, tail), &state).unwrap()).collect();
        let lens: Vec<u64> = three.iter().map(|s| s.len()).collect();
        prop_assert!(lens.iter().all(|&l| l == lens[0]), "rank lengths differ: {:?}", lens);
        for s in &three {
            delivered.extend(s.iter());
        }
        // Compare as multisets of planned positions' indices.
        let mut want: HashMap<u64, i64> = HashMap::new();
        for &i in &planned {
            *want.entry(i).or_default() += 1;
        }
        let mut extra = 0i64;
        let mut missing = 0i64;
        for &i in &delivered {
            *want.entry(i).or_default() -= 1;
        }
        for &v in want.values() {
            if v < 0 { extra -= v } else { missing += v }
        }
        match tail {
            Tail::Drop => prop_assert!(extra == 0 && missing < 3, "extra {} missing {}", extra, missing),
            Tail::Wrap => prop_assert!(missing == 0 && extra < 3, "extra {} missing {}", extra, missing),
        }
    }
}

/// Every window of the epoch holds each source within sampling noise of its weight: the
/// interleave is a uniform permutation, so a window's count is hypergeometric.
#[test]
fn window_proportions_within_sampling_noise() {
    let weights = [0.6, 0.3, 0.1];
    let p = plan(&[50_000, 40_000, 30_000], &weights, EpochLength::Fixed(60_000), false);
    assert_eq!(p.counts().collect::<Vec<_>>(), [36_000, 18_000, 6_000]);
    let window = 1000usize;
    for seed in [0u64, 7, 12345] {
        let idx = epoch_indices(&p, Order::Shuffle { seed }, 3);
        let mut worst = 0.0f64;
        for chunk in idx.chunks(window) {
            let got = per_source(&p, chunk);
            for (s, &w) in weights.iter().enumerate() {
                let sigma = (window as f64 * w * (1.0 - w)).sqrt();
                let z = (got[s] as f64 - window as f64 * w) / sigma;
                worst = worst.max(z.abs());
            }
        }
        // 60 windows x 3 sources: |z| > 4.5 has probability ~1e-3 over all of them.
        assert!(worst < 4.5, "seed {seed}: a window is {worst:.1} sigma off its weights");
        // Exact over the epoch.
        assert_eq!(per_source(&p, &idx), [36_000, 18_000, 6_000]);
    }
}

#[test]
fn deterministic_and_fresh_per_epoch() {
    let p = plan(&[100, 50], &[1.0, 1.0], EpochLength::Auto, false);
    // The second source runs out: 50 of it, and 51 of the first (the odd sample rounds up).
    assert_eq!((p.len(), p.counts().collect::<Vec<_>>()), (101, vec![51, 50]));
    let order = Order::Shuffle { seed: 9 };
    assert_eq!(epoch_indices(&p, order.clone(), 0), epoch_indices(&p, order.clone(), 0));
    assert_ne!(epoch_indices(&p, order.clone(), 0), epoch_indices(&p, order, 1));
}

/// In storage order, each epoch continues where the last stopped, so a large source is read
/// through before any of it repeats.
#[test]
fn sequential_epochs_walk_through_a_large_source() {
    let p = plan(&[100, 10], &[0.75, 0.25], EpochLength::Fixed(40), false);
    assert_eq!(p.counts().collect::<Vec<_>>(), [30, 10]);
    let mut first: Vec<u64> = Vec::new();
    for epoch in 0..3 {
        let idx = epoch_indices(&p, Order::Sequential, epoch);
        let mut own: Vec<u64> = idx.iter().copied().filter(|&i| p.locate(i).unwrap().0 == 0).collect();
        own.sort_unstable();
        first.extend(own);
    }
    assert_eq!(first, (0..90).collect::<Vec<_>>());
}

#[test]
fn states_only_restore_onto_their_own_mix() {
    let a = plan(&[100, 50], &[1.0, 1.0], EpochLength::Fixed(90), false);
    let b = plan(&[100, 50], &[1.0, 1.00001], EpochLength::Fixed(90), false);
    let state = Sampler::new(config(&a, Order::Shuffle { seed: 1 }, 0)).unwrap().state_after(10);
    let e = Sampler::resume(config(&b, Order::Shuffle { seed: 1 }, 0), &state).unwrap_err();
    assert!(matches!(e, SamplerError::MixMismatch { state_is_mix: true, is_mix: true }), "{e}");
    let plain = Sampler::new(SamplerConfig::new(a.len(), Order::Sequential)).unwrap().state_after(3);
    let e = Sampler::resume(config(&a, Order::Sequential, 0), &plain).unwrap_err();
    assert!(e.to_string().contains("not for a mix"), "{e}");
    // States saved before mixes existed (no `mix` key) still load for plain sources.
    let old: SamplerState =
        serde_json::from_str(r#"{"n": 5, "order": {"kind": "sequential"}, "epoch": 0, "consumed": 2}"#).unwrap();
    assert!(Sampler::resume(SamplerConfig::new(5, Order::Sequential), &old).is_ok());
}

#[test]
fn bad_mixes_are_refused_with_reasons() {
    let err =
        |sizes: &[u64], weights: &[f64], len, repl| MixPlan::new(sizes, weights, len, repl).unwrap_err().to_string();
    assert!(err(&[], &[], EpochLength::Auto, false).contains("at least one source"));
    assert!(err(&[5, 5], &[1.0, 0.0], EpochLength::Auto, false).contains("source 1 has weight 0"));
    assert!(err(&[5, 5], &[1.0, f64::NAN], EpochLength::Auto, false).contains("positive finite"));
    assert!(err(&[5, 0], &[1.0, 1.0], EpochLength::Auto, false).contains("source 1 has no samples"));
    assert!(err(&[5], &[1.0], EpochLength::Fixed(0), false).contains("at least 1"));
    let e = err(&[100, 10], &[0.5, 0.5], EpochLength::Fixed(40), false);
    assert!(
        e.contains("source 1 has 10 samples but its share of epoch_length 40 is 20") && e.contains("at most 21"),
        "{e}"
    );
    // With replacement the same length is fine, and the small source repeats evenly.
    let p = plan(&[100, 10], &[0.5, 0.5], EpochLength::Fixed(40), true);
    assert_eq!(p.counts().collect::<Vec<_>>(), [20, 20]);
    // Only ratios matter, even for weights whose sum is past f64::MAX (they summed to
    // infinity, every share became one part: thirds).
    let p = plan(&[1000; 3], &[1e308, 1e308, 1.0], EpochLength::Fixed(999), true);
    let counts: Vec<u64> = p.counts().collect();
    assert!(counts[0].abs_diff(499) <= 1 && counts[1].abs_diff(499) <= 1 && counts[2] <= 1, "{counts:?}");
    let mut cfg = config(&p, Order::Shuffle { seed: 3 }, 0);
    cfg.order = Order::ShardShuffle { seed: 3, window: 2 };
    assert!(Sampler::new(cfg).unwrap_err().to_string().contains("use shuffle"));
}

/// Large plans stay O(sources): a 10^12-sample epoch is planned and indexed instantly.
#[test]
fn huge_epochs_need_no_tables() {
    let p = plan(&[1 << 40, 1 << 38, 1000], &[0.7, 0.2999, 0.0001], EpochLength::Fixed(1 << 40), true);
    let s = Sampler::new(config(&p, Order::Shuffle { seed: 5 }, 7)).unwrap();
    let idx: Vec<u64> = s.iter().skip(1 << 39).take(1000).collect();
    assert_eq!(idx.len(), 1000);
    assert!(idx.iter().all(|&i| i < p.total()));
}
