//! Keys from data as the CLI prints and packs them: escaped (a key can neither recolour the
//! terminal nor forge a line of output), distinct when they are not UTF-8, and written back
//! byte for byte by `pack` to LMDB.

use std::path::Path;

use crate::common;
use common::{stoker, text};
use heed::types::Bytes as B;

/// LMDB keys a stranger's dataset may hold: two that differ only in bytes that are not UTF-8,
/// an ANSI colour sequence, a newline and tabs that would forge an `ls` line, a backslash.
const KEYS: [&[u8]; 6] = [b"k\xff", b"k\xfe", b"esc\x1b[31mred", b"nl\n9\tforged\tdata=1", b"back\\slash", b"plain"];

/// How `stoker ls` shows each of [`KEYS`], in LMDB (byte) order.
const SHOWN: [&str; 6] =
    ["back\\\\slash", "esc\\x1b[31mred", "k\\xfe", "k\\xff", "nl\\x0a9\\x09forged\\x09data=1", "plain"];

use stoker_testkit::lmdb::write_lmdb;

fn read_lmdb(dir: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    // SAFETY: read-only, and nothing writes the environment any more.
    let env = unsafe {
        let mut o = heed::EnvOpenOptions::new().read_txn_without_tls();
        o.flags(heed::EnvFlags::READ_ONLY);
        o.open(dir).unwrap()
    };
    let r = env.read_txn().unwrap();
    let db: heed::Database<B, B> = env
        .open_databases_and_commit(r, |dbo, rtxn| {
            dbo.open_database::<B, B>(rtxn, None).map(heed::CommitOrAbort::<_, ()>::Commit)
        })
        .unwrap()
        .unwrap_commit()
        .unwrap();
    let r = env.read_txn().unwrap();
    let all = db.iter(&r).unwrap().map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap()).collect();
    drop(r);
    env.prepare_for_closing().wait();
    all
}

/// `bytes` hold no control byte but the newlines and tabs the output's own format puts there.
fn assert_no_raw_controls(what: &str, bytes: &[u8]) {
    let bad = bytes.iter().find(|&&b| (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f);
    assert!(bad.is_none(), "{what} holds the raw control byte {bad:?}: {:?}", text(bytes));
}

fn value(i: usize) -> Vec<u8> {
    format!("value {i}").into_bytes()
}

#[test]
fn keys_print_escaped_and_distinct_and_lmdb_pack_writes_their_bytes_back() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let values: Vec<Vec<u8>> = (0..KEYS.len()).map(value).collect();
    let records: Vec<(&[u8], &[u8])> = KEYS.iter().zip(&values).map(|(k, v)| (*k, v.as_slice())).collect();
    write_lmdb(&src, &records);
    let uri = src.to_str().unwrap();

    let ls = stoker(&["ls", uri]);
    assert!(ls.status.success(), "{}", text(&ls.stderr));
    assert_no_raw_controls("stoker ls", &ls.stdout);
    let lines: Vec<String> = text(&ls.stdout).lines().map(str::to_string).collect();
    let want: Vec<String> =
        SHOWN.iter().enumerate().map(|(i, k)| format!("{i}\t{k}\tdata={}", value(0).len())).collect();
    assert_eq!(lines, want, "one line per key, each key escaped");

    let json = stoker(&["ls", uri, "--json"]);
    assert_no_raw_controls("stoker ls --json", &json.stdout);
    let keys: Vec<String> = text(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys, SHOWN);

    let inspect = stoker(&["inspect", uri]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    assert!(text(&inspect.stdout).contains("samples     6"), "{}", text(&inspect.stdout));
    // The two keys that differ only in bytes that are not UTF-8 are two samples, each its own.
    let cat = |i: &str| stoker(&["cat", uri, i]).stdout;
    let (fe, ff) = (cat("2"), cat("3"));
    assert_eq!((fe, ff), (value(1), value(0)), "k\\xfe is record 1, k\\xff record 0");

    // An error naming a key shows it escaped, on one line.
    let missing = stoker(&["cat", uri, "1", "--field", "nope"]);
    assert!(!missing.status.success());
    assert_no_raw_controls("stoker cat's error", &missing.stderr);
    let e = text(&missing.stderr);
    assert!(e.contains("esc\\x1b[31mred") && e.trim_end().lines().count() == 1, "{e}");

    // LMDB to LMDB: exactly the original key bytes, each with its value; and once more.
    let out = dir.path().join("out");
    let pack = stoker(&["pack", uri, out.to_str().unwrap(), "--layout", "lmdb", "--json"]);
    assert!(pack.status.success(), "{}", text(&pack.stderr));
    let mut want: Vec<(Vec<u8>, Vec<u8>)> = KEYS.iter().map(|k| k.to_vec()).zip(values.iter().cloned()).collect();
    want.sort();
    assert_eq!(read_lmdb(&out), want);
    let again = dir.path().join("again");
    let pack = stoker(&["pack", out.to_str().unwrap(), again.to_str().unwrap(), "--layout", "lmdb"]);
    assert!(pack.status.success(), "{}", text(&pack.stderr));
    assert_eq!(read_lmdb(&again), want);

    // To tar, a key with control characters is refused, and the refusal shows it escaped.
    let tar = stoker(&["pack", uri, dir.path().join("tar").to_str().unwrap()]);
    assert!(!tar.status.success());
    assert_no_raw_controls("stoker pack's refusal", &tar.stderr);
    assert!(text(&tar.stderr).contains("cannot pack"), "{}", text(&tar.stderr));
}

#[test]
fn tar_names_for_keys_that_are_not_utf8_are_safe_and_distinct() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_lmdb(&src, &[(b"k\xff", b"1"), (b"k\xfe", b"2"), (b"plain", b"3")]);
    let dest = dir.path().join("tar");
    let pack = stoker(&["pack", src.to_str().unwrap(), dest.to_str().unwrap()]);
    assert!(pack.status.success(), "{}", text(&pack.stderr));
    let ls = stoker(&["ls", dest.to_str().unwrap()]);
    assert!(ls.status.success(), "{}", text(&ls.stderr));
    let keys: Vec<String> = text(&ls.stdout).lines().map(|l| l.split('\t').nth(1).unwrap().to_string()).collect();
    assert_eq!(keys, ["k%fe", "k%ff", "plain"]);
    // What webdataset or `tar -x` would see: UTF-8 names, no backslash.
    let shard = std::fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "tar"));
    let mut names: Vec<String> = tar::Archive::new(std::fs::File::open(shard.unwrap()).unwrap())
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["k%fe.data", "k%ff.data", "plain.data"]);

    // A key that is already the name another key would get: refused, not merged.
    let clash = dir.path().join("clash");
    write_lmdb(&clash, &[(b"k\xff", b"1"), (b"k%ff", b"2")]);
    let out = stoker(&["pack", clash.to_str().unwrap(), dir.path().join("clash-tar").to_str().unwrap()]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("would both be written as `k%ff`") && e.contains("k\\xff"), "{e}");
}
