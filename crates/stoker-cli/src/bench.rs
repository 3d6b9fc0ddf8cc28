//! `stoker bench`: read sources through the Loader and report throughput, fetch latency and
//! how long the consumer waited (the GPU-starvation figure).

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use stoker::SourceOptions;

use crate::{load_config, write_result};

/// Arguments of `stoker bench`.
#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Source URIs (same forms as the other commands).
    #[arg(required = true)]
    uris: Vec<String>,
    /// Samples per batch.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Batches fetched ahead.
    #[arg(long, default_value_t = 8)]
    prefetch: usize,
    /// Epochs to read (the first one warms caches and connections).
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Shuffle (a new permutation per epoch) instead of reading in order.
    #[arg(long)]
    shuffle: bool,
    /// Options file for every URI (JSON or TOML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: BenchArgs) -> Result<(), String> {
    let BenchArgs { uris, batch, prefetch, epochs, shuffle, config, json } = args;
    bench(&uris, batch, prefetch, epochs, shuffle, config.as_ref(), json).await
}

async fn bench(
    uris: &[String],
    batch: usize,
    prefetch: usize,
    epochs: u64,
    shuffle: bool,
    config: Option<&PathBuf>,
    json: bool,
) -> Result<(), String> {
    use stoker::loader::{Loader, LoaderConfig};
    let options = match config {
        None => SourceOptions::default(),
        Some(path) => load_config(path)?,
    };
    let mut out = io::stdout().lock();
    if !json {
        let _ = writeln!(
            out,
            "{:<40} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8}",
            "source", "samples/s", "MiB/s", "fetch p50", "fetch p99", "wait %", "retries"
        );
    }
    for uri in uris {
        let src = stoker::open(uri, options.clone()).await.map_err(|e| e.to_string())?;
        let mut cfg = LoaderConfig::new(batch);
        cfg.prefetch = prefetch;
        if shuffle {
            cfg.order = stoker::sampler::Order::Shuffle { seed: 0 };
        }
        let loader = Loader::new(src.clone(), cfg).map_err(|e| e.to_string())?;
        let (mut samples, mut bytes) = (0u64, 0u64);
        let started = Instant::now();
        for epoch in 0..epochs.max(1) {
            let mut stream = loader.epoch(epoch).map_err(|e| e.to_string())?;
            while let Some(b) = stream.next_batch().await {
                let b = b.map_err(|e| e.to_string())?;
                samples += b.len() as u64;
                bytes += b.payload_bytes();
            }
        }
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        let st = loader.stats();
        let row = serde_json::json!({
            "source": src.to_string(), "samples": samples, "samples_per_s": samples as f64 / secs,
            "mib_per_s": bytes as f64 / secs / (1 << 20) as f64, "fetch_p50_ms": st.fetch_p50_ms,
            "fetch_p99_ms": st.fetch_p99_ms, "consumer_wait_fraction": st.consumer_wait_fraction,
            "retries": st.retries, "hedges": st.hedges, "cache_hit_rate": st.cache_hit_rate,
            "peak_bytes_in_flight": st.peak_bytes_in_flight,
        });
        let line = if json {
            row.to_string()
        } else {
            let name: String = src.to_string().chars().take(40).collect();
            format!(
                "{name:<40} {:>10.0} {:>10.1} {:>7.1}ms {:>7.1}ms {:>8.1}% {:>8}",
                samples as f64 / secs,
                bytes as f64 / secs / (1 << 20) as f64,
                st.fetch_p50_ms,
                st.fetch_p99_ms,
                st.consumer_wait_fraction * 100.0,
                st.retries
            )
        };
        if let Err(e) = writeln!(out, "{line}") {
            return write_result(Err(e));
        }
    }
    Ok(())
}
