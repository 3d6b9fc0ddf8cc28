//! `stoker diagnose`: measure each step of the caching ladder and name where the pipeline starves.
//!
//! The ladder itself is `stoker::diagnose`; this module models the two parts only a training
//! program has. The consumer is a step that waits `--step-time` per batch, as a training step
//! waiting on the GPU does (the CPU is free meanwhile). The transform, with
//! `--transform-cost`, is a busy loop over the sample's bytes for that long per sample: real
//! CPU work that competes for cores the way decoding does, not a sleep.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use stoker::diagnose::{diagnose, Consumer, DiagnoseConfig};
use stoker::loader::{HostBuffers, LoaderConfig, Transform};

use crate::error::{CliError, Context, Result};
use crate::units::{parse_duration, parse_size};
use crate::{write_result, SourceArgs};

/// Arguments of `stoker diagnose`.
#[derive(Args)]
#[command(after_help = "Steps, each adding one part: 1 the consumer on one cached batch, 2 + the copy to the GPU \
(a host copy stands in without one), 3 + transform and collation from cached samples, 4 + reading from storage \
with the cache off, 5 the full pipeline as configured. The verdict names the step whose part costs the most time \
per batch, or the consumer when the pipeline keeps up, and the knob that helps.\n\nExample:\n  stoker diagnose \
's3://bucket/train?concurrency=8' --batch 64 --step-time 20ms --transform-cost 1ms")]
pub(crate) struct DiagnoseArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Batches the Loader fetches ahead.
    #[arg(long, default_value_t = 4)]
    prefetch: usize,
    #[command(flatten)]
    shuffle: crate::shuffle::ShuffleArgs,
    /// Your training step's time per batch (e.g. 20ms): the consumer waits that long, as a step
    /// waiting on the GPU does. 0 measures the input side alone.
    #[arg(long, value_parser = parse_duration, default_value = "0ms", value_name = "DURATION")]
    step_time: Duration,
    /// A per-sample transform costing this much CPU per sample (e.g. 2ms): a busy loop over the
    /// sample's bytes, standing in for decoding and augmentation.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    transform_cost: Option<Duration>,
    /// Threads the transform and decoding may use (default: one per core).
    #[arg(long, value_name = "N")]
    transform_threads: Option<usize>,
    /// Decode a field in Rust as the Loader would: `FIELD=KIND[:OPTION...]`, e.g.
    /// `jpg=image:224:flip`, `cls=int`, `text=tokens:tokenizer.json:2048` (repeatable; as
    /// `stoker bench --decode`).
    #[arg(long, value_name = "FIELD=SPEC")]
    decode: Vec<String>,
    /// Bytes the decode threads' images may hold at once, all together (e.g. 2GiB; default:
    /// the loader's bytes in flight, 1 GiB).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    decode_memory: Option<u64>,
    /// The GPU to copy batches to from pinned buffers: a device number, `cpu` for none, or
    /// `auto` (device 0 when a CUDA driver is there and this build has the `cuda` feature).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Samples each step measures, at most.
    #[arg(long, default_value_t = 2048)]
    samples: u64,
    /// Seconds each step may take, at most (a run takes at most about six times this: five
    /// steps and reading the samples the early steps reuse).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: DiagnoseArgs) -> Result<()> {
    let options = args.source.options()?;
    // A duration, too (1e20 s is none: it panicked).
    let max_time = Duration::try_from_secs_f64(args.seconds).ok().filter(|_| args.seconds > 0.0);
    let Some(max_time) = max_time else {
        return Err(CliError::Message(format!("--seconds must be a positive number of seconds, not {}", args.seconds)));
    };
    let mut loader = LoaderConfig::new(args.batch);
    loader.prefetch = args.prefetch;
    loader.order = args.shuffle.order(0)?;
    if let Some(n) = args.transform_threads {
        loader.transform_threads = n;
    }
    loader.transform = args.transform_cost.map(busy_transform);
    if !args.decode.is_empty() {
        loader.decode = Some(stoker::decode::DecodeSpec::from_args(&args.decode)?);
    }
    loader.decode_memory_bytes = args.decode_memory;
    if let Some(device) = device(&args.device)? {
        let src = args.source.open().await?;
        // Pinned buffers sized for the largest of the first samples, with room to spare.
        let mut widest = 0;
        for i in 0..src.len().min(args.batch) {
            widest = widest.max(src.meta(i).await?.total_bytes());
        }
        let batch_bytes = (widest as usize).saturating_mul(args.batch).saturating_mul(2).max(1 << 20);
        loader.host_buffers = Some(HostBuffers::for_batches(Some(device), batch_bytes, 4, args.prefetch));
    }
    let step = args.step_time;
    let consumer: Option<Consumer> = (!step.is_zero()).then(|| {
        Arc::new(move |_: &stoker::batch::Batch| {
            std::thread::sleep(step);
            Ok(())
        }) as Consumer
    });
    let cfg = DiagnoseConfig { loader, consumer, samples: args.samples, max_time };
    if !args.json {
        eprintln!(
            "diagnosing {}: 5 steps of at most {} samples or {} s each",
            stoker::uri::redact(&args.source.uri),
            args.samples,
            args.seconds
        );
    }
    let report = diagnose(&args.source.uri, options, cfg).await?;
    let text = if args.json {
        serde_json::to_string_pretty(&report).context("writing the report as JSON")?
    } else {
        report.to_string()
    };
    write_result(writeln!(std::io::stdout().lock(), "{}", text.trim_end()))
}

/// `--device`: a number, `cpu`, or `auto`.
fn device(arg: &str) -> Result<Option<usize>> {
    match arg {
        "cpu" | "none" => Ok(None),
        "auto" => Ok(stoker::pinned::cuda_driver_available().then_some(0)),
        n => n
            .parse()
            .map(Some)
            .map_err(|_| CliError::Message(format!("--device takes a device number, `cpu` or `auto`, not `{n}`"))),
    }
}

/// A transform that keeps a core busy for `cost` per sample, folding the sample's bytes.
fn busy_transform(cost: Duration) -> Transform {
    Arc::new(move |sample| {
        let started = Instant::now();
        let mut acc = 0u64;
        loop {
            for f in &sample.fields {
                acc = f.data.iter().fold(acc, |a, &b| a.rotate_left(5) ^ u64::from(b));
            }
            if started.elapsed() >= cost {
                break;
            }
        }
        std::hint::black_box(acc);
        Ok(sample)
    })
}
