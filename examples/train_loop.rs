//! A training loop fed by Stoker: shuffled, rank-partitioned batches prefetched into pooled
//! host buffers and, in a `cuda` build on a machine with a GPU, copied to the device on their
//! own stream while the previous step runs. Without a GPU it takes the CPU path with the same
//! code. It checkpoints the loader's position and resumes from it.
//!
//! ```text
//! cargo run --release -p stoker-examples --example train_loop -- [URI] [--epochs 2] [--batch 64]
//!     [--step-ms 5] [--cpu] [--checkpoint state.json] [--every 20]
//!     [--demo-samples 4096] [--demo-kib 16] [--verify]
//! cargo run --release -p stoker-examples --features cuda --example train_loop -- URI   # GPU
//! ```
//!
//! With no URI it writes a small demo dataset (tar shards) to a temporary directory first
//! (`--demo-samples` of `--demo-kib` KiB each). `--verify` reads every device batch back from
//! the GPU and compares it with the host batch it was copied from (slow: a check, not a bench).
//! Under `torchrun`-style launchers it reads `RANK`/`WORLD_SIZE` and takes its share.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stoker::loader::{HostBuffers, Loader, LoaderConfig, LoaderState};
use stoker::sampler::{Order, Partition};
use stoker::{DynSampleSource, SourceOptions};

#[path = "common/demo.rs"]
mod demo;

struct Args {
    uri: Option<String>,
    epochs: u64,
    batch: usize,
    step: Duration,
    cpu: bool,
    checkpoint: Option<PathBuf>,
    every: u64,
    demo_samples: usize,
    demo_kib: usize,
    verify: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        uri: None,
        epochs: 2,
        batch: 64,
        step: Duration::from_millis(5),
        cpu: false,
        checkpoint: None,
        every: 20,
        demo_samples: 4096,
        demo_kib: 16,
        verify: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--epochs" => a.epochs = value("--epochs")?.parse().map_err(|e| format!("--epochs: {e}"))?,
            "--batch" => a.batch = value("--batch")?.parse().map_err(|e| format!("--batch: {e}"))?,
            "--step-ms" => {
                a.step = Duration::from_millis(value("--step-ms")?.parse().map_err(|e| format!("--step-ms: {e}"))?)
            }
            "--cpu" => a.cpu = true,
            "--verify" => a.verify = true,
            "--demo-samples" => {
                a.demo_samples = value("--demo-samples")?.parse().map_err(|e| format!("--demo-samples: {e}"))?
            }
            "--demo-kib" => a.demo_kib = value("--demo-kib")?.parse().map_err(|e| format!("--demo-kib: {e}"))?,
            "--checkpoint" => a.checkpoint = Some(PathBuf::from(value("--checkpoint")?)),
            "--every" => a.every = value("--every")?.parse().map_err(|e| format!("--every: {e}"))?,
            s if s.starts_with("--") => return Err(format!("unknown flag {s}")),
            s => a.uri = Some(s.to_owned()),
        }
    }
    Ok(a)
}

/// Write the loader's position next to the model's checkpoint; temp file and rename, so a
/// crash mid-write leaves the previous checkpoint intact.
fn save_state(path: &Path, state: &LoaderState) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let json = serde_json::to_vec(state).map_err(|e| e.to_string())?;
    std::fs::write(&tmp, json)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Stand-in for the model's forward and backward pass: touch every byte (so a lazily
/// filled buffer would show), then "compute" for `step`.
fn cpu_step(batch: &stoker::batch::Batch, step: Duration) -> u64 {
    let sum = batch.fields().map(|c| c.data.iter().map(|&b| b as u64).sum::<u64>()).sum();
    std::thread::sleep(step);
    sum
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let args = parse_args()?;
    let _demo_dir;
    let uri = match &args.uri {
        Some(u) => u.clone(),
        None => {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            demo::write(dir.path(), args.demo_samples, args.demo_kib << 10, false)
                .map_err(|e| format!("writing demo data: {e}"))?;
            let uri = dir.path().join("tar").display().to_string();
            eprintln!("no URI given: wrote {} demo samples of {} KiB to {uri}", args.demo_samples, args.demo_kib);
            _demo_dir = dir;
            uri
        }
    };
    let source: Arc<DynSampleSource> = stoker::open(&uri, SourceOptions::default()).await.map_err(|e| e.to_string())?;

    // The GPU path when this build has `cuda` and a driver answers; otherwise plain host memory.
    let device = (!args.cpu && stoker::pinned::cuda_driver_available()).then_some(0);
    let mut cfg = LoaderConfig::new(args.batch);
    cfg.order = Order::Shuffle { seed: 17 };
    cfg.partition = Partition::from_env().map_err(|e| e.to_string())?;
    cfg.prefetch = 8;
    cfg.drop_last = true;
    // Size the pooled buffers from the first sample: a batch column must fit in one buffer.
    let sample_bytes =
        source.meta(0).await.map_err(|e| e.to_string())?.fields.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let fields = source.meta(0).await.map_err(|e| e.to_string())?.fields.len();
    cfg.host_buffers =
        Some(HostBuffers::for_batches(device, (sample_bytes as usize) * args.batch, fields, cfg.prefetch));
    let loader = Loader::new(source.clone(), cfg).map_err(|e| e.to_string())?;
    eprintln!(
        "{source}: {} samples, {} batches per epoch, {}",
        source.len(),
        loader.batches_per_epoch().map_err(|e| e.to_string())?,
        match device {
            Some(d) => format!("copying batches to cuda:{d}"),
            None => "CPU path (no `cuda` build or no GPU driver)".to_owned(),
        }
    );

    let mut first_epoch = 0;
    if let Some(path) = args.checkpoint.as_ref().filter(|p| p.exists()) {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let state: LoaderState = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        loader.load_state(state).map_err(|e| e.to_string())?;
        first_epoch = loader.resume_epoch().unwrap_or(0);
        eprintln!("resuming epoch {first_epoch} from {}", path.display());
    }

    let started = Instant::now();
    let mut samples = 0u64;
    let mut bytes = 0u64;
    let mut verified = 0u64;
    let mut checksum = 0u64;
    for epoch in first_epoch..args.epochs {
        let mut stream = loader.epoch(epoch).map_err(|e| e.to_string())?;
        let mut steps = 0u64;
        while let Some(batch) = stream.next_batch().await {
            let batch = batch.map_err(|e| e.to_string())?;
            if device.is_some() {
                // The copy was queued on Stoker's copy stream while this batch waited in the
                // prefetch queue. A real trainer makes its compute stream wait on the copy's
                // event (`DeviceBatch::stream_wait`) instead of blocking the host here.
                for name in batch.field_names().collect::<Vec<_>>() {
                    if let Some(dev) = batch.device(name) {
                        dev.wait().map_err(|e| e.to_string())?;
                        if args.verify {
                            verified += verify(&batch, name, dev)?;
                        }
                    }
                }
                std::thread::sleep(args.step);
            } else {
                checksum = checksum.wrapping_add(cpu_step(&batch, args.step));
            }
            samples += batch.len() as u64;
            bytes += batch.fields().map(|c| c.data.len() as u64).sum::<u64>();
            steps += 1;
            if let Some(path) = &args.checkpoint {
                if steps.is_multiple_of(args.every.max(1)) {
                    save_state(path, &loader.state().ok_or("the loader has no position to save")?)?;
                }
            }
        }
        let st = loader.stats();
        eprintln!(
            "epoch {epoch}: {steps} steps, GPU-side wait {:.1}% of the time, fetch p99 {:.1} ms",
            st.consumer_wait_fraction * 100.0,
            st.fetch_p99_ms
        );
    }
    if let Some(path) = &args.checkpoint {
        // The run finished: the next start begins a fresh run rather than resuming.
        let _ = std::fs::remove_file(path);
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{samples} samples in {secs:.2} s ({:.0} samples/s, {:.2} GB/s), checksum {checksum:x}",
        samples as f64 / secs.max(1e-9),
        bytes as f64 / secs.max(1e-9) / 1e9
    );
    if args.verify {
        if device.is_none() {
            return Err("--verify checks device batches, and this run copied none to a GPU".to_owned());
        }
        println!("verified {verified} bytes read back from the GPU against the host batches");
    }
    Ok(())
}

/// Read field `name`'s device copy back and compare it with the host bytes it came from.
#[cfg(feature = "cuda")]
fn verify(batch: &stoker::batch::Batch, name: &str, dev: &stoker::pinned::DeviceBatch) -> Result<u64, String> {
    let host = batch.fields().find(|c| c.name == name).ok_or_else(|| format!("no host column {name}"))?;
    // The primary context of device 0, the one Stoker's copier uses, so the pointer is valid here.
    let ctx = cudarc::driver::CudaContext::new(0).map_err(|e| e.to_string())?;
    let stream = ctx.default_stream();
    let back = stream.clone_dtoh(&dev.view()).map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())?;
    if back.as_slice() != host.data {
        let at = back.iter().zip(host.data.iter()).position(|(a, b)| a != b).unwrap_or(back.len().min(host.data.len()));
        return Err(format!("field {name}: device copy differs from the host batch at byte {at}"));
    }
    Ok(back.len() as u64)
}

#[cfg(not(feature = "cuda"))]
fn verify(_: &stoker::batch::Batch, _: &str, _: &stoker::pinned::DeviceBatch) -> Result<u64, String> {
    Err("--verify needs the `cuda` feature".to_owned())
}
