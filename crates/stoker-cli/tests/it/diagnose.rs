//! `stoker diagnose` end to end on real files: the planted bottleneck is named, in text and JSON.

use std::path::Path;

use crate::common;
use common::{stoker, text};

/// 160 files of 8 KiB.
fn files(dir: &Path) {
    for i in 0..160u32 {
        let data: Vec<u8> = (0..8192u32).map(|j| (i * 31 + j * 7) as u8).collect();
        std::fs::write(dir.join(format!("{i:04}.bin")), data).unwrap();
    }
}

#[test]
fn an_expensive_transform_is_named_in_json_and_text() {
    let dir = tempfile::tempdir().unwrap();
    files(dir.path());
    let uri = dir.path().to_str().unwrap();
    // 3 ms of CPU per sample on at most 2 threads is >= 24 ms per 16-sample batch, against a
    // 1 ms step and local reads of 128 KiB.
    let common = [
        "diagnose",
        uri,
        "--batch",
        "16",
        "--samples",
        "160",
        "--step-time",
        "1ms",
        "--transform-cost",
        "3ms",
        "--transform-threads",
        "2",
    ];
    let out = stoker(&[&common[..], &["--json"]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"]["step"], "collate", "{v:#}");
    assert_eq!(v["verdict"]["knob"], "transform", "{v:#}");
    let steps: Vec<&str> = v["steps"].as_array().unwrap().iter().map(|s| s["step"].as_str().unwrap()).collect();
    assert_eq!(steps, ["consumer", "copy", "collate", "fetch", "pipeline"]);
    assert_eq!(v["setup"]["device"], serde_json::Value::Null);
    assert!(v["setup"]["copy"].as_str().unwrap().contains("stands in"), "{v:#}");

    let out = stoker(&common);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    for want in ["samples/s", "MiB/s", "+ host copy (no GPU)", "bottleneck: collate (knob: transform)", "transform"] {
        assert!(report.contains(want), "missing `{want}` in:\n{report}");
    }
}

#[test]
fn bad_arguments_are_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    files(dir.path());
    let uri = dir.path().to_str().unwrap();
    let out = stoker(&["diagnose", uri, "--step-time", "fast"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("20ms"), "{}", text(&out.stderr));
    let out = stoker(&["diagnose", uri, "--device", "banana"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("cpu") && text(&out.stderr).contains("banana"), "{}", text(&out.stderr));
    let out = stoker(&["diagnose", uri, "--device", "0", "--samples", "16"]);
    assert!(!out.status.success(), "no GPU on this machine");
    assert!(text(&out.stderr).contains("CUDA"), "{}", text(&out.stderr));
    let out = stoker(&["diagnose", uri, "--shuffle", "shards"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("not made of shards"), "{}", text(&out.stderr));
    let out = stoker(&["diagnose", &format!("{uri}/missing")]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("missing"), "{}", text(&out.stderr));
    // Seconds no duration holds: an error, not a panic (exit 101).
    let out = stoker(&["diagnose", uri, "--seconds", "1e20"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--seconds"), "{}", text(&out.stderr));
    // Steps too short for a batch still measure one: no rate over nothing.
    let out = stoker(&["diagnose", uri, "--seconds", "1e-12", "--json", "--samples", "16"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let steps = report["steps"].as_array().unwrap();
    assert!(steps.iter().all(|s| s["batches"].as_u64() >= Some(1)), "{report}");
}
