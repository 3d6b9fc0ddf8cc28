//! Local read benchmark: every sample of a dataset through the `SampleSource` trait, with
//! many batched requests in flight, next to a raw sequential read of the same files in the
//! same run.
//!
//! ```text
//! cargo run --release -p stoker-examples --example local_bench            # 64 KiB and 1 KiB samples
//! cargo run --release -p stoker-examples --example local_bench -- --size 65536 --count 8192
//! ```
//!
//! It writes the dataset in every layout (tar shards, LMDB, one file per sample) to a temp
//! directory, reads each once to warm the page cache, then times `--reps` passes and reports
//! the median. "x raw" is the median over passes of payload MiB/s through the trait divided by
//! the MiB/s of reading the files that hold it right after, sequentially with one reused
//! buffer (the fastest plain read).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use stoker::DynSampleSource;

#[path = "common/demo.rs"]
#[allow(dead_code)] // this benchmark writes its own layouts; it shares the payloads
mod demo;
use demo::payload;

struct Config {
    sizes: Vec<(usize, usize)>,
    batch: usize,
    inflight: usize,
    reps: usize,
    max_files: usize,
    dir: Option<PathBuf>,
}

fn parse_args() -> Result<Config, String> {
    let mut cfg = Config { sizes: vec![], batch: 256, inflight: 8, reps: 5, max_files: 20_000, dir: None };
    let (mut size, mut count) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--rss-of" {
            // Child mode: one loader epoch over URI in a fresh process; print peak RSS.
            let uri = args.next().ok_or("--rss-of needs a URI")?;
            cfg.dir = Some(PathBuf::from(uri));
            cfg.sizes = vec![];
            cfg.reps = 0;
            continue;
        }
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let num = |s: String| s.replace('_', "").parse::<usize>().map_err(|e| format!("{s}: {e}"));
        match a.as_str() {
            "--size" => size = Some(num(val("--size")?)?),
            "--count" => count = Some(num(val("--count")?)?),
            "--batch" => cfg.batch = num(val("--batch")?)?.max(1),
            "--inflight" => cfg.inflight = num(val("--inflight")?)?.max(1),
            "--reps" => cfg.reps = num(val("--reps")?)?.max(1),
            "--max-files" => cfg.max_files = num(val("--max-files")?)?,
            "--dir" => cfg.dir = Some(PathBuf::from(val("--dir")?)),
            "-h" | "--help" => {
                println!(
                    "local_bench [--size BYTES --count N] [--batch 256] [--inflight 8] [--reps 5] [--max-files 20000] [--dir DIR]\n\
                     Without --size/--count: 4096 x 64 KiB and 262144 x 1 KiB (256 MiB each).\n\
                     Rows `+L` read the same data through the full Loader (budget 256 MiB in flight)."
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}; see --help")),
        }
    }
    cfg.sizes = match (size, count) {
        (Some(s), Some(c)) => vec![(s, c)],
        (Some(s), None) => vec![(s, (256 << 20) / s.max(1))],
        (None, Some(c)) => vec![(64 << 10, c)],
        (None, None) => vec![(64 << 10, 4096), (1 << 10, 262_144)],
    };
    Ok(cfg)
}

/// Write `count` samples of `size` bytes as tar shards (~64 MiB each), LMDB and files.
fn write_dataset(root: &Path, size: usize, count: usize, max_files: usize) -> std::io::Result<()> {
    let tar_dir = root.join("tar");
    std::fs::create_dir_all(&tar_dir)?;
    let per_shard = ((64 << 20) / (size + 1024)).max(1);
    for (s, chunk) in (0..count).collect::<Vec<_>>().chunks(per_shard).enumerate() {
        let mut b = tar::Builder::new(std::io::BufWriter::new(std::fs::File::create(
            tar_dir.join(format!("shard-{s:06}.tar")),
        )?));
        for &i in chunk {
            let mut h = tar::Header::new_gnu();
            h.set_size(size as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, format!("{i:09}.bin"), &payload(i, size)[..])?;
        }
        b.into_inner()?;
    }

    let lmdb_dir = root.join("lmdb");
    std::fs::create_dir_all(&lmdb_dir)?;
    let map = (count * (size + 256) * 2).max(64 << 20);
    let env = unsafe { heed::EnvOpenOptions::new().map_size(map).open(&lmdb_dir) }.map_err(std::io::Error::other)?;
    let w = env.write_txn().map_err(std::io::Error::other)?;
    type B = heed::types::Bytes;
    let db: heed::Database<B, B> = env
        .create_databases_and_commit(w, |wdo, wtxn| {
            wdo.create_database::<B, B>(wtxn, None).map(heed::CommitOrAbort::<_, ()>::Commit)
        })
        .map_err(std::io::Error::other)?
        .unwrap_commit();
    let mut w = env.write_txn().map_err(std::io::Error::other)?;
    for i in 0..count {
        db.put(&mut w, format!("{i:09}").as_bytes(), &payload(i, size)).map_err(std::io::Error::other)?;
    }
    w.commit().map_err(std::io::Error::other)?;
    drop(env);
    let _ = std::fs::remove_file(lmdb_dir.join("lock.mdb"));

    let files = root.join("files");
    for i in 0..count.min(max_files) {
        let d = files.join(format!("{:04}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&d)?;
        }
        std::fs::write(d.join(format!("{i:09}.bin")), payload(i, size))?;
    }
    Ok(())
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if !p.to_string_lossy().ends_with(".stoker-idx.json") && !p.ends_with("lock.mdb") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Sequential read of every file with one reused 4 MiB buffer; returns (bytes, time).
fn raw_read(files: &[PathBuf]) -> (u64, Duration) {
    let mut buf = vec![0u8; 4 << 20];
    let mut total = 0u64;
    let t = Instant::now();
    for f in files {
        let mut file = std::fs::File::open(f).expect("open dataset file");
        loop {
            let n = file.read(&mut buf).expect("read dataset file");
            if n == 0 {
                break;
            }
            total += n as u64;
        }
    }
    (total, t.elapsed())
}

/// Read one epoch through the full Loader (batches assembled into recycled columnar storage).
fn loader_pass(loader: &stoker::loader::Loader, epoch: u64) -> (u64, u64, Duration) {
    let t = Instant::now();
    let (mut samples, mut bytes) = (0, 0);
    for b in loader.epoch_blocking(epoch).expect("epoch") {
        let b = b.expect("batch");
        samples += b.len() as u64;
        bytes += b.payload_bytes();
    }
    (samples, bytes, t.elapsed())
}

/// A memory figure of this process from /proc/self/status (Linux), in MiB.
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

/// Start a new peak-RSS measurement (writing 5 to clear_refs resets VmHWM).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Read every sample once through `get_many`, `inflight` batches at a time.
async fn pass(src: &Arc<DynSampleSource>, batch: usize, inflight: usize) -> (u64, u64, Duration) {
    let n = src.len();
    let t = Instant::now();
    let batches: Vec<Vec<usize>> = (0..n).collect::<Vec<_>>().chunks(batch).map(|c| c.to_vec()).collect();
    let (samples, bytes) = futures::stream::iter(batches.into_iter().map(|b| {
        let src = src.clone();
        // Each batch is its own task so batches run on both cores, as a loader would.
        tokio::spawn(async move { src.get_many(&b).await })
    }))
    .buffer_unordered(inflight)
    .map(|r| r.expect("batch task"))
    .try_fold((0u64, 0u64), |(s, b), got| async move {
        Ok((s + got.len() as u64, b + got.iter().map(|x| x.total_bytes()).sum::<u64>()))
    })
    .await
    .expect("read pass");
    (samples, bytes, t.elapsed())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn mib(b: u64, d: Duration) -> f64 {
    b as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let cfg = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if cfg.reps == 0 {
        let uri = cfg.dir.clone().unwrap_or_default();
        let src = stoker::open(uri.to_str().unwrap_or_default(), Default::default()).await.expect("open");
        let mut lcfg = stoker::loader::LoaderConfig::new(cfg.batch);
        lcfg.prefetch = cfg.inflight;
        lcfg.max_bytes_in_flight = 256 << 20;
        let loader = stoker::loader::Loader::new(src, lcfg).expect("loader");
        tokio::task::block_in_place(|| loader_pass(&loader, 0));
        println!("{:.0} {:.0}", peak_rss_mib(), status_mib("RssFile:"));
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "stoker local_bench: {cores} cores, batch {} x {} in flight, median of {} passes",
        cfg.batch, cfg.inflight, cfg.reps
    );
    for &(size, count) in &cfg.sizes {
        let tmp = tempfile::tempdir_in(cfg.dir.clone().unwrap_or_else(std::env::temp_dir)).expect("temp dir");
        let t = Instant::now();
        write_dataset(tmp.path(), size, count, cfg.max_files).expect("write dataset");
        println!(
            "\n{count} samples x {size} B ({:.0} MiB) written in {:.1} s to {}",
            (size * count) as f64 / (1 << 20) as f64,
            t.elapsed().as_secs_f64(),
            tmp.path().display()
        );
        println!(
            "{:<8} {:>9} {:>12} {:>10} {:>10} {:>8} {:>10}",
            "layout", "samples", "samples/s", "MiB/s", "raw MiB/s", "x raw", "open ms"
        );
        for layout in ["tar", "lmdb", "files"] {
            let dir = tmp.path().join(layout);
            let t = Instant::now();
            let src = stoker::open(dir.to_str().unwrap(), Default::default()).await.expect("open");
            let open_ms = t.elapsed().as_secs_f64() * 1e3;
            let files = files_under(&dir);
            pass(&src, cfg.batch, cfg.inflight).await; // warm the page cache and mappings
            raw_read(&files);
            let mut ours = Vec::new();
            let mut raws = Vec::new();
            let (mut samples, mut bytes, mut raw_bytes) = (0, 0, 0);
            for _ in 0..cfg.reps {
                let (s, b, d) = pass(&src, cfg.batch, cfg.inflight).await;
                let (rb, rd) = raw_read(&files);
                (samples, bytes, raw_bytes) = (s, b, rb);
                ours.push(d);
                raws.push(rd);
            }
            // Each pass is paired with the raw read right after it, so drift in the machine's
            // speed (frequent on shared VMs) hits both sides of a ratio alike.
            let mut ratios: Vec<f64> =
                ours.iter().zip(&raws).map(|(d, rd)| mib(bytes, *d) / mib(raw_bytes, *rd)).collect();
            ratios.sort_by(f64::total_cmp);
            let (d, rd) = (median(ours), median(raws));
            println!(
                "{layout:<8} {samples:>9} {:>12.0} {:>10.0} {:>10.0} {:>7.2}x {:>10.1}",
                samples as f64 / d.as_secs_f64(),
                mib(bytes, d),
                mib(raw_bytes, rd),
                ratios[ratios.len() / 2],
                open_ms
            );
            if layout == "files" {
                continue;
            }
            // The same data through the full Loader, from a plain thread as a training loop.
            let mut lcfg = stoker::loader::LoaderConfig::new(cfg.batch);
            lcfg.prefetch = cfg.inflight;
            lcfg.max_bytes_in_flight = 256 << 20;
            let loader = stoker::loader::Loader::new(src.clone(), lcfg).expect("loader");
            let rows = tokio::task::block_in_place(|| {
                loader_pass(&loader, 0);
                reset_peak_rss();
                let before = status_mib("VmRSS:");
                let mut ratios = Vec::new();
                let mut times = Vec::new();
                let mut last = (0, 0);
                for e in 0..cfg.reps as u64 {
                    let (s, b, d) = loader_pass(&loader, e + 1);
                    let (rb, rd) = raw_read(&files);
                    ratios.push(mib(b, d) / mib(rb, rd));
                    times.push(d);
                    last = (s, b);
                }
                ratios.sort_by(f64::total_cmp);
                (last, median(times), ratios[ratios.len() / 2], peak_rss_mib() - before)
            });
            let ((s, b), d, ratio, _) = rows;
            // Peak memory of a fresh process running one loader epoch (RssFile: mapped files,
            // i.e. LMDB pages, which are page cache rather than memory the loader holds).
            let child = std::process::Command::new(std::env::current_exe().expect("own path"))
                .args(["--rss-of", dir.to_str().unwrap(), "--batch", &cfg.batch.to_string()])
                .args(["--inflight", &cfg.inflight.to_string()])
                .output()
                .expect("run child");
            let rss = String::from_utf8_lossy(&child.stdout).trim().to_string();
            let (peak, file) = rss.split_once(' ').unwrap_or((&rss, "?"));
            println!(
                "{:<8} {s:>9} {:>12.0} {:>10.0} {:>10} {:>7.2}x {:>10}   one-epoch process peak RSS {peak} MiB ({file} MiB mapped file)",
                format!("{layout}+L"),
                s as f64 / d.as_secs_f64(),
                mib(b, d),
                "",
                ratio,
                ""
            );
        }
    }
    println!("\npeak RSS of this process: {:.0} MiB (datasets are written by this process too)", peak_rss_mib());
}
