//! Bad input gets a clear error naming what failed, never a panic.

use crate::common;

use std::io::Write;

use common::*;
use stoker::{Error, SourceOptions};

async fn open_err(uri: &str) -> Error {
    match stoker::open(uri, SourceOptions::default()).await {
        Ok(src) => panic!("opening {uri} should fail, got {src}"),
        Err(e) => e,
    }
}

fn assert_mentions(e: &Error, parts: &[&str]) {
    let msg = e.to_string();
    for p in parts {
        assert!(msg.contains(p), "error `{msg}` should mention `{p}`");
    }
}

#[tokio::test]
async fn missing_path() {
    let e = open_err("/definitely/not/here").await;
    assert!(matches!(e, Error::NotFound { .. }), "{e:?}");
    assert_mentions(&e, &["/definitely/not/here"]);
    let e = open_err("/definitely/not/here/s-{0..3}.tar").await;
    assert_mentions(&e, &["/definitely/not/here"]);
}

/// A shard a brace range names that is not there was never there: the error says to check
/// the range (it said the object "disappeared or was renamed since the source was opened").
#[tokio::test]
async fn a_missing_shard_of_a_brace_range_says_check_the_range() {
    let dir = tempfile::tempdir().unwrap();
    for s in 0..2 {
        let mut b = tar::Builder::new(std::fs::File::create(dir.path().join(format!("s-{s}.tar"))).unwrap());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_cksum();
        b.append_data(&mut h, format!("k{s}.txt"), &b"x"[..]).unwrap();
        b.finish().unwrap();
    }
    let e = open_err(&format!("{}/s-{{0..3}}.tar", dir.path().display())).await;
    assert!(matches!(e, Error::NotFound { .. }), "{e:?}");
    assert_mentions(&e, &["s-2.tar", "check the range", "on_damage=skip"]);
    assert!(!e.to_string().contains("disappeared"), "{e}");
}

#[tokio::test]
async fn empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".hidden"), b"x").unwrap();
    let e = open_err(dir.path().to_str().unwrap()).await;
    assert!(matches!(e, Error::Empty { .. }), "{e:?}");
    assert_mentions(&e, &[dir.path().to_str().unwrap(), "no files"]);
}

#[tokio::test]
async fn unreadable_sample_fails_on_read_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.bin"), b"ok").unwrap();
    std::fs::write(dir.path().join("b.bin"), b"gone soon").unwrap();
    let src = open(dir.path().to_str().unwrap()).await;
    // Root ignores permission bits, so make the file unreadable by replacing it with a
    // directory: reading it fails at the OS level for any user.
    std::fs::remove_file(dir.path().join("b.bin")).unwrap();
    std::fs::create_dir(dir.path().join("b.bin")).unwrap();
    let e = src.get(1).await.unwrap_err();
    assert_mentions(&e, &["b.bin"]);
    assert_eq!(&src.get(0).await.unwrap().fields[0].data[..], b"ok", "other samples stay readable");
}

#[tokio::test]
async fn truncated_tar_member_runs_past_eof() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("t.tar");
    write_tar(&shard, &tar_samples(0, 4));
    let len = std::fs::metadata(&shard).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&shard).unwrap();
    f.set_len(len / 2).unwrap();
    let e = open_err(shard.to_str().unwrap()).await;
    assert!(matches!(e, Error::CorruptTar { .. }), "{e:?}");
    assert_mentions(&e, &["t.tar", "truncated"]);
}

#[tokio::test]
async fn tar_cut_at_a_member_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("t.tar");
    let samples = tar_samples(0, 1);
    write_tar(&shard, &samples);
    // Keep the first member's header and padded payload, drop everything after it.
    let first = 512 + samples[0].fields[0].data.len().div_ceil(512) * 512;
    let f = std::fs::OpenOptions::new().write(true).open(&shard).unwrap();
    f.set_len(first as u64).unwrap();
    let e = open_err(shard.to_str().unwrap()).await;
    assert_mentions(&e, &["t.tar", "end-of-archive"]);
}

#[tokio::test]
async fn garbage_named_tar() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = std::fs::File::create(dir.path().join("g.tar")).unwrap();
    f.write_all(&payload(9, 5000)).unwrap();
    let e = open_err(dir.path().join("g.tar").to_str().unwrap()).await;
    assert!(matches!(e, Error::CorruptTar { .. }), "{e:?}");
    assert_mentions(&e, &["g.tar", "not a tar"]);
    // Shorter than one header.
    std::fs::write(dir.path().join("tiny.tar"), b"hello").unwrap();
    let e = open_err(dir.path().join("tiny.tar").to_str().unwrap()).await;
    assert_mentions(&e, &["tiny.tar"]);
}

#[tokio::test]
async fn tar_with_bad_header_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("c.tar");
    let samples = tar_samples(0, 3);
    write_tar(&shard, &samples);
    let mut bytes = std::fs::read(&shard).unwrap();
    // Flip a byte in the second member's header name.
    let second = 512 + samples[0].fields[0].data.len().div_ceil(512) * 512;
    bytes[second + 3] ^= 0x55;
    std::fs::write(&shard, &bytes).unwrap();
    let e = open_err(shard.to_str().unwrap()).await;
    assert!(matches!(e, Error::CorruptTar { offset, .. } if offset == second as u64), "{e:?}");
    assert_mentions(&e, &["c.tar", "checksum"]);
}

#[tokio::test]
async fn duplicate_field_in_one_sample() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("d.tar");
    write_tar(&shard, &[sample("k", &[("jpg", vec![1]), ("jpg", vec![2])])]);
    let e = open_err(shard.to_str().unwrap()).await;
    assert_mentions(&e, &["d.tar", "k", "jpg"]);
}

#[tokio::test]
async fn lmdb_dir_without_data_mdb() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x.bin"), b"x").unwrap();
    let e = open_err(&format!("{}?layout=lmdb", dir.path().display())).await;
    assert!(matches!(e, Error::Lmdb { .. }), "{e:?}");
    assert_mentions(&e, &["data.mdb", dir.path().to_str().unwrap()]);
}

#[tokio::test]
async fn truncated_and_garbage_lmdb() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<_> = (0..50).map(|i| (format!("{i:03}").into_bytes(), payload(i, 20_000))).collect();
    write_lmdb(dir.path(), &records);
    let data = dir.path().join("data.mdb");
    let len = std::fs::metadata(&data).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&data).unwrap().set_len(len / 3).unwrap();
    let e = open_err(dir.path().to_str().unwrap()).await;
    assert_mentions(&e, &["data.mdb", "truncated"]);

    let junk = tempfile::tempdir().unwrap();
    std::fs::write(junk.path().join("data.mdb"), payload(3, 10_000)).unwrap();
    let e = open_err(junk.path().to_str().unwrap()).await;
    assert_mentions(&e, &["data.mdb", "not an LMDB file"]);
}

#[tokio::test]
async fn index_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    objects_dir(dir.path());
    let src = open(dir.path().to_str().unwrap()).await;
    let e = src.get(99).await.unwrap_err();
    assert_mentions(&e, &["99", "5 samples"]);
}

#[tokio::test]
async fn unknown_layout_or_option_lists_valid_ones() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_err(&format!("{}?layout=orc", dir.path().display())).await;
    assert!(matches!(e, Error::InvalidOption { .. }), "{e:?}");
    assert_mentions(&e, &["orc", "objects", "tar", "lmdb", "parquet", "mds", "litdata"]);
    let e = open_err(&format!("{}?shuffle=true", dir.path().display())).await;
    assert_mentions(&e, &["shuffle", "layout", "concurrency", "index_dir"]);
    let e = open_err("gopher://x/y").await;
    assert_mentions(&e, &["gopher", "file"]);
    let e = open_err("/d/s-{0..}.tar").await;
    assert_mentions(&e, &["{0..}"]);
}

#[tokio::test]
async fn an_endpoint_without_a_host_is_an_error_not_a_panic() {
    // object_store panics building requests for these; they must be refused at open.
    for (uri, why) in [
        ("s3://b/p?endpoint=http://&access_key_id=a&secret_access_key=s3cr3t", "not a URL"),
        ("s3://b/p?endpoint=ftp://host:21&access_key_id=a&secret_access_key=s3cr3t", "not an http(s) URL"),
        ("s3://b/p?endpoint=localhost:9000&access_key_id=a&secret_access_key=s3cr3t", "endpoint"),
        ("az://c/p?account=a&access_key=s3cr3t&endpoint=http://", "not a URL"),
        // The URL parser takes `[admin` as a user name; the client's request URI does not.
        ("s3://b/p?endpoint=http://[admin@127.0.0.1:9000&access_key_id=a&secret_access_key=s3cr3t", "unclosed `[`"),
    ] {
        let e = open_err(uri).await;
        assert!(matches!(e, Error::InvalidOption { .. }), "{uri}: {e:?}");
        assert_mentions(&e, &[why, "http://127.0.0.1:9000"]);
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
    }
}

#[test]
fn requests_in_flight_past_what_a_semaphore_counts_are_refused_naming_the_option() {
    let most = stoker::uri::MAX_IN_FLIGHT;
    assert_eq!(SourceOptions::from_query(&format!("max_in_flight={most}")).unwrap().max_in_flight, Some(most));
    for e in [
        SourceOptions::from_query("max_in_flight=4611686018427387904").unwrap_err(),
        SourceOptions::from_json(&format!(r#"{{"max_in_flight":{}}}"#, most + 1)).unwrap_err(),
        SourceOptions::from_toml("max_in_flight = 4611686018427387904").unwrap_err(),
    ] {
        let e = e.to_string();
        assert!(e.contains("max_in_flight") && e.contains(&most.to_string()), "{e}");
    }
}

#[test]
fn a_bad_value_in_a_query_names_its_option() {
    for (q, key) in [
        ("layout=tar&concurrency=abc", "concurrency"),
        ("attempts=-1&layout=tar", "attempts"),
        ("max_read=1.5", "max_read"),
        ("write_sidecar=maybe", "write_sidecar"),
        ("coalesce_gap=", "coalesce_gap"),
    ] {
        let e = SourceOptions::from_query(q).unwrap_err().to_string();
        assert!(e.contains(&format!("option `{key}`")), "{q}: {e}");
    }
    // A secret's value is never quoted, whatever is wrong with it.
    let e = SourceOptions::from_query("secret_access_key=hunter2&secret_access_key=x").unwrap_err().to_string();
    assert!(!e.contains("hunter2"), "{e}");
    assert!(SourceOptions::from_query("bogus=1").unwrap_err().to_string().contains("valid options"));
}
