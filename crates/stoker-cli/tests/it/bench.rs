//! `stoker bench` end to end: the real binary, its child processes, the embedded S3 server
//! and the latency proxy, on tiny datasets.

use std::path::Path;

use serde_json::Value;

use crate::common;
use common::{shards, stoker, text};

const ALL: [&str; 7] = ["raw", "files", "tar", "lmdb", "s3-bound", "s3-objects", "s3-tar"];

/// The run object and the rows of a `--json` run that must have succeeded.
fn json_run(args: &[&str]) -> (Value, Vec<Value>) {
    let out = stoker(args);
    assert!(out.status.success(), "stoker {args:?} failed: {}", text(&out.stderr));
    let mut lines = text(&out.stdout).lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).collect::<Vec<_>>();
    assert!(!lines.is_empty(), "no output");
    let run = lines.remove(0);
    assert_eq!(run["type"], "run", "{run}");
    assert!(lines.iter().all(|r| r["type"] == "row"), "{lines:?}");
    (run, lines)
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Figures every row must satisfy, whatever the backend.
fn check_row(r: &Value, samples: u64) {
    let name = &r["backend"];
    assert_eq!(r["samples"], samples, "{name}: every sample, once per epoch");
    let secs = f(r, "seconds");
    assert!(secs > 0.0, "{r}");
    assert!(close(f(r, "samples_per_s"), samples as f64 / secs), "{r}");
    assert!(close(f(r, "mib_per_s"), f(r, "bytes") / secs / (1 << 20) as f64), "{r}");
    assert!(f(r, "peak_rss_mib") > 0.0, "{name}: peak RSS of its own process: {r}");
    let epochs: Vec<f64> = r["epoch_samples_per_s"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    if r["layout"] == "raw" {
        assert!(epochs.is_empty(), "the raw read's threads share no epoch boundary: {r}");
    } else {
        // Each epoch's time, from its rate, within the whole run's.
        let per_epoch = samples as f64 / epochs.len() as f64;
        let timed: f64 = epochs.iter().map(|v| per_epoch / v).sum();
        assert!(!epochs.is_empty() && timed > 0.0 && timed <= secs * (1.0 + 1e-9), "{r}");
    }
    if r["layout"] != "raw" && r["layout"] != "bound" {
        let (p50, p99) = (f(r, "fetch_p50_ms"), f(r, "fetch_p99_ms"));
        assert!(p50 > 0.0 && p50 <= p99, "{r}");
        let wait = f(r, "consumer_wait_fraction");
        assert!((0.0..=1.0).contains(&wait), "{r}");
    }
}

#[test]
fn embedded_default_measures_every_backend_against_a_raw_read() {
    let (samples, size) = (300u64, 4096u64);
    let (run, rows) = json_run(&["bench", "--samples", "300", "--size", "4096", "--batch", "64", "--json"]);
    assert!(run["machine"]["cores"].as_u64().unwrap() >= 1, "{run}");
    assert_eq!(run["params"]["batch"], 64);
    let demo = &run["demo"];
    assert_eq!((demo["samples"].as_u64(), demo["sample_bytes"].as_u64()), (Some(samples), Some(size)), "{run}");
    assert_eq!(demo["total_bytes"], samples * size);
    assert_eq!(demo["kept"], false);
    let dir = demo["dir"].as_str().unwrap();
    assert!(!Path::new(dir).exists(), "the temporary dataset {dir} is removed at the end");

    let names: Vec<&str> = rows.iter().map(|r| r["backend"].as_str().unwrap()).collect();
    assert_eq!(names, ALL);
    let raw = &rows[0];
    assert_eq!(raw["layout"], "raw");
    assert!(raw["fetch_p50_ms"].is_null() && raw["consumer_wait_fraction"].is_null(), "{raw}");
    // The raw read covers the tar files, headers included.
    assert!(raw["bytes"].as_u64().unwrap() > samples * size, "{raw}");
    let raw_sps = f(raw, "samples_per_s");
    for r in &rows {
        check_row(r, samples);
        assert!(close(f(r, "ratio_to_raw"), f(r, "samples_per_s") / raw_sps), "{r}");
        assert!(r["proxy_requests"].is_null(), "no proxy without --latency: {r}");
    }
    for r in rows[1..].iter().filter(|r| r["layout"] != "bound") {
        assert_eq!(r["bytes"], samples * size, "{}: payload bytes", r["backend"]);
    }
    let layouts: Vec<&str> = rows.iter().map(|r| r["layout"].as_str().unwrap()).collect();
    assert_eq!(layouts, ["raw", "objects", "tar", "lmdb", "bound", "objects", "tar"]);
    // The bound reads the tar shards whole, headers included, in few requests (ranged parts).
    let bound = &rows[4];
    assert!(bound["bytes"].as_u64().unwrap() > samples * size, "{bound}");
    assert!(bound["store_requests"].as_u64().unwrap() < samples / 4, "{bound}");
    let bound_sps = f(bound, "samples_per_s");
    for r in &rows[4..] {
        assert!(r["source"].as_str().unwrap().contains("s3://bench/"), "{r}");
        assert!(!r["source"].as_str().unwrap().contains("loopback-only"), "the secret key is redacted: {r}");
        assert!(r["store_requests"].as_u64().unwrap() > 0, "{r}");
        assert!(close(f(r, "ratio_to_bound"), f(r, "samples_per_s") / bound_sps), "{r}");
        // One epoch: its ratio is the row's, epoch for epoch against the bound's.
        let per_epoch = r["epoch_ratio_to_bound"].as_array().unwrap();
        let (rate, bound_rate) = (&r["epoch_samples_per_s"][0], &bound["epoch_samples_per_s"][0]);
        assert_eq!(per_epoch.len(), 1, "{r}");
        assert!(close(per_epoch[0].as_f64().unwrap(), rate.as_f64().unwrap() / bound_rate.as_f64().unwrap()), "{r}");
    }
    assert!(rows[..4].iter().all(|r| r["ratio_to_bound"].is_null()), "local rows have no bound: {rows:?}");
    assert!(
        rows[..4].iter().all(|r| r["epoch_ratio_to_bound"].as_array().unwrap().is_empty()),
        "local rows have no bound, epoch by epoch either: {rows:?}"
    );
    // One GET per sample at least when every sample is its own object.
    assert!(rows[5]["store_requests"].as_u64().unwrap() >= samples, "{}", rows[5]);
}

#[test]
fn the_table_says_what_ran_and_where() {
    let out = stoker(&["bench", "--samples", "20", "--size", "1K", "--backends", "raw,tar"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(t.contains("20 samples x 1.0 KiB"), "{t}");
    assert!(t.contains("cores") && t.contains("removed at the end"), "{t}");
    let header = t.lines().find(|l| l.starts_with("backend")).expect("a table header");
    for col in ["samples/s", "MiB/s", "x raw", "x bound", "fetch p50", "fetch p99", "wait %", "peak RSS"] {
        assert!(header.contains(col), "{header}");
    }
    let rows: Vec<&str> = t.lines().filter(|l| l.starts_with("raw ") || l.starts_with("tar ")).collect();
    assert_eq!(rows.len(), 2, "{t}");
    assert!(rows[0].contains("1.00"), "raw is its own reference: {t}");
    assert!(!t.contains("per epoch"), "one epoch: no per-epoch lines: {t}");
    // Two epochs: a line per timed row, one figure per epoch (the raw read times none).
    let out = stoker(&["bench", "--samples", "20", "--size", "1K", "--backends", "raw,tar", "--epochs", "2"]);
    let t = text(&out.stdout);
    let at = t.lines().position(|l| l.starts_with("per epoch")).unwrap_or_else(|| panic!("{t}"));
    let tar = t.lines().nth(at + 1).unwrap_or_default().trim();
    assert!(tar.starts_with("tar ") && tar.matches(" / ").count() == 1, "{t}");
    assert!(!t.lines().skip(at + 1).any(|l| l.trim().starts_with("raw ")), "{t}");
}

#[test]
fn dir_keeps_the_dataset_for_the_next_run_and_never_overwrites_other_files() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let d = dir.to_str().unwrap();
    let args = ["bench", "--dir", d, "--samples", "50", "--size", "1000", "--backends", "tar,lmdb", "--json"];
    let (run, rows) = json_run(&args);
    assert_eq!((run["demo"]["kept"].as_bool(), run["demo"]["reused"].as_bool()), (Some(true), Some(false)));
    rows.iter().for_each(|r| check_row(r, 50));
    assert!(dir.join("files/000000049.bin").is_file() && dir.join("lmdb/data.mdb").is_file());

    let (run, rows) = json_run(&args);
    assert_eq!(run["demo"]["reused"], true, "{run}");
    rows.iter().for_each(|r| check_row(r, 50));

    // Another shape rebuilds the parts bench owns.
    let (run, rows) =
        json_run(&["bench", "--dir", d, "--samples", "30", "--size", "1000", "--backends", "files", "--json"]);
    assert_eq!(run["demo"]["reused"], false);
    check_row(&rows[0], 30);
    assert!(!dir.join("files/000000049.bin").exists());

    // A directory with someone else's files is refused, and left as it was.
    let foreign = parent.path().join("mine");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("thesis.tex"), "precious").unwrap();
    let out = stoker(&["bench", "--dir", foreign.to_str().unwrap(), "--samples", "10", "--size", "100"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("not empty") && err.contains("mine"), "{err}");
    assert_eq!(std::fs::read_to_string(foreign.join("thesis.tex")).unwrap(), "precious");
    assert_eq!(std::fs::read_dir(&foreign).unwrap().count(), 1);
}

#[test]
fn given_sources_are_benchmarked_in_order() {
    use stoker_testkit::s3::{serve, S3ServerConfig};
    let local = tempfile::tempdir().unwrap();
    shards(local.path());
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data/tar")).unwrap();
    shards(&root.path().join("data/tar"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server =
        rt.block_on(serve(S3ServerConfig::new(root.path()).with_credentials("ak", "sk-do-not-print"))).unwrap();
    let s3 = format!("s3://data/tar?endpoint={}&access_key_id=ak&secret_access_key=sk-do-not-print", server.endpoint());

    let out = stoker(&["bench", local.path().to_str().unwrap(), &s3, "--batch", "4", "--epochs", "2", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("sk-do-not-print") && !text(&out.stderr).contains("sk-do-not-print"));
    let mut lines: Vec<Value> = text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let run = lines.remove(0);
    assert!(run["demo"].is_null(), "{run}");
    assert_eq!(run["params"]["epochs"], 2);
    assert_eq!(lines.len(), 2);
    for r in &lines {
        check_row(r, 12); // two epochs of six samples
        assert_eq!(r["epoch_samples_per_s"].as_array().unwrap().len(), 2, "each epoch timed: {r}");
        assert_eq!(r["layout"], "tar");
        assert!(r["ratio_to_raw"].is_null(), "no raw reference for given sources: {r}");
    }
    assert!(lines[1]["source"].as_str().unwrap().contains("s3://data/tar"), "{}", lines[1]);
    assert!(lines[1]["store_requests"].as_u64().unwrap() > 0);
}

#[test]
fn bad_sources_and_flags_fail_clearly() {
    let missing = "/nonexistent/stoker-bench-test/shards";
    let out = stoker(&["bench", missing]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(missing) && err.contains("benchmarking"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let out = stoker(&["bench", "ftp://host/data"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("ftp"), "{err}");

    let out = stoker(&["bench", "/tmp", "--latency", "25ms"]);
    assert!(!out.status.success() && text(&out.stderr).contains("--latency"), "{}", text(&out.stderr));
    let out = stoker(&["bench", "--backends", "tar,floppy"]);
    assert!(!out.status.success() && text(&out.stderr).contains("floppy"), "{}", text(&out.stderr));
    let out = stoker(&["bench", "--size", "12 parsecs"]);
    assert!(!out.status.success() && text(&out.stderr).contains("parsecs"), "{}", text(&out.stderr));
    let out = stoker(&["bench", "/tmp", "--decode", "jpg=gif"]);
    assert!(!out.status.success() && text(&out.stderr).contains("gif"), "{}", text(&out.stderr));
    let out = stoker(&["bench", "--decode", "jpg=image:224"]);
    assert!(!out.status.success() && text(&out.stderr).contains("--decode needs sources"), "{}", text(&out.stderr));
}

#[test]
fn decode_runs_in_the_loader_and_a_bad_value_is_named() {
    let local = tempfile::tempdir().unwrap();
    shards(local.path());
    let dir = local.path().to_str().unwrap();
    let out = stoker(&["bench", dir, "--batch", "4", "--decode", "cls=int", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<Value> = text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["params"]["decode"], serde_json::json!(["cls=int"]));
    check_row(&lines[1], 6);
    // The text payloads are not integers: the error names the sample and the field.
    let out = stoker(&["bench", dir, "--batch", "4", "--decode", "txt=int"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("`txt`") && err.contains("k00") && err.contains("not an integer"), "{err}");
}

#[test]
fn latency_goes_through_the_proxy() {
    let (samples, latency_ms) = (40u64, 30.0);
    let (run, rows) = json_run(&[
        "bench",
        "--samples",
        "40",
        "--size",
        "1000",
        "--batch",
        "8",
        "--latency",
        "30ms",
        "--backends",
        "s3-objects,s3-tar",
        "--json",
    ]);
    assert_eq!(run["demo"]["latency_ms"], 30, "{run}");
    assert!(run["demo"]["servers"].as_str().unwrap().contains("proxy"), "{run}");
    assert_eq!(rows.len(), 2);
    for r in &rows {
        check_row(r, samples);
        let through = r["proxy_requests"].as_u64().unwrap();
        assert!(through > 0, "{r}");
        // One object per sample: every batch waits for delayed requests. Tar shards go
        // through the disk cache (on by default) in 1 MiB blocks: the first batch waits, the
        // later ones are cut from the blocks it brought.
        let waited = if r["backend"] == "s3-objects" { "fetch_p50_ms" } else { "fetch_p99_ms" };
        assert!(f(r, waited) >= latency_ms, "{r}");
    }
    assert!(rows[0]["proxy_requests"].as_u64().unwrap() >= samples, "one GET per object at least: {}", rows[0]);
}

#[test]
fn link_rate_bounds_the_s3_rows() {
    let (samples, size) = (40u64, 16u64 << 10);
    let (run, rows) = json_run(&[
        "bench",
        "--samples",
        "40",
        "--size",
        "16KiB",
        "--link",
        "1MiB",
        "--backends",
        "s3-bound",
        "--json",
    ]);
    assert_eq!(run["demo"]["link_mib_s"], 1, "{run}");
    assert!(run["demo"]["servers"].as_str().unwrap().contains("one link of 1 MiB/s"), "{run}");
    assert_eq!(rows.len(), 1);
    check_row(&rows[0], samples);
    // The bound reads the shards whole (every sample's bytes and the tar headers), every byte
    // over the 1 MiB/s link: no faster, but for the millisecond or so the link gives back for
    // its timers (about 0.7 MiB take 0.7 s).
    assert!(f(&rows[0], "bytes") > (samples * size) as f64, "{}", rows[0]);
    assert!(f(&rows[0], "mib_per_s") <= 1.05, "faster than the link: {}", rows[0]);

    for bad in ["100KiB", "1500KiB", "100MB"] {
        let out = stoker(&["bench", "--samples", "40", "--link", bad]);
        assert!(!out.status.success(), "--link {bad} was taken");
        assert!(text(&out.stderr).contains("--link is a whole number of MiB a second"), "{}", text(&out.stderr));
    }
    let out = stoker(&["bench", "somewhere", "--link", "1MiB"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--link applies to the embedded demo only"), "{}", text(&out.stderr));
}

#[test]
fn shard_shuffle_flags_reach_the_loader() {
    use stoker_testkit::s3::{serve, S3ServerConfig};
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data/tar")).unwrap();
    shards(&root.path().join("data/tar"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(serve(S3ServerConfig::new(root.path()).with_credentials("ak", "sk"))).unwrap();
    let s3 = format!("s3://data/tar?endpoint={}&access_key_id=ak&secret_access_key=sk", server.endpoint());
    let (run, rows) = json_run(&[
        "bench",
        &s3,
        "--batch",
        "4",
        "--epochs",
        "2",
        "--shuffle",
        "shards",
        "--shuffle-window",
        "2",
        "--json",
    ]);
    assert_eq!(run["params"]["order"], "shard-shuffled (window 2)", "{run}");
    check_row(&rows[0], 12);
    // Both shards are one window: read ahead in one request each, per epoch.
    assert!(rows[0]["store_requests"].as_u64().unwrap() > 0, "{}", rows[0]);
    // Files are not shards.
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("a.bin"), b"x").unwrap();
    let out = stoker(&["bench", files.path().to_str().unwrap(), "--shuffle", "shards"]);
    assert!(!out.status.success() && text(&out.stderr).contains("not made of shards"), "{}", text(&out.stderr));
    let out = stoker(&["bench", files.path().to_str().unwrap(), "--shuffle", "random"]);
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("samples") && err.contains("shards"), "{err}");
    let out = stoker(&["bench", files.path().to_str().unwrap(), "--shuffle-window", "3"]);
    assert!(!out.status.success() && text(&out.stderr).contains("--shuffle shards"), "{}", text(&out.stderr));
}

/// A word-level `tokenizer.json` (the `tokenizers` format), written by hand: the CLI tests
/// have no Python.
pub(crate) const TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":2,"<eos>":3},"unk_token":"[UNK]"}}"#;

#[test]
fn bench_and_diagnose_tokenize_text_with_a_tokens_decode() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("text");
    std::fs::create_dir(&data).unwrap();
    let lines: String = (0..24).map(|i| format!("{{\"text\": \"{}\"}}\n", "hello world ".repeat(i % 7 + 1))).collect();
    std::fs::write(data.join("a.jsonl"), lines).unwrap();
    let tok = dir.path().join("tokenizer.json");
    std::fs::write(&tok, TOKENIZER).unwrap();
    let spec = format!("text=tokens:{}:8:eos=<eos>", tok.display());
    let uri = data.to_str().unwrap();
    let (run, rows) = json_run(&["bench", uri, "--batch", "4", "--decode", &spec, "--json"]);
    assert_eq!(run["params"]["decode"], serde_json::json!([spec]));
    check_row(&rows[0], 24);
    let out = stoker(&["diagnose", uri, "--batch", "4", "--samples", "24", "--decode", &spec, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Without truncation, the longest documents (14 words and EOS) do not fit 8 tokens: the
    // error names the sample and the fix.
    let out = stoker(&["bench", uri, "--batch", "4", "--decode", &format!("{spec}:no_truncate")]);
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("`text`") && err.contains("truncate"), "{err}");
    // A tokenizer that is not there is named before anything runs.
    let out = stoker(&["bench", uri, "--decode", "text=tokens:/nonexistent/tok.json:8"]);
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("/nonexistent/tok.json"), "{err}");
}
