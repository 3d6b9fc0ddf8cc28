//! `stoker bench`: read sources through the Loader and report throughput, fetch latency, how
//! long the consumer waited (the GPU-starvation figure) and peak memory, against a raw read
//! of the same bytes in the same run.
//!
//! Without URIs it benchmarks an embedded default (bench/demo.rs): a demo dataset in every
//! layout, locally and on a loopback S3 server. Each backend runs in its own child process
//! (bench/worker.rs) so its peak RSS is its own.

#[cfg(feature = "demo")]
mod demo;
mod report;
mod ui;
mod worker;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use report::Row;
use ui::{Ui, Unit};
use worker::{Job, LoaderParams};

use crate::error::{CliError, Context, Result};
use crate::units::{parse_duration, parse_size};

/// Arguments of `stoker bench`.
#[derive(Args)]
#[command(after_help = "Examples:\n  \
stoker bench                                   # the embedded default: ~1 GiB demo, every backend\n  \
stoker bench --samples 2000 --latency 25ms     # smaller, with 25 ms added to every S3 request\n  \
stoker bench --backends s3-tar --latency 25ms --shuffle shards  # shards streamed window by window\n  \
stoker bench --dir ./bench-data --backends tar,s3-tar\n  \
stoker bench ./shards 's3://bucket/train?endpoint=http://localhost:9000' --epochs 2\n  \
stoker bench train.mix.toml --shuffle               # a weighted mix of sources (see the README)")]
pub(crate) struct BenchArgs {
    /// Sources to benchmark (same forms as the other commands). Without any, bench makes a
    /// demo dataset in every layout, serves it from an embedded S3 server on loopback, and
    /// benchmarks each backend against a raw read of the same bytes.
    uris: Vec<String>,
    /// Samples per batch.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Batches fetched ahead.
    #[arg(long, default_value_t = 8)]
    prefetch: usize,
    /// Epochs to read per backend (all are timed; the first includes connection set-up).
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    #[command(flatten)]
    shuffle: crate::shuffle::ShuffleArgs,
    /// Simulated training step per batch (e.g. 20ms): the loader reads ahead meanwhile, and
    /// `wait %` then says how much of the time such a consumer would starve.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "0ms")]
    step: Duration,
    /// Options file for every source (JSON or TOML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Decode a field on the loader's threads, as training would: `FIELD=KIND[:OPTION...]`,
    /// e.g. `jpg=image:224:flip` (random-resized crop), `jpg=image:224:center`, `cls=int`,
    /// `x=npy`, `text=tokens:tokenizer.json:2048:eos=<|endoftext|>` (repeatable; see
    /// `stoker::decode::DecodeSpec::from_args`).
    #[arg(long, value_name = "FIELD=SPEC")]
    decode: Vec<String>,
    /// Bytes the decode threads' images may hold at once, all together (e.g. 2GiB; default:
    /// the loader's bytes in flight, 1 GiB).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    decode_memory: Option<u64>,
    /// Print JSON lines (one for the run: machine, parameters, dataset; one per backend).
    #[arg(long)]
    json: bool,
    /// Demo: number of samples (default: about 1 GiB's worth).
    #[arg(long)]
    samples: Option<u64>,
    /// Demo: bytes per sample, default 64KiB (K/KiB, M/MiB: powers of 1024; KB, MB: of 1000).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    size: Option<u64>,
    /// Demo: keep the dataset in DIR (reused by later runs with the same --samples/--size)
    /// instead of a temporary directory removed at the end.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Demo: latency added to every S3 request by a proxy in front of the server (e.g. 25ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    latency: Option<Duration>,
    /// Demo: the rate of one network link every S3 response shares, per second, through the
    /// proxy (e.g. 512MiB for 512 MiB/s). Without it the S3 rows' bound is what the cores
    /// allow the server, the proxy and the reader together; with it, the link, as for a node
    /// reading from a store over its network.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    link: Option<u64>,
    /// Demo: which rows to run, comma-separated (default all): raw, files, tar, lmdb,
    /// s3-bound, s3-objects, s3-tar.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    backends: Vec<String>,
    /// Internal: measure one backend in this process and report to the parent.
    #[arg(long, hide = true)]
    worker: Option<WorkerKind>,
}

#[derive(Clone, Copy, ValueEnum)]
enum WorkerKind {
    Loader,
    Raw,
    Bound,
}

const DEMO_BACKENDS: [&str; 7] = ["raw", "files", "tar", "lmdb", "s3-bound", "s3-objects", "s3-tar"];
const DEFAULT_SAMPLE_BYTES: u64 = 64 << 10;
const DEFAULT_DEMO_BYTES: u64 = 1 << 30;

pub(crate) async fn run(args: BenchArgs) -> Result<()> {
    let params = LoaderParams {
        batch: args.batch,
        prefetch: args.prefetch,
        epochs: args.epochs.max(1),
        shuffle: args.shuffle.clone(),
        step: args.step,
        config: args.config.clone(),
        decode: args.decode.clone(),
        decode_memory: args.decode_memory,
    };
    if !args.decode.is_empty() {
        stoker::decode::DecodeSpec::from_args(&args.decode)?;
    }
    params.shuffle.order(0)?;
    if args.batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    if let Some(kind) = args.worker {
        let [target] = args.uris.as_slice() else {
            return Err("--worker takes exactly one source".into());
        };
        return match kind {
            WorkerKind::Loader => worker::loader_child(target, &params).await,
            WorkerKind::Raw => {
                let (dir, samples, epochs) = (PathBuf::from(target), args.samples.unwrap_or(0), params.epochs);
                tokio::task::spawn_blocking(move || worker::raw_child(&dir, samples, epochs))
                    .await
                    .context("the raw read stopped")?
            }
            WorkerKind::Bound => worker::bound_child(target, args.samples.unwrap_or(0), params.epochs).await,
        };
    }
    let ui = Ui::new();
    // Ctrl-C drops the run: children are killed (kill_on_drop) and the temporary dataset removed.
    tokio::select! {
        r = orchestrate(&args, &params, &ui) => r,
        _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
    }
}

async fn orchestrate(args: &BenchArgs, params: &LoaderParams, ui: &Ui) -> Result<()> {
    let machine = report::Machine::here();
    if args.uris.is_empty() {
        if !args.decode.is_empty() {
            return Err("--decode needs sources that hold images or labels (the demo's samples are random bytes): \
                        `stoker bench ./shards --decode jpg=image:224 --decode cls=int`"
                .into());
        }
        #[cfg(feature = "demo")]
        return demo_run(args, params, ui, machine).await;
        #[cfg(not(feature = "demo"))]
        return Err(
            "this build of stoker has no embedded demo (cargo feature `demo`): give the sources to benchmark".into()
        );
    }
    let demo_only = [
        ("--samples", args.samples.is_some()),
        ("--size", args.size.is_some()),
        ("--dir", args.dir.is_some()),
        ("--latency", args.latency.is_some()),
        ("--link", args.link.is_some()),
        ("--backends", !args.backends.is_empty()),
    ];
    if let Some((flag, _)) = demo_only.iter().find(|(_, set)| *set) {
        return Err(CliError::Message(format!(
            "{flag} applies to the embedded demo only; run `stoker bench` without sources to use it"
        )));
    }
    // Every URI is checked before anything runs, so a typo in the last one fails at once.
    let mut named = Vec::new();
    for uri in &args.uris {
        // An inline mix is no URI the parser knows (its JSON holds URIs of its own): it is
        // checked when opened, and shown redacted.
        if uri.starts_with("mix:{") {
            named.push((stoker::uri::redact(uri), uri.clone()));
            continue;
        }
        let parsed = stoker::uri::parse(uri)?;
        named.push((parsed.display, uri.clone()));
    }
    let mut rows = Vec::new();
    for (name, uri) in named {
        let bar = ui.bar(&short(&name), 0, Unit::Samples);
        bar.set_message("opening");
        let m = worker::run_child(&Job::Loader(uri), params, &bar, &[])
            .await
            .with_context(|| format!("benchmarking {name}"))?;
        bar.finish_with_message(format!("{:.0} samples/s", m.samples as f64 / m.seconds.max(1e-9)));
        rows.push(Row { backend: name, m, proxy_requests: None });
    }
    let run = report::Run { machine, params: params.clone(), demo: None };
    report::print(&run, &rows, args.json)
}

/// A bar label: the source without its options, cut to its last 24 characters.
fn short(name: &str) -> String {
    let name = name.split('?').next().unwrap_or(name);
    let n: Vec<char> = name.chars().collect();
    if n.len() <= 24 {
        name.to_string()
    } else {
        format!("...{}", n[n.len() - 21..].iter().collect::<String>())
    }
}

#[cfg(feature = "demo")]
async fn demo_run(args: &BenchArgs, params: &LoaderParams, ui: &Ui, machine: report::Machine) -> Result<()> {
    let size = args.size.unwrap_or(DEFAULT_SAMPLE_BYTES);
    if size == 0 {
        return Err("--size must be at least 1 byte".into());
    }
    let samples = args.samples.unwrap_or((DEFAULT_DEMO_BYTES / size).max(1));
    if samples == 0 {
        return Err("--samples must be at least 1".into());
    }
    let wanted: Vec<&str> = if args.backends.is_empty() {
        DEMO_BACKENDS.to_vec()
    } else {
        for b in &args.backends {
            if !DEMO_BACKENDS.contains(&b.as_str()) {
                return Err(CliError::Message(format!(
                    "unknown backend {b:?} in --backends; choose from {}",
                    DEMO_BACKENDS.join(", ")
                )));
            }
        }
        DEMO_BACKENDS.iter().copied().filter(|b| args.backends.iter().any(|x| x == b)).collect()
    };
    let spec = demo::Spec { samples, size };
    let latency_ms = args.latency.map(|d| d.as_millis() as u64);
    if latency_ms.is_some_and(|ms| ms > stoker_testkit::proxy::MAX_DELAY_MS) {
        return Err(CliError::Message(format!(
            "--latency is at most {} s",
            stoker_testkit::proxy::MAX_DELAY_MS / 1000
        )));
    }
    // The proxy paces in whole MiB/s: another rate would be changed without a word.
    if let Some(b) = args.link.filter(|&b| b == 0 || b % (1 << 20) != 0) {
        return Err(CliError::Message(format!(
            "--link is a whole number of MiB a second, at least 1MiB (e.g. 512MiB), got {b} bytes"
        )));
    }
    let link_mib_s = args.link.map(|b| b >> 20);
    ui.note(&format!(
        "demo dataset: {samples} samples x {} = {}, in {}; {} cores",
        crate::human_bytes(size),
        crate::human_bytes(spec.total_bytes()),
        args.dir.as_ref().map_or("a temporary directory".to_string(), |d| d.display().to_string()),
        machine.cores
    ));
    let mut data = demo::prepare(spec, args.dir.as_deref(), ui).await?;
    if data.reused {
        ui.note(&format!("reusing the dataset in {}", data.root.display()));
    }
    let servers = demo::serve(&mut data, latency_ms, link_mib_s, ui).await?;
    let mut rows = Vec::new();
    let result = async {
        for name in wanted {
            let (job, remote) = match name {
                "raw" => (Job::Raw { dir: data.tar(), samples }, false),
                "files" => (Job::Loader(data.files().display().to_string()), false),
                "tar" => (Job::Loader(data.tar().display().to_string()), false),
                "lmdb" => (Job::Loader(data.lmdb().display().to_string()), false),
                "s3-bound" => (Job::Bound { uri: servers.uri("tar"), samples }, true),
                "s3-objects" => (Job::Loader(servers.uri("objects")), true),
                _ => (Job::Loader(servers.uri("tar")), true),
            };
            let bar = ui.bar(name, samples * params.epochs, Unit::Samples);
            bar.set_message("opening");
            servers.reset_proxy_count();
            // The demo's keys are in the URI; a session token from the user's environment
            // would be sent with them and spoil the signature.
            let m = worker::run_child(&job, params, &bar, &["AWS_SESSION_TOKEN"])
                .await
                .with_context(|| format!("benchmarking {name}"))?;
            bar.finish_with_message(format!("{:.0} samples/s", m.samples as f64 / m.seconds.max(1e-9)));
            let proxy_requests = if remote { servers.proxy_requests() } else { None };
            rows.push(Row { backend: name.to_string(), m, proxy_requests });
        }
        Ok::<(), CliError>(())
    }
    .await;
    let described = servers.describe();
    servers.shutdown().await;
    result?;
    let run = report::Run {
        machine,
        params: params.clone(),
        demo: Some(report::Demo {
            samples,
            sample_bytes: size,
            dir: data.root.clone(),
            kept: data.kept,
            reused: data.reused,
            write_s: data.write_s,
            upload_s: data.upload_s,
            servers: described,
            latency_ms,
            link_mib_s,
        }),
    };
    report::print(&run, &rows, args.json)?;
    if !data.kept {
        // Several GiB of files: on a busy disk removing them takes a while; say why we linger.
        ui.note(&format!("removing the demo dataset in {}", data.root.display()));
    }
    drop(data);
    Ok(())
}
