//! The `stoker` binary end to end, on real files.

use std::process::{Command, Stdio};

use crate::common;
use common::{shards, stoker, text};

#[test]
fn ls_cat_inspect_on_tar_shards() {
    let dir = tempfile::tempdir().unwrap();
    shards(dir.path());
    let uri = dir.path().to_str().unwrap();

    let ls = stoker(&["ls", uri]);
    assert!(ls.status.success(), "{}", text(&ls.stderr));
    let lines: Vec<String> = text(&ls.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 6);
    assert_eq!(lines[4], "4\tk11\ttxt=10 cls=1");

    let json = stoker(&["ls", uri, "--json", "--limit", "2"]);
    let rows: Vec<serde_json::Value> = text(&json.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["key"], "k01");
    assert_eq!(rows[1]["fields"]["txt"], 10);

    let cat = stoker(&["cat", uri, "4", "--field", "txt"]);
    assert_eq!(text(&cat.stdout), "sample 1-1");
    let ambiguous = stoker(&["cat", uri, "4"]);
    assert!(!ambiguous.status.success());
    assert!(text(&ambiguous.stderr).contains("--field") && text(&ambiguous.stderr).contains("cls"));

    let inspect = stoker(&["inspect", uri, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(v["layout"], "tar");
    assert_eq!(v["samples"], 6);
    assert_eq!(v["shards"], 2);
    assert_eq!(v["total_bytes"], 6 * 10 + 6);
    let human = text(&stoker(&["inspect", uri]).stdout);
    assert!(human.contains("layout      tar") && human.contains("open time"), "{human}");
}

#[test]
fn config_file_and_query_say_the_same_thing() {
    let dir = tempfile::tempdir().unwrap();
    shards(dir.path());
    let cfg = dir.path().join("opts.toml");
    std::fs::write(&cfg, "layout = \"objects\"\nwrite_sidecar = false\n").unwrap();
    let uri = dir.path().join("s-0.tar");
    let via_cfg = stoker(&["inspect", uri.to_str().unwrap(), "--json", "--config", cfg.to_str().unwrap()]);
    let via_query = stoker(&["inspect", &format!("{}?layout=objects&write_sidecar=false", uri.display()), "--json"]);
    let a: serde_json::Value = serde_json::from_slice(&via_cfg.stdout).unwrap();
    let b: serde_json::Value = serde_json::from_slice(&via_query.stdout).unwrap();
    assert_eq!(a["layout"], "objects");
    assert_eq!((&a["samples"], &a["fields"]), (&b["samples"], &b["fields"]));
    std::fs::write(&cfg, "{\"layuot\": \"tar\"}").unwrap();
    let bad = stoker(&["ls", uri.to_str().unwrap(), "--config", cfg.to_str().unwrap()]);
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("layuot") && text(&bad.stderr).contains("layout"));
}

#[test]
fn errors_are_one_clear_line_and_a_failing_status() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let out = stoker(&["inspect", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "a failure once the command line parsed");
    let err = text(&out.stderr);
    assert!(err.starts_with("error: not found") && err.contains("nope") && err.lines().count() == 1, "{err}");
    assert_eq!(stoker(&["inspect", "--no-such-flag", "x"]).status.code(), Some(2), "a bad command line");
    shards(dir.path());
    let out = stoker(&["cat", dir.path().to_str().unwrap(), "6"]);
    assert!(text(&out.stderr).contains("out of range"), "{}", text(&out.stderr));
}

#[test]
fn a_closed_pipe_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..20_000 {
        std::fs::write(dir.path().join(format!("{i:05}.bin")), b"x").unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args(["ls", dir.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "stderr: {}", text(&out.stderr));
}

#[test]
fn index_writes_a_manifest_that_later_opens_use() {
    let dir = tempfile::tempdir().unwrap();
    shards(dir.path());
    let uri = dir.path().to_str().unwrap();
    let out = stoker(&["index", uri, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["layout"].as_str(), v["objects"].as_u64(), v["samples"].as_u64()), (Some("tar"), Some(2), Some(6)));
    assert!(dir.path().join(".stoker-manifest.json").is_file());
    let ls = stoker(&["ls", uri]);
    assert_eq!(text(&ls.stdout).lines().count(), 6);
    let bad = stoker(&["index", &format!("{uri}/s-{{0..1}}.tar")]);
    assert!(!bad.status.success() && text(&bad.stderr).contains("directory or prefix"), "{}", text(&bad.stderr));
}

#[test]
fn index_records_checksums_and_lists_damage_it_skipped() {
    let dir = tempfile::tempdir().unwrap();
    shards(dir.path());
    let uri = dir.path().to_str().unwrap();
    std::fs::write(dir.path().join("s-9.tar"), vec![0x5au8; 4096]).unwrap();
    let strict = stoker(&["index", uri, "--checksums"]);
    assert!(!strict.status.success() && text(&strict.stderr).contains("s-9.tar"), "{}", text(&strict.stderr));

    let out = stoker(&["index", uri, "--checksums", "--skip-damage", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["samples"].as_u64(), v["checksums"].as_bool()), (Some(6), Some(true)));
    let damage = v["damage"].as_array().unwrap();
    assert_eq!(damage.len(), 1);
    assert_eq!(damage[0]["cause"], "unreadable_shard");
    assert!(damage[0]["shard"].as_str().unwrap().ends_with("s-9.tar"));
    assert!(damage[0]["samples_lost"].is_null(), "the count of an unreadable shard is unknown");
    // The manifest remembers the damage: a strict open still fails, naming the shard.
    let ls = stoker(&["ls", uri]);
    assert!(!ls.status.success() && text(&ls.stderr).contains("s-9.tar"), "{}", text(&ls.stderr));
    let inspect = stoker(&["inspect", &format!("{uri}?on_damage=skip")]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    let shown = text(&inspect.stdout);
    assert!(shown.contains("damage") && shown.contains("s-9.tar") && shown.contains("UnreadableShard"), "{shown}");
}

#[test]
fn processes_sharing_a_disk_cache_read_right_bytes_and_keep_it_bounded() {
    use stoker_testkit::s3::{serve, S3ServerConfig};
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("data");
    std::fs::create_dir_all(&bucket).unwrap();
    shards(&bucket);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(serve(S3ServerConfig::new(root.path()).with_credentials("ak", "sk"))).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let uri = format!(
        "s3://data?endpoint={}&access_key_id=ak&secret_access_key=sk&cache_block=4096&disk_cache_dir={}&disk_cache_bytes=6000",
        server.endpoint(),
        cache.path().display()
    );
    // Several rounds of six processes at once, each reading one sample through the shared cache.
    for round in 0..3 {
        let children: Vec<_> = (0..6)
            .map(|i| {
                Command::new(env!("CARGO_BIN_EXE_stoker"))
                    .args(["cat", &uri, &i.to_string(), "--field", "txt"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for (i, c) in children.into_iter().enumerate() {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "round {round}, sample {i}: {}", text(&out.stderr));
            assert_eq!(text(&out.stdout), format!("sample {}-{}", i / 3, i % 3), "round {round}");
        }
    }
    let mut blocks = 0u64;
    let mut bytes = 0u64;
    for sub in std::fs::read_dir(cache.path()).unwrap().flatten().filter(|e| e.path().is_dir()) {
        for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            assert!(!name.ends_with(".tmp"), "no temporary file is left behind: {name}");
            blocks += 1;
            bytes += f.metadata().unwrap().len();
        }
    }
    assert!(blocks > 0, "the processes wrote to the shared cache");
    assert!(bytes <= 6000 + 2 * 4096, "the cache stays near its limit: {bytes} bytes");
}

/// A mix file is a URI like any other: `ls` lists the sources concatenated with their names,
/// `inspect` shows the epoch plan, `bench` reads an epoch of it through the Loader.
#[test]
fn mix_files_work_as_uris() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tar")).unwrap();
    shards(&dir.path().join("tar"));
    std::fs::create_dir_all(dir.path().join("files")).unwrap();
    for i in 0..4 {
        std::fs::write(dir.path().join(format!("files/f{i}.txt")), format!("file {i}")).unwrap();
    }
    let mix = dir.path().join("train.mix.toml");
    std::fs::write(
        &mix,
        "fill_missing = { cls = \"\" }\n[[sources]]\nuri = \"tar\"\nweight = 3\n[[sources]]\nname = \"f\"\nuri = \"files\"\nweight = 1\n",
    )
    .unwrap();
    let uri = mix.to_str().unwrap();
    let ls = stoker(&["ls", uri]);
    assert!(ls.status.success(), "{}", text(&ls.stderr));
    let lines: Vec<String> = text(&ls.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 10);
    assert_eq!(lines[0], "0\tk00\ttxt=10 cls=1 __source__=3");
    assert_eq!(lines[9], "9\tf3\ttxt=6 cls=0 __source__=1");

    let v: serde_json::Value = serde_json::from_slice(&stoker(&["inspect", uri, "--json"]).stdout).unwrap();
    assert_eq!(v["layout"], "mix");
    // tar (6 samples at 3/4) runs out first: 8 an epoch, 6 of tar and 2 of the files.
    assert_eq!(v["mix"]["epoch_length"], 8);
    assert_eq!(v["mix"]["sources"][1], serde_json::json!({"name": "f", "samples": 4, "per_epoch": 2}));

    let bench = stoker(&["bench", uri, "--shuffle", "--batch", "3", "--json"]);
    assert!(bench.status.success(), "{}", text(&bench.stderr));
    let rows: Vec<serde_json::Value> =
        text(&bench.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(rows.iter().any(|r| r["samples"] == 8), "{rows:?}");

    std::fs::write(&mix, "[[sources]]\nuri = \"tar\"\nweight = 1\n[[sources]]\nuri = \"files\"\nweight = 1\n").unwrap();
    let bad = stoker(&["ls", uri]);
    assert!(!bad.status.success());
    let err = text(&bad.stderr);
    assert!(err.contains("`files`") && err.contains("`cls`") && err.contains("fill_missing"), "{err}");
}
