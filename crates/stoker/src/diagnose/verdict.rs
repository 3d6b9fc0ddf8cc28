//! From the ladder's measurements to a verdict: which step starves the consumer, what helps.

use super::{Knob, Setup, Step, StepResult, Verdict};
use crate::uri::Layout;

/// The input side keeps up when the pipeline delivers at least this share of the consumer's
/// ceiling; below it the consumer waits a quarter of the time or more.
const KEEPS_UP: f64 = 0.75;

/// Files smaller than this are "small": a request costs more than moving its bytes.
const SMALL_FILE: u64 = 1 << 20;

/// The most prefetch the advice suggests; past it memory, not prefetch, is the question.
const MAX_PREFETCH: usize = 64;

fn verdict(step: Step, knob: Knob, advice: String) -> Verdict {
    Verdict { step, knob, advice, also: Vec::new() }
}

pub(super) fn judge(setup: &Setup, steps: &[StepResult]) -> Verdict {
    let get = |s: Step| steps.iter().find(|r| r.step == s);
    let (Some(consumer), Some(pipeline)) = (get(Step::Consumer), get(Step::Pipeline)) else {
        return verdict(Step::Pipeline, Knob::Storage, "the ladder did not complete".into());
    };
    let share = pipeline.samples_per_s / consumer.samples_per_s.max(1e-9);
    let rates = format!("{:.1} of {:.1} samples/s", pipeline.samples_per_s, consumer.samples_per_s);
    if share >= KEEPS_UP {
        return verdict(
            Step::Consumer,
            Knob::Consumer,
            format!(
                "input is not the bottleneck: the consumer is. The full pipeline delivers {:.0}% of what the \
                 consumer can take ({rates}); a faster step, not the input, is what helps.",
                share.min(1.0) * 100.0
            ),
        );
    }
    // One batch at a time, the part that takes the most time per batch is the costliest.
    let Some(worst) = steps
        .iter()
        .filter(|r| r.step != Step::Consumer)
        .max_by(|a, b| a.own_ms_per_batch.total_cmp(&b.own_ms_per_batch))
    else {
        return verdict(Step::Pipeline, Knob::Storage, "the ladder did not complete".into());
    };
    let head = format!(
        "The pipeline delivers {:.0}% of what the consumer can take ({rates}); the {} step's own part takes the \
         most time, {:.2} ms per batch.",
        share * 100.0,
        worst.step,
        worst.own_ms_per_batch
    );
    let mut v = match worst.step {
        Step::Copy => copy(setup, worst),
        Step::Collate => collate(setup, worst),
        Step::Fetch => fetch(setup, worst, get(Step::Collate).unwrap_or(worst)),
        Step::Pipeline | Step::Consumer => pipeline_step(setup, worst),
    };
    v.advice = format!("{head} {}", v.advice);
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
        let advice = if setup.transform_threads < setup.cores {
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

fn fetch(setup: &Setup, r: &StepResult, collate: &StepResult) -> Verdict {
    // What a batch's read costs, one at a time, against what the rest of a batch costs.
    let read_ms = r.own_ms_per_batch.max(0.0);
    let rest_ms = collate.ms_per_batch.max(1e-3);
    let (c, p) = (setup.concurrency as f64, setup.prefetch as f64);
    let mut also = Vec::new();
    let fits_note = |also: &mut Vec<String>| {
        if setup.remote {
            let total = setup.len.saturating_mul(setup.mean_sample_bytes);
            also.push(format!(
                "a cache that holds the data (?cache_bytes={total}, about {} MiB) serves every epoch after the \
                 first from memory",
                total >> 20
            ));
        }
    };
    // Over a network what waits in line is HTTP requests (coalesced ranges); locally, reads.
    let requests =
        r.io.map(|io| if setup.remote { io.remote_requests } else { io.requests })
            .map(|n| n as f64 / r.batches.max(1) as f64)
            .filter(|&n| n >= 1.0);
    let small_files = setup.layout == Layout::Objects && setup.mean_sample_bytes < SMALL_FILE;
    if let Some(per_batch) = requests {
        let rounds = (per_batch / c).ceil().max(1.0);
        let per_request_ms = read_ms / rounds;
        // Little's law: requests in flight needed for reads to keep pace with the rest.
        let needed = per_batch * per_request_ms / rest_ms;
        let in_flight_per_batch = per_batch.min(c);
        if c < per_batch && needed > p * c {
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
                v.also.push(format!(
                    "with prefetch {} that is {} requests at once: raise ?max_in_flight={} too",
                    setup.prefetch,
                    want * setup.prefetch,
                    want * setup.prefetch
                ));
            }
            return v;
        }
        if needed > p * in_flight_per_batch {
            let want = ((needed / in_flight_per_batch).ceil() as usize).clamp(setup.prefetch + 1, MAX_PREFETCH);
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
            let requests_then = (want as f64 * in_flight_per_batch) as usize;
            if setup.remote && requests_then > setup.max_in_flight {
                v.also.push(format!("that is {requests_then} requests at once: raise ?max_in_flight={requests_then}"));
            }
            if small_files {
                v.also.push(
                    "packing the small files into tar shards (stoker pack) makes a batch a few large reads".into(),
                );
            }
            fits_note(&mut v.also);
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
    // Enough is in flight: what each request or byte costs is the limit.
    if small_files {
        fits_note(&mut also);
        let mut v = verdict(
            Step::Fetch,
            Knob::Pack,
            format!(
                "Enough requests are in flight, so each small file's request is the cost (about {} bytes each). \
                 Pack them into tar shards (stoker pack SRC DEST --layout tar): a batch becomes a few large ranged \
                 reads.",
                setup.mean_sample_bytes
            ),
        );
        v.also = also;
        return v;
    }
    if setup.remote {
        let total = setup.len.saturating_mul(setup.mean_sample_bytes);
        return verdict(
            Step::Fetch,
            Knob::CacheSize,
            format!(
                "Enough requests are in flight and the store delivers {:.1} MiB/s: its bandwidth is the limit. A \
                 cache that holds the data (?cache_bytes={total}, about {} MiB, or ?disk_cache_dir=) serves \
                 epochs after the first without it.",
                r.mib_per_s,
                total >> 20
            ),
        );
    }
    verdict(
        Step::Fetch,
        Knob::Storage,
        format!(
            "Enough reads are in flight and the local storage delivers {:.1} MiB/s: the disk is the limit (faster \
             storage, or enough memory for the page cache to hold the data).",
            r.mib_per_s
        ),
    )
}

fn pipeline_step(setup: &Setup, r: &StepResult) -> Verdict {
    if setup.cache {
        return verdict(
            Step::Pipeline,
            Knob::CacheSize,
            "The full pipeline is slower than reading with the cache off: the cache costs more than it saves \
             (too small for the working set, or blocks much larger than the samples). Raise ?cache_bytes, match \
             ?cache_block to the reads, or turn it off."
                .into(),
        );
    }
    verdict(
        Step::Pipeline,
        Knob::Prefetch,
        format!(
            "The Loader is slower ({:.2} ms per batch) than the same work done one batch at a time: prefetch {} \
             (or max_bytes_in_flight) is too small for this batch size.",
            r.ms_per_batch, setup.prefetch
        ),
    )
}
