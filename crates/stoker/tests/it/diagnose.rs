//! `diagnose` names the bottleneck planted in real pipelines: storage latency (the fault proxy
//! in front of the embedded S3 server), a concurrency of 1, an expensive transform, a slow
//! consumer. Each planted effect is many times larger than everything else, so the verdict
//! is a property of relative throughputs, not of how fast this machine is.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use stoker::diagnose::{diagnose, Consumer, DiagnoseConfig, Knob, Report, Step};
use stoker::loader::{LoaderConfig, Transform};
use stoker::SourceOptions;
use stoker_testkit::proxy::{self, FaultPatch, ProxyConfig};
use stoker_testkit::s3::{self, S3ServerConfig};

const AK: &str = "stoker-test-key";
const SK: &str = "s3cr3t-do-not-print";
const FILES: usize = 256;
const FILE_BYTES: usize = 16 << 10;

/// `FILES` objects of `FILE_BYTES` under `data/objects`, and 4 tar shards of the same under
/// `data/tar`.
fn dataset(root: &std::path::Path) {
    let objects = root.join("data/objects");
    std::fs::create_dir_all(&objects).unwrap();
    for i in 0..FILES {
        std::fs::write(objects.join(format!("{i:05}.bin")), payload(i, FILE_BYTES)).unwrap();
    }
    let tar = root.join("data/tar");
    std::fs::create_dir_all(&tar).unwrap();
    for s in 0..4 {
        let samples: Vec<_> =
            (0..FILES / 4).map(|i| sample(&format!("{s}-{i:05}"), &[("bin", payload(i, FILE_BYTES))])).collect();
        write_tar(&tar.join(format!("shard-{s}.tar")), &samples);
    }
}

struct S3 {
    _root: tempfile::TempDir,
    server: stoker_testkit::ServerHandle,
}

async fn s3_dataset() -> S3 {
    let root = tempfile::tempdir().unwrap();
    dataset(root.path());
    let server = s3::serve(S3ServerConfig::new(root.path()).with_credentials(AK, SK)).await.unwrap();
    S3 { _root: root, server }
}

/// The same server behind the fault proxy with `latency_ms` added to every request.
async fn slow(s: &S3, latency_ms: u64) -> proxy::ProxyHandle {
    let p = proxy::serve(ProxyConfig::new(s.server.addr())).await.unwrap();
    p.control.apply(&FaultPatch { latency_ms: Some(latency_ms), ..Default::default() }).unwrap();
    p
}

/// The disk cache is off: it outlives a test, and the steps count requests.
fn uri(endpoint: &str, path: &str, extra: &str) -> String {
    format!("s3://data/{path}?endpoint={endpoint}&access_key_id={AK}&secret_access_key={SK}&disk_cache=false{extra}")
}

/// A training step that waits on the device for `step` (the CPU idles meanwhile).
fn step(step: Duration) -> Consumer {
    Arc::new(move |_batch| {
        std::thread::sleep(step);
        Ok(())
    })
}

/// A decode-like transform: `cost` of CPU work per sample, folding its bytes.
fn costly(cost: Duration) -> Transform {
    Arc::new(move |s| {
        let t = Instant::now();
        let mut acc = 0u64;
        while t.elapsed() < cost {
            for f in &s.fields {
                acc = f.data.iter().fold(acc, |a, &b| a.rotate_left(5) ^ b as u64);
            }
        }
        std::hint::black_box(acc);
        Ok(s)
    })
}

fn config(consumer: Consumer, samples: u64) -> DiagnoseConfig {
    let mut loader = LoaderConfig::new(16);
    loader.prefetch = 4;
    loader.transform_threads = 2;
    DiagnoseConfig { loader, consumer: Some(consumer), samples, max_time: Duration::from_secs(60) }
}

fn check_shape(r: &Report) {
    eprintln!("{r}");
    let steps: Vec<Step> = r.steps.iter().map(|s| s.step).collect();
    assert_eq!(steps, [Step::Consumer, Step::Copy, Step::Collate, Step::Fetch, Step::Pipeline], "{r}");
    for s in &r.steps {
        assert!(s.samples > 0 && s.samples_per_s > 0.0 && s.mib_per_s > 0.0, "{r}");
    }
    assert!(r.setup.copy.contains("host"), "no GPU here: the copy step says it stands in: {}", r.setup.copy);
    assert!(!format!("{r}").contains(SK) && !r.setup.source.contains(SK), "credentials never show");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_latency_is_the_fetch_step_and_prefetch_hides_it() {
    let s = s3_dataset().await;
    // 200 ms per request and few requests in flight: waiting, not the server's CPU, is the
    // cost, even on a loaded machine.
    let p = slow(&s, 200).await;
    let mut cfg = config(step(ms(1)), 64);
    cfg.loader.batch_size = 4;
    let r = diagnose(&uri(&p.endpoint(), "objects", ""), SourceOptions::default(), cfg).await.unwrap();
    check_shape(&r);
    assert_eq!((r.verdict.step, r.verdict.knob), (Step::Fetch, Knob::Prefetch), "{r}");
    assert!(r.verdict.advice.contains("prefetch"), "{r}");
    // Reads really went through the proxy, one request per object.
    let fetch = r.step(Step::Fetch).unwrap();
    assert!(fetch.io.unwrap().remote_requests >= fetch.samples, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_of_one_is_named() {
    let s = s3_dataset().await;
    let p = slow(&s, 10).await;
    let r =
        diagnose(&uri(&p.endpoint(), "objects", "&concurrency=1"), SourceOptions::default(), config(step(ms(2)), 128))
            .await
            .unwrap();
    check_shape(&r);
    assert_eq!(r.setup.concurrency, 1);
    assert_eq!((r.verdict.step, r.verdict.knob), (Step::Fetch, Knob::Concurrency), "{r}");
    assert!(r.verdict.advice.contains("concurrency=16"), "one request per sample of a 16-sample batch: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expensive_transform_is_the_collate_step() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path());
    let mut cfg = config(step(ms(1)), 160);
    cfg.loader.transform = Some(costly(ms(3)));
    let r = diagnose(&format!("{}/data/tar", dir.path().display()), SourceOptions::default(), cfg).await.unwrap();
    check_shape(&r);
    assert_eq!((r.verdict.step, r.verdict.knob), (Step::Collate, Knob::Transform), "{r}");
    let collate = r.step(Step::Collate).unwrap();
    assert!(collate.transform_ms_per_batch.unwrap() > collate.own_ms_per_batch * 0.5, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_is_named() {
    // Local shards: a loaded machine can make even loopback S3 slower than a slow step.
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path());
    let path = format!("{}/data/tar", dir.path().display());
    let r = diagnose(&path, SourceOptions::default(), config(step(ms(100)), 128)).await.unwrap();
    check_shape(&r);
    assert_eq!((r.verdict.step, r.verdict.knob), (Step::Consumer, Knob::Consumer), "{r}");
    assert!(r.verdict.advice.contains("input is not the bottleneck: the consumer is"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fetch_step_really_bypasses_a_configured_cache() {
    let s = s3_dataset().await;
    let cached = "&cache_bytes=67108864&cache_block=65536";
    // A whole epoch per step, so the pipeline's cache sees every block.
    let r = diagnose(&uri(&s.server.endpoint(), "tar", cached), SourceOptions::default(), config(step(ms(0)), 256))
        .await
        .unwrap();
    check_shape(&r);
    assert!(r.setup.cache);
    let fetch = r.step(Step::Fetch).unwrap().io.unwrap();
    assert_eq!((fetch.cache_hits, fetch.cache_misses), (0, 0), "the fetch step never looks in the cache: {fetch:?}");
    assert!(fetch.remote_requests > 0, "{fetch:?}");
    let pipeline = r.step(Step::Pipeline).unwrap().io.unwrap();
    assert!(pipeline.cache_misses > 0, "the pipeline step reads through the configured cache: {pipeline:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_bound_the_run_and_bad_settings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path());
    let path = format!("{}/data/objects", dir.path().display());
    // A 20 ms step cannot get through a million samples in 200 ms: the time limit ends each step.
    let cfg = DiagnoseConfig { max_time: Duration::from_millis(200), ..config(step(ms(20)), 1_000_000) };
    let r = diagnose(&path, SourceOptions::default(), cfg).await.unwrap();
    for s in &r.steps {
        assert!(s.samples < 1_000_000, "{r}");
    }
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["steps"].as_array().unwrap().len(), 5);
    assert!(json["verdict"]["knob"].is_string() && json["setup"]["layout"] == "objects", "{json}");

    let mut zero = config(step(ms(0)), 16);
    zero.loader.batch_size = 0;
    let e = diagnose(&path, SourceOptions::default(), zero).await.unwrap_err();
    assert!(e.to_string().contains("batch_size"), "{e}");
    let e = diagnose(&format!("{path}/nope"), SourceOptions::default(), config(step(ms(0)), 16)).await.unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
    let failing: Consumer = Arc::new(|_| Err(stoker::Error::callback("my step", "the step blew up")));
    let e = diagnose(&path, SourceOptions::default(), config(failing, 16)).await.unwrap_err();
    assert!(e.to_string().contains("the step blew up") && e.to_string().contains("consumer"), "{e}");
    assert_eq!(e.kind(), stoker::ErrorKind::Callback, "{e:?}");
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
