//! `stoker pack` against a destination someone else has touched: a link planted at a
//! temporary name, a rerun from another source of the same names and sizes, a file added
//! between runs, a plan naming files it never wrote, a token pack's parts and index
//! tampered with. Each is refused, redone or removed; nothing is overwritten outside the
//! destination, and nothing the pack did not write is kept as its own.

use std::collections::BTreeMap;
use std::path::Path;

use crate::bench::TOKENIZER;
use crate::pack::{err, files, image_dir, names_of, ok, s, stoker, stoker_env};

/// `pack SRC DEST --group` in shards of 10, one job, in JSON, aborted after `abort` samples.
fn pack(src: &Path, dest: &Path, extra: &[&str], abort: Option<u64>) -> std::process::Output {
    let mut args = vec!["pack", s(src), s(dest), "--group", "--samples-per-shard", "10", "--jobs", "1", "--json"];
    args.extend_from_slice(extra);
    stoker_env(&args, abort)
}

/// Rewrite every file under `dir`, in every directory below, with other bytes of the same size.
fn same_names_and_sizes_other_bytes(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.is_dir() {
            same_names_and_sizes_other_bytes(&path);
        } else {
            let other: Vec<u8> = std::fs::read(&path).unwrap().iter().map(|b| b ^ 0x5a).collect();
            std::fs::write(&path, other).unwrap();
        }
    }
}

#[test]
fn a_link_at_a_temporary_name_is_replaced_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dest, victim) = (dir.path().join("a"), dir.path().join("out"), dir.path().join("victim"));
    image_dir(&src, 20);
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::create_dir_all(&dest).unwrap();
    std::os::unix::fs::symlink(&victim, dest.join(".shard-000000.tar.partial")).unwrap();
    ok(&pack(&src, &dest, &[], None));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "the link's target was written");
    let meta = std::fs::symlink_metadata(dest.join("shard-000000.tar")).unwrap();
    assert!(meta.file_type().is_file(), "the shard is a file of its own, not the link");
}

#[test]
fn a_rerun_keeps_only_what_this_pack_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    image_dir(&a, 30);
    image_dir(&b, 30);
    same_names_and_sizes_other_bytes(&b);

    // Another source of the same names and sizes does not finish the first one's pack.
    let dest = dir.path().join("out");
    assert!(!pack(&a, &dest, &[], Some(15)).status.success(), "the injected abort");
    assert!(names_of(&dest).contains(&"shard-000000.tar".to_string()));
    let e = err(&pack(&b, &dest, &[], None));
    assert!(e.contains("unfinished pack") && e.contains("--force"), "{e}");
    ok(&pack(&b, &dest, &["--force"], None));
    let clean = dir.path().join("clean");
    ok(&pack(&b, &clean, &[], None));
    let tars = |d: &Path| files(d).into_iter().filter(|(n, _)| n.ends_with(".tar")).collect::<Vec<_>>();
    assert!(tars(&dest) == tars(&clean), "every shard is the second source's");

    // A file that came into the destination between the runs is not indexed as the pack's.
    let dest = dir.path().join("out2");
    assert!(!pack(&a, &dest, &[], Some(15)).status.success());
    std::fs::copy(dest.join("shard-000000.tar"), dest.join("shard-000099.tar")).unwrap();
    let e = err(&pack(&a, &dest, &[], None));
    assert!(e.contains("shard-000099.tar") && e.contains("did not write"), "{e}");
    std::fs::remove_file(dest.join("shard-000099.tar")).unwrap();
    // Nor one in a directory below (the indexing lists the whole tree); notes are no shards.
    std::fs::create_dir(dest.join("sub")).unwrap();
    std::fs::copy(dest.join("shard-000000.tar"), dest.join("sub/extra.tar")).unwrap();
    let e = err(&pack(&a, &dest, &[], None));
    assert!(e.contains("sub/extra.tar"), "{e}");
    std::fs::remove_dir_all(dest.join("sub")).unwrap();
    std::fs::write(dest.join("README.md"), b"notes").unwrap();
    let r = ok(&pack(&a, &dest, &[], None));
    assert_eq!((r["samples"].as_u64(), r["resumed_shards"].as_u64()), (Some(30), Some(1)), "{r}");

    // A plan naming a file pack never writes is not obeyed, even under --force: the file stays.
    let dest = dir.path().join("out3");
    ok(&pack(&a, &dest, &[], None));
    std::fs::write(dest.join("notes.txt"), b"mine").unwrap();
    let plan = dest.join(".stoker-pack.json");
    let text = std::fs::read_to_string(&plan).unwrap().replace("shard-000001.tar", "notes.txt");
    std::fs::write(&plan, text).unwrap();
    let e = err(&pack(&b, &dest, &["--force"], None));
    assert!(e.contains("`notes.txt` as a shard"), "{e}");
    assert_eq!(std::fs::read(dest.join("notes.txt")).unwrap(), b"mine");
}

#[test]
fn an_unfinished_pack_is_not_read_as_the_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dest) = (dir.path().join("a"), dir.path().join("out"));
    image_dir(&src, 30);
    assert!(!pack(&src, &dest, &[], Some(15)).status.success(), "the injected abort");
    assert!(names_of(&dest).contains(&"shard-000000.tar".to_string()), "a shard landed before the abort");
    // Its finished shards are a part of the dataset: not read, inspected or indexed as it.
    for cmd in ["inspect", "index", "ls"] {
        let e = err(&stoker(&[cmd, s(&dest)]));
        assert!(e.contains("did not finish") && e.contains("rerun the same `stoker pack`"), "{cmd}: {e}");
    }
    let r = ok(&pack(&src, &dest, &[], None));
    assert_eq!((r["samples"].as_u64(), r["resumed_shards"].as_u64()), (Some(30), Some(1)), "{r}");
    let v = ok(&stoker(&["inspect", s(&dest), "--json"]));
    assert_eq!(v["samples"], 30);
    // A forced pack over a shard writer's unfinished job (a Ray write that failed) leaves no
    // record of that job to refuse the finished pack.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join(".stoker-write.json"), br#"{"settings": {}, "complete": false}"#).unwrap();
    ok(&pack(&src, &other, &["--force"], None));
    std::fs::remove_file(other.join(".stoker-manifest.json")).unwrap();
    assert_eq!(ok(&stoker(&["inspect", s(&other), "--json"]))["samples"], 30);
}

#[test]
fn a_shard_changed_in_place_before_a_resume_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dest, clean) = (dir.path().join("a"), dir.path().join("out"), dir.path().join("clean"));
    image_dir(&src, 30);
    ok(&pack(&src, &clean, &[], None));
    assert!(!pack(&src, &dest, &[], Some(15)).status.success(), "the injected abort");
    // A byte of the landed shard's first payload changes, its size does not (bit rot, a
    // stray writer): the resume must not keep it, nor index its bytes as the pack's.
    let shard = dest.join("shard-000000.tar");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[512 + 3] ^= 0x01;
    std::fs::write(&shard, &bytes).unwrap();
    let r = ok(&pack(&src, &dest, &[], None));
    assert_eq!((r["samples"].as_u64(), r["resumed_shards"].as_u64()), (Some(30), Some(0)), "{r}");
    let tars = |d: &Path| files(d).into_iter().filter(|(n, _)| n.ends_with(".tar")).collect::<Vec<_>>();
    assert!(tars(&dest) == tars(&clean), "every shard as an uninterrupted pack's");
    // A rerun of the finished pack keeps every shard: each still hashes as it landed.
    let r = ok(&pack(&src, &dest, &[], None));
    assert_eq!(r["resumed_shards"].as_u64(), Some(3), "{r}");
    let v = ok(&stoker(&["inspect", s(&dest), "--json"]));
    assert_eq!(v["samples"], 30);
}

/// `pack TEXT DEST --layout tokens --tokenize TOK` in parts of `per` documents.
fn tokens(text: &Path, dest: &str, tok: &Path, per: &str) -> std::process::Output {
    tokens_with(text, dest, tok, per, &[])
}

fn tokens_with(text: &Path, dest: &str, tok: &Path, per: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["pack", s(text), dest, "--layout", "tokens", "--tokenize", s(tok), "--documents-per-part", per];
    args.extend_from_slice(extra);
    args.push("--json");
    stoker(&args)
}

#[test]
fn a_token_pack_redoes_or_refuses_parts_it_cannot_vouch_for() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text");
    std::fs::create_dir(&text).unwrap();
    let lines: String = (0..40).map(|i| format!("{{\"text\": \"{}\"}}\n", "hello world ".repeat(i % 7 + 1))).collect();
    std::fs::write(text.join("a.jsonl"), lines).unwrap();
    let tok = dir.path().join("tokenizer.json");
    std::fs::write(&tok, TOKENIZER).unwrap();

    // A remote destination is refused by name, its credentials not printed.
    let e = err(&tokens(&text, "s3://bucket/tok?secret_access_key=SEKRET", &tok, "10"));
    assert!(e.contains("local directory") && !e.contains("SEKRET"), "{e}");
    assert!(!Path::new("s3:").exists(), "nothing was written under a directory named after the URI");

    let dest = dir.path().join("tok");
    ok(&tokens(&text, s(&dest), &tok, "10"));
    let clean = files(&dest);
    assert_eq!(clean.keys().filter(|n| n.ends_with(".idx")).count(), 4);

    // Interrupted after three of its four parts (its manifest is rewritten after each): not
    // read as the corpus until a rerun finishes it.
    let manifest = dest.join(".stoker-tokens.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    m["parts"].as_array_mut().unwrap().pop();
    std::fs::write(&manifest, serde_json::to_vec(&m).unwrap()).unwrap();
    for ext in ["bin", "idx"] {
        std::fs::remove_file(dest.join(format!("tokens-00003.{ext}"))).unwrap();
    }
    let e = err(&stoker(&["inspect", s(&dest)]));
    assert!(e.contains("did not finish") && e.contains("--layout tokens"), "{e}");
    ok(&tokens(&text, s(&dest), &tok, "10"));
    assert!(files(&dest) == clean, "the rerun finished it as an uninterrupted run");
    ok(&stoker(&["inspect", s(&dest)]));

    // Part 1's index replaced by part 0's: the rerun writes part 1 again.
    std::fs::copy(dest.join("tokens-00000.idx"), dest.join("tokens-00001.idx")).unwrap();
    ok(&tokens(&text, s(&dest), &tok, "10"));
    assert!(files(&dest) == clean, "every part and index as an uninterrupted run's");

    // A pointer of part 2's index changed in place, every count kept (document 1 starts where
    // document 0 does): the rerun writes the index again.
    let idx = dest.join("tokens-00002.idx");
    let mut b = std::fs::read(&idx).unwrap();
    let pointers = 34 + 4 * 10;
    b.copy_within(pointers..pointers + 8, pointers + 8);
    std::fs::write(&idx, b).unwrap();
    ok(&tokens(&text, s(&dest), &tok, "10"));
    assert!(files(&dest) == clean, "every index as an uninterrupted run's");

    // Another pair, or a file named like a part past the last, would be read with the
    // dataset: refused by name, and left where it is.
    for stray in ["mine-00000", "tokens-00042"] {
        for ext in ["bin", "idx"] {
            std::fs::copy(dest.join(format!("tokens-00000.{ext}")), dest.join(format!("{stray}.{ext}"))).unwrap();
        }
        let e = err(&tokens(&text, s(&dest), &tok, "10"));
        assert!(e.contains(stray) && e.contains("move it away"), "{stray}: {e}");
        for ext in ["bin", "idx"] {
            std::fs::remove_file(dest.join(format!("{stray}.{ext}"))).unwrap();
        }
    }

    // What the reader leaves be stays: a README, Megatron's index caches.
    std::fs::write(dest.join("README.md"), b"notes").unwrap();
    std::fs::write(dest.join("tokens-00000_doc_idx.npy"), b"a cache").unwrap();
    ok(&tokens(&text, s(&dest), &tok, "10"));

    // Another job's parts (other part sizes) are replaced with --force only, and not while
    // something else would stop the run: nothing is removed before every check.
    let e = err(&tokens(&text, s(&dest), &tok, "20"));
    assert!(e.contains("another job") && e.contains("--force"), "{e}");
    for ext in ["bin", "idx"] {
        std::fs::copy(dest.join(format!("tokens-00000.{ext}")), dest.join(format!("mine-00000.{ext}"))).unwrap();
    }
    let e = err(&tokens_with(&text, s(&dest), &tok, "20", &["--force"]));
    assert!(e.contains("mine-00000"), "{e}");
    let parts = |all: BTreeMap<String, Vec<u8>>| {
        all.into_iter().filter(|(n, _)| n.starts_with("tokens-") && !n.ends_with(".npy")).collect::<Vec<_>>()
    };
    assert!(parts(files(&dest)) == parts(clean.clone()), "no part removed");
    for ext in ["bin", "idx"] {
        std::fs::remove_file(dest.join(format!("mine-00000.{ext}"))).unwrap();
    }
    ok(&tokens_with(&text, s(&dest), &tok, "20", &["--force"]));
    let parts: Vec<String> =
        names_of(&dest).into_iter().filter(|n| n.ends_with(".bin") || n.ends_with(".idx")).collect();
    assert_eq!(parts, ["tokens-00000.bin", "tokens-00000.idx", "tokens-00001.bin", "tokens-00001.idx"]);

    // Without a manifest, a directory holding anything but parts is someone else's.
    std::fs::remove_file(dest.join("README.md")).unwrap();
    std::fs::remove_file(dest.join("tokens-00000_doc_idx.npy")).unwrap();

    // Its manifest lost, a rerun in smaller parts cannot vouch for the parts it finds, nor
    // tell whose the ones past its own are: those are refused, not deleted.
    std::fs::remove_file(dest.join(".stoker-tokens.json")).unwrap();
    ok(&tokens(&text, s(&dest), &tok, "10"));
    assert!(files(&dest) == clean, "the parts written again");
    std::fs::remove_file(dest.join(".stoker-tokens.json")).unwrap();
    let e = err(&tokens(&text, s(&dest), &tok, "20"));
    assert!(e.contains("tokens-00002") && e.contains("move it away"), "{e}");
    assert!(dest.join("tokens-00002.bin").exists());

    // The source rewritten at its size (its time moves) is another job's source.
    ok(&tokens(&text, s(&dest), &tok, "10"));
    let a = text.join("a.jsonl");
    let edited = std::fs::read_to_string(&a).unwrap().replacen("hello", "jello", 1);
    std::fs::write(&a, edited).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options().write(true).open(&a).unwrap().set_modified(later).unwrap();
    let e = err(&tokens(&text, s(&dest), &tok, "10"));
    assert!(e.contains("source has changed") && e.contains("--force"), "{e}");
    ok(&tokens_with(&text, s(&dest), &tok, "10", &["--force"]));

    // Nor into the directory it reads.
    let e = err(&tokens(&text, s(&text), &tok, "10"));
    assert!(e.contains("where the source"), "{e}");

    // A directory holding anything else is not a token pack's.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"mine").unwrap();
    let e = err(&tokens(&text, s(&other), &tok, "10"));
    assert!(e.contains("notes.txt") && e.contains("move it away"), "{e}");
}

#[test]
fn a_pack_into_its_own_source_is_refused_and_the_source_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (src, packed) = (dir.path().join("a"), dir.path().join("packed"));
    image_dir(&src, 30);
    ok(&pack(&src, &packed, &[], None));
    let before = files(&packed);
    // Re-sharding in place: --force deleted the shards it was about to read.
    let pattern = format!("{}/shard-{{000000..000002}}.tar", s(&packed));
    for from in [s(&packed), pattern.as_str()] {
        let e = err(&stoker(&["pack", from, s(&packed), "--samples-per-shard", "5", "--force", "--json"]));
        assert!(e.contains("where the source") && e.contains("another directory"), "{from}: {e}");
        assert!(files(&packed) == before, "{from}: the source is as it was");
    }
    // Nor a mix of it (a mix reads where each of its sources reads), which --force overwrote.
    let mix = format!(r#"mix:{{"sources":[{{"uri":"{}","weight":1}}]}}"#, s(&packed));
    let e = err(&stoker(&["pack", &mix, s(&packed), "--samples-per-shard", "5", "--force", "--json"]));
    assert!(e.contains("where the source"), "{e}");
    assert!(files(&packed) == before, "the mix's source is as it was");
    // A remote prefix with a `.`, `..` or empty segment (kept as names there, encoded) is
    // refused before any request.
    for bad in ["s3://data/./x", "s3://data/a//b", "s3://data/a/../b"] {
        let e = err(&stoker(&["pack", s(&src), &format!("{bad}?endpoint=http://127.0.0.1:9&region=us-east-1")]));
        assert!(e.contains("segment"), "{bad}: {e}");
    }
    // Nor inside a directory it reads (a rerun would read its own output as input); a
    // sibling whose name begins the same is another directory.
    let e = err(&pack(&src, &src.join("out"), &[], None));
    assert!(e.contains("where the source"), "{e}");
    assert!(!src.join("out").exists(), "nothing written");
    ok(&pack(&src, &dir.path().join("a2"), &[], None));
}

/// A second pack into a destination another holds (its directory locked) is refused by name,
/// for every layout; they raced before, one failing on a file gone under it.
#[test]
fn a_destination_another_pack_is_writing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dest) = (dir.path().join("a"), dir.path().join("out"));
    image_dir(&src, 10);
    std::fs::create_dir(&dest).unwrap();
    let held = std::fs::File::open(&dest).unwrap();
    held.lock().unwrap();
    for layout in ["tar", "lmdb", "tokens"] {
        let e = err(&stoker(&["pack", s(&src), s(&dest), "--layout", layout, "--group", "--field", "jpg"]));
        assert!(e.contains("another pack is writing it"), "{layout}: {e}");
    }
    assert!(names_of(&dest).is_empty(), "nothing written");
    held.unlock().unwrap();
    ok(&pack(&src, &dest, &[], None));
}

/// The shards a rerun counts as its own are the ones its plan makes, not a list in the plan
/// file found there (which nothing vouches for): a name added to it, with a foreign shard
/// under that name, is refused, not indexed into the manifest.
#[test]
fn a_plan_file_naming_a_foreign_shard_does_not_adopt_it() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dest) = (dir.path().join("a"), dir.path().join("out"));
    image_dir(&src, 30);
    ok(&pack(&src, &dest, &[], None));
    let plan = dest.join(".stoker-pack.json");
    let mut p: serde_json::Value = serde_json::from_slice(&std::fs::read(&plan).unwrap()).unwrap();
    let mut forged = p["shards"][0].clone();
    forged["name"] = "foreign.tar".into();
    p["shards"].as_array_mut().unwrap().push(forged);
    std::fs::write(&plan, serde_json::to_vec(&p).unwrap()).unwrap();
    std::fs::copy(dest.join("shard-000000.tar"), dest.join("foreign.tar")).unwrap();
    let e = err(&pack(&src, &dest, &[], None));
    assert!(e.contains("foreign.tar"), "{e}");
    std::fs::remove_file(dest.join("foreign.tar")).unwrap();
    assert_eq!(ok(&pack(&src, &dest, &[], None))["samples"], 30);
}

#[test]
fn a_source_rewritten_at_its_size_between_runs_is_another_pack() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dest, clean) = (dir.path().join("a"), dir.path().join("out"), dir.path().join("clean"));
    image_dir(&src, 30);
    assert!(!pack(&src, &dest, &[], Some(15)).status.success(), "the injected abort");
    // A file rewritten in place at its size (its time moves): the landed shards hold its old
    // bytes, which the resume kept as the pack's.
    let f = src.join("part0").join("img0003.jpg");
    let other: Vec<u8> = std::fs::read(&f).unwrap().iter().map(|b| b ^ 0x5a).collect();
    std::fs::write(&f, other).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options().write(true).open(&f).unwrap().set_modified(later).unwrap();
    let e = err(&pack(&src, &dest, &[], None));
    assert!(e.contains("source has changed") && e.contains("--force"), "{e}");
    ok(&pack(&src, &dest, &["--force"], None));
    ok(&pack(&src, &clean, &[], None));
    let tars = |d: &Path| files(d).into_iter().filter(|(n, _)| n.ends_with(".tar")).collect::<Vec<_>>();
    assert!(tars(&dest) == tars(&clean), "every shard as a pack of the source as it is now");
}

#[test]
fn an_lmdb_that_is_not_the_packs_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dest) = (dir.path().join("files"), dir.path().join("out"));
    std::fs::create_dir(&src).unwrap();
    for i in 0..20 {
        std::fs::write(src.join(format!("s{i:02}.bin")), format!("sample {i}").repeat(i + 1)).unwrap();
    }
    let run = || stoker(&["pack", s(&src), s(&dest), "--layout", "lmdb", "--json"]);
    ok(&run());
    let clean = std::fs::read(dest.join("data.mdb")).unwrap();
    // An empty data.mdb (or another environment) in its place is not a finished pack.
    std::fs::write(dest.join("data.mdb"), b"").unwrap();
    let r = ok(&run());
    assert_eq!((r["resumed_shards"].as_u64(), r["written_samples"].as_u64()), (Some(0), Some(20)), "{r}");
    assert_eq!(std::fs::metadata(dest.join("data.mdb")).unwrap().len(), clean.len() as u64);
    // The pack's own is kept.
    let r = ok(&run());
    assert_eq!(r["resumed_shards"].as_u64(), Some(1), "{r}");
    // A byte changed in place (LMDB keeps no checksums: the record would read back changed,
    // without an error): no longer what landed, so written again.
    let data = dest.join("data.mdb");
    let mut b = std::fs::read(&data).unwrap();
    let at = b.iter().rposition(|&x| x == b'e').unwrap();
    b[at] = b'E';
    std::fs::write(&data, b).unwrap();
    let r = ok(&run());
    assert_eq!((r["resumed_shards"].as_u64(), r["written_samples"].as_u64()), (Some(0), Some(20)), "{r}");
    assert_eq!(std::fs::read(&data).unwrap()[at], b'e', "the changed byte is written again");
}
