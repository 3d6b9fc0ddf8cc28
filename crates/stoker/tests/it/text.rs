//! JSONL text (plain, gzip, zstd) through the conformance suite locally and over S3, and
//! tokenized in Rust: ids equal the Python `tokenizers` wheel's `encode_batch` on the same
//! text, written as a Megatron dataset that a rerun keeps part by part.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::s3::{uri, SK};
use common::*;
use stoker::conformance::run_all;
use stoker::tokens::{pretokenize, TextTokenizer, TokenizeOptions};
use stoker::{Layout, Sample};

fn fixture(dir: &Path) -> Vec<Sample> {
    script_fixture(&writers_python(), "write_text.py", &["jsonl"], dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonl_plain_gzip_and_zstd_pass_conformance_locally_and_over_s3() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("text");
    let want = fixture(&dir);
    // The tokenizer and the expected ids sit beside the corpus; only .jsonl* files are read.
    let src = open(dir.to_str().unwrap()).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Jsonl));
    assert_eq!(src.info().shards, 3);
    run_all(src, &want, "text", &[]).await;
    let server = common::s3::serve(root.path()).await;
    let src = open(&uri(&server.endpoint(), "text", "")).await;
    run_all(src, &want, "s3://data/text", &[SK]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_tokens_equal_the_python_wheels_and_a_rerun_keeps_finished_parts() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("text");
    let docs = fixture(&dir);
    let want: Vec<Vec<u32>> = serde_json::from_slice(&std::fs::read(dir.join("tokens.json")).unwrap()).unwrap();
    assert_eq!(want.len(), docs.len());
    let tok = Arc::new(TextTokenizer::from_file(&dir.join("tokenizer.json")).unwrap());
    let eos = tok.token_id("<|endoftext|>").unwrap();
    let src = open(dir.to_str().unwrap()).await;
    let out = root.path().join("tokens");
    let opts = TokenizeOptions { append_eos: Some(eos), documents_per_part: 400, ..Default::default() };
    let m = pretokenize(src.clone(), tok.clone(), &out, &opts, &|_| {}).await.unwrap();
    assert_eq!(m.parts.len(), 4);
    let tokens = open(out.to_str().unwrap()).await;
    assert_eq!(tokens.info().known_layout(), Some(Layout::Tokens));
    assert_eq!(tokens.len(), want.len());
    let check = |tokens: Arc<stoker::DynSampleSource>| {
        let want = want.clone();
        async move {
            let got = tokens.get_many(&(0..tokens.len()).collect::<Vec<_>>()).await.unwrap();
            for (i, (s, w)) in got.iter().zip(&want).enumerate() {
                let ids: Vec<u32> = s
                    .field("tokens")
                    .unwrap()
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
                    .collect();
                assert_eq!(ids[..ids.len() - 1], w[..], "document {i}");
                assert_eq!(ids.last(), Some(&eos));
            }
        }
    };
    check(tokens).await;
    // Megatron-LM's own reader reads the parts as the same documents.
    let prefixes: Vec<String> = m.parts.iter().map(|p| out.join(&p.name).display().to_string()).collect();
    let res = std::process::Command::new(writers_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/py/read_megatron.py"))
        .args(&prefixes)
        .output()
        .unwrap();
    assert!(res.status.success(), "{}", String::from_utf8_lossy(&res.stderr));
    let megatron: Vec<Vec<u32>> = serde_json::from_slice(&res.stdout).unwrap();
    assert_eq!(megatron.len(), want.len());
    for (i, (m, w)) in megatron.iter().zip(&want).enumerate() {
        assert_eq!(m[..m.len() - 1], w[..], "document {i} as Megatron reads it");
    }
    // Damage part 2 and rerun: parts 0 and 1 are kept, 2 and 3 written again, same tokens.
    let bin = out.join("tokens-00002.bin");
    let mut b = std::fs::read(&bin).unwrap();
    b[10] ^= 0xff;
    std::fs::write(&bin, b).unwrap();
    let before = std::fs::metadata(out.join("tokens-00000.bin")).unwrap().modified().unwrap();
    let done = std::sync::atomic::AtomicU64::new(0);
    let again = pretokenize(src.clone(), tok.clone(), &out, &opts, &|n| {
        done.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    })
    .await
    .unwrap();
    assert_eq!(again, m);
    assert_eq!(std::fs::metadata(out.join("tokens-00000.bin")).unwrap().modified().unwrap(), before);
    assert_eq!(done.into_inner(), docs.len() as u64, "kept parts count as done, the rest tokenized again");
    check(open(out.to_str().unwrap()).await).await;
    // Another job's directory is refused.
    let other = TokenizeOptions { append_eos: None, ..opts.clone() };
    let e = pretokenize(src, tok, &out, &other, &|_| {}).await.unwrap_err().to_string();
    assert!(e.contains("another job"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_text_and_bad_tokenizers_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.jsonl"), "{\"text\": \"fine\"}\nnot json at all\n{\"body\": \"x\"}\n").unwrap();
    let src = open(dir.path().to_str().unwrap()).await;
    assert_eq!(src.len(), 3);
    assert_eq!(&src.get(0).await.unwrap().field("text").unwrap()[..], b"fine");
    let e = src.get(1).await.unwrap_err().to_string();
    assert!(e.contains("a.jsonl") && e.contains("a/000000001") && e.contains("not a JSON object"), "{e}");
    let e = src.get(2).await.unwrap_err().to_string();
    assert!(e.contains("no field `text`") && e.contains("text_field"), "{e}");
    let e = TextTokenizer::from_file(&dir.path().join("missing.json")).unwrap_err().to_string();
    assert!(e.contains("missing.json") && e.contains("tokenizer.json"), "{e}");
    std::fs::write(dir.path().join("broken.json"), "{\"model\": 5}").unwrap();
    let e = TextTokenizer::from_file(&dir.path().join("broken.json")).unwrap_err().to_string();
    assert!(e.contains("broken.json") && e.contains("not a tokenizer.json"), "{e}");
    // A zstd bomb: a few KB that would decompress to gigabytes.
    let bomb = zstd::encode_all(std::io::repeat(b' ').take(200 << 20), 19).unwrap();
    assert!(bomb.len() < 100_000);
    let b = tempfile::tempdir().unwrap();
    std::fs::write(b.path().join("bomb.jsonl.zst"), &bomb).unwrap();
    let e = stoker::open(b.path().to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("bomb.jsonl.zst") && e.contains("decompression bomb"), "{e}");
}

use std::io::Read as _;
