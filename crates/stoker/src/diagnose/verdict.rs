//! From the ladder's measurements to a verdict: which step starves the consumer, what helps.

use super::{Knob, Setup, Step, StepResult, Verdict};
use crate::uri::Layout;

/// The input side keeps up when the consumer of the full pipeline waits for data at most this
/// share of the time.
const KEEPS_UP_WAIT: f64 = 0.25;

/// Files smaller than this are "small": a request costs more than moving its bytes.
const SMALL_FILE: u64 = 1 << 20;

/// The most prefetch the advice suggests; past it memory, not prefetch, is the question.
const MAX_PREFETCH: usize = 64;

/// The full pipeline is "clearly slower" than one batch at a time past this factor.
const SLOWER: f64 = 1.25;

fn verdict(step: Step, knob: Knob, advice: String) -> Verdict {
    Verdict { step, knob, advice, also: Vec::new() }
}

pub(super) fn judge(setup: &Setup, steps: &[StepResult]) -> Verdict {
    let get = |s: Step| steps.iter().find(|r| r.step == s);
    let (Some(consumer), Some(pipeline)) = (get(Step::Consumer), get(Step::Pipeline)) else {
        return verdict(Step::Pipeline, Knob::Storage, "the ladder did not complete".into());
    };
    let share = pipeline.samples_per_s / consumer.samples_per_s.max(1e-9);
    // The wait is measured inside the pipeline run itself, so a noisy consumer-alone step (a
    // sleep that overslept on a loaded machine) cannot flip the verdict; the share is shown.
    let waited = pipeline.consumer_wait_fraction.unwrap_or(1.0 - share.min(1.0));
    let rates = format!(
        "the consumer waited for data {:.0}% of the time; {:.1} samples/s against {:.1} for the consumer alone",
        waited * 100.0,
        pipeline.samples_per_s,
        consumer.samples_per_s
    );
    if waited <= KEEPS_UP_WAIT {
        return verdict(
            Step::Consumer,
            Knob::Consumer,
            format!(
                "input is not the bottleneck: the consumer is. In the full pipeline {rates}; a faster step, not \
                 the input, is what helps."
            ),
        );
    }
    // One batch at a time, the part that takes the most time per batch is the costliest.
    let Some(mut worst) = steps
        .iter()
        .filter(|r| matches!(r.step, Step::Copy | Step::Collate | Step::Fetch))
        .max_by(|a, b| a.own_ms_per_batch.total_cmp(&b.own_ms_per_batch))
    else {
        return verdict(Step::Pipeline, Knob::Storage, "the ladder did not complete".into());
    };
    // The pipeline adds no part of its own but the cache; it only takes the blame when a cache
    // is configured and the pipeline is clearly slower than the same reads without it.
    // Otherwise a slower pipeline is the same parts measured again, on a noisier machine.
    let serial_ms = get(Step::Fetch).map_or(0.0, |f| f.ms_per_batch);
    let slower = pipeline.ms_per_batch > SLOWER * serial_ms;
    if setup.cache && slower && pipeline.own_ms_per_batch > worst.own_ms_per_batch {
        worst = pipeline;
    }
    let head = format!(
        "In the full pipeline {rates}. The {} step's own part takes the most time, {:.2} ms per batch.",
        worst.step, worst.own_ms_per_batch
    );
    let mut v = match worst.step {
        Step::Copy => copy(setup, worst),
        Step::Collate => collate(setup, worst),
        Step::Fetch => fetch(setup, worst, get(Step::Collate).unwrap_or(worst), pipeline),
        Step::Pipeline | Step::Consumer => cache_costs(),
    };
    v.advice = format!("{head} {}", v.advice);
    if slower && !setup.cache {
        v.also.push(format!(
            "the Loader took {:.2} ms per batch, more than the same work one batch at a time ({serial_ms:.2} ms): \
             on a busy machine that is noise; otherwise prefetch {} or max_bytes_in_flight is too small",
            pipeline.ms_per_batch, setup.prefetch
        ));
    }
    v
}

fn copy(setup: &Setup, r: &StepResult) -> Verdict {
    let advice = match setup.device {
        Some(d) => format!(
            "Copying to cuda:{d} runs at {:.0} MiB/s. Keep prefetch at 2 or more so the Loader's copies (from \
             pinned buffers, on their own stream) overlap the step, and send compact data (decode on the GPU).",
            r.mib_per_s
        ),
        None => "No GPU here: the step is a host memory copy standing in for the device copy, and host memory \
                 bandwidth is the limit. With a GPU the Loader copies from pinned buffers asynchronously; a more \
                 compact sample encoding moves fewer bytes."
            .to_string(),
    };
    verdict(Step::Copy, Knob::Copy, advice)
}

fn collate(setup: &Setup, r: &StepResult) -> Verdict {
    let transform_ms = r.transform_ms_per_batch.unwrap_or(0.0);
    if setup.transform && transform_ms >= 0.5 * r.own_ms_per_batch {
        let advice = if !setup.decode {
            format!(
                "The transform takes {transform_ms:.2} ms per batch on {} thread(s) of {} cores. If it decodes images \
                 or parses labels, let Stoker do it in Rust on the loader's threads, straight into the batch: \
                 `decode={{\"jpg\": stoker.Image(224), \"cls\": stoker.Int()}}` in Python, `--decode jpg=image:224 \
                 --decode cls=int` here (several times PIL's images/s on the same cores); otherwise give it more \
                 threads (transform_threads={}) or make it cheaper.",
                setup.transform_threads, setup.cores, setup.cores
            )
        } else if setup.transform_threads < setup.cores {
            format!(
                "The transform takes {transform_ms:.2} ms per batch on {} thread(s) while {} cores are available: \
                 give it more threads (transform_threads={}), or make it cheaper.",
                setup.transform_threads, setup.cores, setup.cores
            )
        } else {
            format!(
                "The transform takes {transform_ms:.2} ms per batch with {} threads on {} cores: make it cheaper \
                 (decode smaller, move augmentation to the GPU, or pre-process offline and `stoker pack` the \
                 results); more threads than cores do not help.",
                setup.transform_threads, setup.cores
            )
        };
        return verdict(Step::Collate, Knob::Transform, advice);
    }
    verdict(
        Step::Collate,
        Knob::Prefetch,
        format!(
            "Assembling a batch (copying {} samples of about {} bytes into its buffers) is the cost; a larger \
             prefetch (now {}) lets the Loader assemble more batches at once.",
            setup.batch_size, setup.mean_sample_bytes, setup.prefetch
        ),
    )
}

fn fetch(setup: &Setup, r: &StepResult, collate: &StepResult, pipeline: &StepResult) -> Verdict {
    // What a batch's read costs, one at a time, against what the rest of a batch costs.
    let read_ms = r.own_ms_per_batch.max(1e-3);
    let rest_ms = collate.ms_per_batch.max(1e-3);
    let (c, p) = (setup.concurrency as f64, setup.prefetch as f64);
    let small_files = setup.layout == Layout::Objects.as_str() && setup.mean_sample_bytes < SMALL_FILE;
    // Over a network what waits in line is HTTP requests (coalesced ranges; first tries only,
    // as retries and hedges are not what a batch asks for); locally, reads.
    let requests = r
        .io
        .map(|io| if setup.remote { io.remote_requests.saturating_sub(io.retries + io.hedges) } else { io.requests })
        .map(|n| n as f64 / r.batches.max(1) as f64)
        .filter(|&n| n >= 1.0);
    let mut saturated = None;
    if let Some(per_batch) = requests {
        let rounds = (per_batch / c).ceil().max(1.0);
        let per_request_ms = read_ms / rounds;
        // Little's law: requests in flight needed for reads to keep pace with the rest.
        let needed = per_batch * per_request_ms / rest_ms;
        let in_flight = per_batch.min(c);
        if c < per_batch && needed > p * c {
            // Free to raise (no memory): named even when the store also seems busy.
            let want = per_batch.ceil() as usize;
            let mut v = verdict(
                Step::Fetch,
                Knob::Concurrency,
                format!(
                    "A batch makes {per_batch:.0} requests but only {} run at once: {rounds:.0} round trips of \
                     about {per_request_ms:.1} ms each. Raise the concurrency to {want} (?concurrency={want}) so a \
                     batch is read in one round trip.",
                    setup.concurrency
                ),
            );
            if setup.remote && want * setup.prefetch > setup.max_in_flight {
                let total = want * setup.prefetch;
                v.also.push(format!(
                    "with prefetch {} that is {total} requests at once: raise ?max_in_flight={total} too",
                    setup.prefetch
                ));
            }
            return v;
        }
        // Did more requests in flight read faster? The pipeline had up to `scale` times those
        // of the one-batch-at-a-time step; a store at its throughput limit barely speeds up,
        // and then more prefetch would not help either.
        let cap = if setup.remote { setup.max_in_flight as f64 } else { f64::INFINITY };
        let scale = (p * in_flight).min(cap) / in_flight;
        let read_alone = (r.samples as f64 / r.batches.max(1) as f64) / (read_ms / 1e3);
        // Steady state: the Loader reads its first batch alone, before it knows batch sizes.
        let speedup = pipeline.steady_samples_per_s.unwrap_or(pipeline.samples_per_s) / read_alone;
        if scale >= 2.0 && speedup < 0.5 * scale {
            saturated = Some(format!(
                "With up to {scale:.0}x the requests in flight the full pipeline read only {speedup:.1}x as fast as \
                 one batch at a time: the store is at its throughput limit, not waiting on latency."
            ));
        } else if needed > p * in_flight {
            let want = ((needed / in_flight).ceil() as usize).clamp(setup.prefetch + 1, MAX_PREFETCH);
            let mut v = verdict(
                Step::Fetch,
                Knob::Prefetch,
                format!(
                    "Reading a batch takes {read_ms:.1} ms and everything else {rest_ms:.2} ms, so about {:.0} \
                     batches must be in flight to hide the storage latency; prefetch is {}. Raise it to {want}.",
                    (read_ms / rest_ms).ceil(),
                    setup.prefetch
                ),
            );
            let requests_then = (want as f64 * in_flight) as usize;
            if setup.remote && requests_then > setup.max_in_flight {
                v.also.push(format!("that is {requests_then} requests at once: raise ?max_in_flight={requests_then}"));
            }
            if small_files {
                v.also.push(
                    "packing the small files into tar shards (stoker pack) makes a batch a few large reads".into(),
                );
            }
            if setup.remote {
                v.also.push(cache_note(setup));
            }
            return v;
        }
    } else if read_ms / rest_ms > p {
        let want = ((read_ms / rest_ms).ceil() as usize).clamp(setup.prefetch + 1, MAX_PREFETCH);
        return verdict(
            Step::Fetch,
            Knob::Prefetch,
            format!(
                "Reading a batch takes {read_ms:.1} ms and everything else {rest_ms:.2} ms; prefetch is {}. Raise \
                 it to {want} so reads overlap.",
                setup.prefetch
            ),
        );
    }
    // Enough is in flight, or more does not help: what each request or byte costs is the limit.
    let why = saturated.unwrap_or_else(|| "Enough requests are in flight to hide the latency.".into());
    if small_files {
        let mut v = verdict(
            Step::Fetch,
            Knob::Pack,
            format!(
                "{why} Each small file is a request of about {} bytes: pack them into tar shards (stoker pack SRC \
                 DEST --layout tar) so a batch becomes a few large ranged reads.",
                setup.mean_sample_bytes
            ),
        );
        if setup.remote {
            v.also.push(cache_note(setup));
        }
        return v;
    }
    if setup.remote {
        return verdict(
            Step::Fetch,
            Knob::CacheSize,
            format!("{why} The store delivers {:.1} MiB/s to one batch at a time. {}.", r.mib_per_s, {
                let mut note = cache_note(setup);
                note[..1].make_ascii_uppercase();
                note
            }),
        );
    }
    verdict(
        Step::Fetch,
        Knob::Storage,
        format!(
            "{why} The local storage delivers {:.1} MiB/s to one batch at a time: the disk is the limit (faster \
             storage, or memory for the page cache to hold the data).",
            r.mib_per_s
        ),
    )
}

/// What a cache does for a remote source: tar shards go through the disk cache (on unless
/// turned off), which serves epochs after the first once it holds the data; one object per
/// sample is not cached.
fn cache_note(setup: &Setup) -> String {
    let total = setup.len.saturating_mul(setup.mean_sample_bytes);
    let mib = total >> 20;
    let tar = setup.layout == Layout::Tar.as_str();
    match (tar, setup.cache) {
        (true, true) => format!(
            "the disk cache (on by default for remote shards) serves epochs after the first from local disk once \
             it holds the data: give it ?disk_cache_bytes={total} (about {mib} MiB) or more"
        ),
        (true, false) => format!(
            "a cache that holds the data serves epochs after the first without the store: the disk cache is off \
             here (it is on unless ?disk_cache=false; size it with ?disk_cache_bytes={total}, about {mib} MiB), or \
             ?cache_bytes={total} keeps it in memory"
        ),
        _ => format!(
            "packed into tar shards (stoker pack), the data (about {mib} MiB) would go through the disk cache, which \
             serves epochs after the first from local disk"
        ),
    }
}

fn cache_costs() -> Verdict {
    verdict(
        Step::Pipeline,
        Knob::CacheSize,
        "The full pipeline is slower than reading with the cache off: the cache costs more than it saves (too \
         small for the working set, or blocks much larger than the samples). Raise ?cache_bytes or \
         ?disk_cache_bytes, match ?cache_block to the reads, or turn it off (?cache_bytes=0, ?disk_cache=false)."
            .into(),
    )
}

#[cfg(test)]
mod tests {
    //! The decision table on synthetic measurements: every branch, and the tie-breaks.

    use super::*;
    use crate::diagnose::IoDelta;

    fn setup() -> Setup {
        Setup {
            source: "s3://b/p".into(),
            layout: Layout::Objects.to_string(),
            remote: true,
            len: 1000,
            batch_size: 16,
            prefetch: 4,
            concurrency: 32,
            max_in_flight: 64,
            transform: false,
            decode: false,
            transform_threads: 2,
            cores: 2,
            cache: false,
            device: None,
            copy: "host".into(),
            mean_sample_bytes: 16 << 10,
        }
    }

    fn step(step: Step, ms: f64, own: f64) -> StepResult {
        StepResult {
            step,
            what: step.to_string(),
            samples: 160,
            batches: 10,
            bytes: 160 << 14,
            seconds: ms * 10.0 / 1e3,
            samples_per_s: 16.0 / (ms / 1e3),
            mib_per_s: 1.0,
            ms_per_batch: ms,
            added_ms_per_batch: 0.0,
            own_ms_per_batch: own,
            transform_ms_per_batch: None,
            fetch_p50_ms: None,
            fetch_p99_ms: None,
            consumer_wait_fraction: None,
            steady_samples_per_s: None,
            io: None,
        }
    }

    /// Steps with these own-part times (ms per batch); the pipeline at `pipeline_ms` with the
    /// consumer waiting `wait` of the time; `requests` per fetched batch.
    fn ladder(own: [f64; 4], pipeline_ms: f64, wait: f64, requests: u64) -> Vec<StepResult> {
        let mut total = 0.0;
        let mut out: Vec<StepResult> = [Step::Consumer, Step::Copy, Step::Collate, Step::Fetch]
            .iter()
            .zip(own)
            .map(|(&s, o)| {
                total += o;
                step(s, total, o)
            })
            .collect();
        out[3].io = Some(IoDelta { requests: requests * 10, remote_requests: requests * 10, ..Default::default() });
        let mut p = step(Step::Pipeline, pipeline_ms, pipeline_ms - total);
        p.consumer_wait_fraction = Some(wait);
        out.push(p);
        out
    }

    fn judged(s: &Setup, steps: &[StepResult]) -> (Step, Knob) {
        let v = judge(s, steps);
        (v.step, v.knob)
    }

    #[test]
    fn a_consumer_that_rarely_waits_is_the_bottleneck_whatever_the_parts_cost() {
        let steps = ladder([50.0, 0.1, 0.1, 40.0], 51.0, 0.05, 16);
        assert_eq!(judged(&setup(), &steps), (Step::Consumer, Knob::Consumer));
    }

    #[test]
    fn fetch_knobs_follow_requests_in_flight() {
        // 16 requests, 32 at a time, 100 ms each against 2 ms of the rest: latency-bound, and
        // the pipeline read 4x faster with 4x the requests in flight.
        let mut steps = ladder([2.0, 0.1, 0.1, 100.0], 25.0, 0.9, 16);
        steps[4].steady_samples_per_s = Some(4.0 * 16.0 / 0.1);
        assert_eq!(judged(&setup(), &steps), (Step::Fetch, Knob::Prefetch));
        // The same, read 16 requests one at a time: concurrency first (it costs no memory).
        let one = Setup { concurrency: 1, ..setup() };
        assert_eq!(judged(&one, &steps), (Step::Fetch, Knob::Concurrency));
        assert!(judge(&one, &steps).advice.contains("?concurrency=16"));
        // More in flight did not read faster: the store is at its limit; small files -> pack.
        steps[4].steady_samples_per_s = Some(1.1 * 16.0 / 0.1);
        assert_eq!(judged(&setup(), &steps), (Step::Fetch, Knob::Pack));
        let big = Setup { mean_sample_bytes: 8 << 20, ..setup() };
        assert_eq!(judged(&big, &steps), (Step::Fetch, Knob::CacheSize));
        let local = Setup { remote: false, layout: Layout::Tar.to_string(), ..setup() };
        assert_eq!(judged(&local, &steps), (Step::Fetch, Knob::Storage));
    }

    #[test]
    fn transform_copy_and_collation() {
        let mut steps = ladder([2.0, 0.1, 60.0, 1.0], 70.0, 0.9, 16);
        steps[2].transform_ms_per_batch = Some(58.0);
        let with = Setup { transform: true, ..setup() };
        assert_eq!(judged(&with, &steps), (Step::Collate, Knob::Transform));
        let few = Setup { transform: true, transform_threads: 1, cores: 8, ..setup() };
        assert!(judge(&few, &steps).advice.contains("transform_threads=8"));
        // A Python/closure transform is pointed at decoding in Rust; decoding itself is not.
        assert!(judge(&few, &steps).advice.contains("--decode jpg=image:224"));
        let decoding = Setup { decode: true, ..few };
        assert!(!judge(&decoding, &steps).advice.contains("--decode"));
        // Assembly alone (no transform) is helped by assembling batches in parallel.
        assert_eq!(judged(&setup(), &steps), (Step::Collate, Knob::Prefetch));
        let steps = ladder([2.0, 30.0, 0.1, 1.0], 40.0, 0.9, 16);
        assert_eq!(judged(&setup(), &steps), (Step::Copy, Knob::Copy));
    }

    #[test]
    fn only_a_configured_cache_puts_the_blame_on_the_pipeline() {
        let steps = ladder([2.0, 0.1, 0.1, 10.0], 60.0, 0.9, 1);
        let cached = Setup { cache: true, ..setup() };
        assert_eq!(judged(&cached, &steps), (Step::Pipeline, Knob::CacheSize));
        let v = judge(&setup(), &steps);
        assert_eq!(v.step, Step::Fetch, "without a cache a slower pipeline is the same parts again");
        assert!(v.also.iter().any(|a| a.contains("noise")), "{v:?}");
    }
}
