//! `stoker tokens`: packed batches of a text corpus tokenized in Rust, the same global batches
//! at world sizes 1 and 2, and a run stopped mid-epoch resumed at another world size.

use std::path::Path;
use std::process::{Command, Output};

use crate::bench::TOKENIZER;
use crate::common::text;

/// `stoker tokens ARGS` with the token cache in `cache`.
fn tokens(cache: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stoker"));
    c.arg("tokens").args(args).env("STOKER_CACHE_DIR", cache);
    c.env_remove("RANK").env_remove("WORLD_SIZE");
    c.output().expect("run stoker")
}

fn ok(out: Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn ids(path: &Path) -> Vec<i32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect()
}

/// Rows of `row` tokens, `per_rank` rows a batch from each of `ranks`, put back in global order.
fn interleave(ranks: &[Vec<i32>], per_rank: usize, row: usize) -> Vec<i32> {
    let chunk = per_rank * row;
    let batches = ranks[0].len() / chunk;
    (0..batches).flat_map(|b| ranks.iter().flat_map(move |r| r[b * chunk..(b + 1) * chunk].to_vec())).collect()
}

#[test]
fn packed_batches_are_the_same_at_any_world_size_and_resume_at_another() {
    let dir = tempfile::tempdir().unwrap();
    let (data, cache) = (dir.path().join("text"), dir.path().join("cache"));
    std::fs::create_dir(&data).unwrap();
    let words = |i: usize| i % 5 + 1;
    let lines: String = (0..40).map(|i| format!("{{\"text\": \"{}\"}}\n", "hello world ".repeat(words(i)))).collect();
    std::fs::write(data.join("a.jsonl"), lines).unwrap();
    let tok = dir.path().join("tokenizer.json");
    std::fs::write(&tok, TOKENIZER).unwrap();
    let (uri, tok) = (data.to_str().unwrap(), tok.to_str().unwrap());
    let base = ["--tokenizer", tok, "--eos", "<eos>", "--seq-len", "8", "--global-batch", "4", "--json"];
    let run = |extra: &[&str], dump: &str| {
        let out = dir.path().join(dump);
        let mut a = vec![uri];
        a.extend_from_slice(&base);
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--dump", out.to_str().unwrap()]);
        (ok(tokens(&cache, &a)), ids(&out))
    };

    // In order: the stream is every document's ids and EOS, cut every 8 tokens.
    let stream: Vec<i32> = (0..40).flat_map(|i| [1, 2].repeat(words(i)).into_iter().chain([3])).collect();
    let (lines, all) = run(&[], "in-order.bin");
    let batches = stream.len() / 32;
    assert_eq!(lines[0]["global_batches"], batches as u64);
    assert_eq!(lines[0]["tokens"], (batches * 32) as u64);
    assert_eq!(all, stream[..batches * 32]);

    // Shuffled: two ranks' rows are the single rank's global batches.
    let shuffled = ["--shuffle", "--seed", "5"];
    let (_, one) = run(&shuffled, "w1.bin");
    assert_ne!(one, all, "shuffled");
    let rank = |r: &str| run(&[&shuffled[..], &["--world-size", "2", "--rank", r]].concat(), &format!("r{r}.bin")).1;
    assert_eq!(interleave(&[rank("0"), rank("1")], 2, 8), one);

    // Stopped after 3 global batches and resumed at world size 2: the rest of the same epoch.
    let state = dir.path().join("state.json");
    let s = state.to_str().unwrap();
    let (_, head) = run(&[&shuffled[..], &["--batches", "3", "--save-state", s]].concat(), "head.bin");
    assert_eq!(head, one[..3 * 32]);
    let resumed = |r: &str| {
        run(&[&shuffled[..], &["--resume", s, "--world-size", "2", "--rank", r]].concat(), &format!("t{r}.bin")).1
    };
    let tail = interleave(&[resumed("0"), resumed("1")], 2, 8);
    assert_eq!([head, tail].concat(), one);

    // uint16 ids: the same ids at two bytes each; int64 by either spelling at eight.
    let out = dir.path().join("u16.bin");
    ok(tokens(&cache, &[&[uri][..], &base, &["--ids-dtype", "uint16", "--dump", out.to_str().unwrap()]].concat()));
    let narrow: Vec<i32> =
        std::fs::read(&out).unwrap().chunks_exact(2).map(|c| i32::from(u16::from_ne_bytes([c[0], c[1]]))).collect();
    assert_eq!(narrow, all);
    for wide in [&["--int64"][..], &["--ids-dtype", "int64"]] {
        ok(tokens(&cache, &[&[uri][..], &base, wide, &["--dump", out.to_str().unwrap()]].concat()));
        assert_eq!(std::fs::metadata(&out).unwrap().len(), all.len() as u64 * 8, "{wide:?}");
    }
    let out = tokens(&cache, &[&[uri][..], &base, &["--ids-dtype", "uint8"]].concat());
    assert!(!out.status.success() && text(&out.stderr).contains("\"uint8\""), "{}", text(&out.stderr));

    // Bad requests name the option.
    let out = tokens(&cache, &[uri, "--seq-len", "8", "--eos", "<eos>"]);
    assert!(!out.status.success() && text(&out.stderr).contains("needs --tokenizer"), "{}", text(&out.stderr));
    let out = tokens(&cache, &[uri, "--tokenizer", tok, "--seq-len", "8", "--global-batch", "3", "--world-size", "2"]);
    assert!(!out.status.success() && text(&out.stderr).contains("global_batch 3"), "{}", text(&out.stderr));
    let out = tokens(&cache, &[uri, "--tokenizer", tok, "--seq-len", "8", "--eos", "<nope>"]);
    assert!(!out.status.success() && text(&out.stderr).contains("not a token"), "{}", text(&out.stderr));
}
