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

/// The ids of a tokenized document (its `tokens` field, uint16 as the parts store them).
fn ids_u16(s: &Sample) -> Vec<u32> {
    s.field("tokens").unwrap().chunks_exact(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))).collect()
}

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
                let ids = ids_u16(s);
                assert_eq!(ids[..ids.len() - 1], w[..], "document {i}");
                assert_eq!(ids.last(), Some(&eos));
            }
        }
    };
    check(tokens).await;
    // Megatron-LM's own reader reads the parts as the same documents.
    let prefixes: Vec<String> = m.parts.iter().map(|p| out.join(&p.name).display().to_string()).collect();
    let res = common::writers::run_script(&writers_python(), "read_megatron.py", &prefixes);
    assert!(res.success(), "{}", String::from_utf8_lossy(&res.stderr));
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
    // A rerun keeps part 0 (its file untouched) and writes the rest again: the same manifest
    // and tokens, every document counted as done.
    let rerun = || async {
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
    };
    rerun().await;
    // A part cut short is not read (its size is not the recorded one) and is written again,
    // with every part after it.
    let bin = out.join("tokens-00001.bin");
    let cut = std::fs::metadata(&bin).unwrap().len() - 1;
    std::fs::OpenOptions::new().write(true).open(&bin).unwrap().set_len(cut).unwrap();
    rerun().await;
    // Nothing but the parts and the manifest is left: no temporary file of any write.
    let mut names: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    let mut want_names: Vec<String> =
        m.parts.iter().flat_map(|p| [format!("{}.bin", p.name), format!("{}.idx", p.name)]).collect();
    want_names.push(stoker::tokens::MANIFEST.into());
    want_names.sort();
    assert_eq!(names, want_names);
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
    // A corpus given in the tokenizer's place is refused unread (a sparse file past the cap).
    let huge = dir.path().join("corpus.jsonl");
    std::fs::File::create(&huge).unwrap().set_len(stoker::decode::MAX_TOKENIZER_BYTES + 1).unwrap();
    let e = TextTokenizer::from_file(&huge).unwrap_err().to_string();
    assert!(e.contains("corpus.jsonl") && e.contains("larger than") && e.contains("tokenizer.json"), "{e}");
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
    // Bytes appended after the last gzip member: an error saying so, with how far it read.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, b"{\"text\": \"one\"}\n").unwrap();
    let mut tail = gz.finish().unwrap();
    tail.extend_from_slice(b"appended junk, not gzip");
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("t.jsonl.gz"), &tail).unwrap();
    let e = stoker::open(t.path().to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("t.jsonl.gz") && e.contains("after 16 bytes") && e.contains("not gzip"), "{e}");
    // A vocabulary past 65,536 entries (int32 token files) with a word of id 3,000,000,000:
    // an error naming the id, not a negative id written and then blamed on the file.
    let mut vocab: Vec<String> = (0..70_000).map(|i| format!("\"w{i}\":{i}")).collect();
    vocab.push("\"[UNK]\":70000,\"big\":3000000000".into());
    let words = format!(
        r#"{{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":{{"type":"Whitespace"}},
        "post_processor":null,"decoder":null,"model":{{"type":"WordLevel","vocab":{{{}}},"unk_token":"[UNK]"}}}}"#,
        vocab.join(",")
    );
    let tok = Arc::new(TextTokenizer::from_bytes(words.as_bytes(), "big.json").unwrap());
    let w = tempfile::tempdir().unwrap();
    std::fs::create_dir(w.path().join("src")).unwrap();
    std::fs::write(w.path().join("src/w.jsonl"), "{\"text\": \"w1 big w2\"}\n").unwrap();
    let src = open(w.path().join("src").to_str().unwrap()).await;
    let out = w.path().join("out");
    let e = pretokenize(src.clone(), tok.clone(), &out, &TokenizeOptions::default(), &|_| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("3000000000") && e.contains("int32"), "{e}");
    // uint16 ids for text of that vocabulary: said at once, naming the tokenizer (not the
    // token cache's file at the first large id).
    let text = stoker::tokens::TextInput { tokenizer: Some(tok), field: None, skip_errors: false };
    let cfg =
        stoker::tokens::PackConfig { ids: stoker::tokens::IdType::Uint16, ..stoker::tokens::PackConfig::new(4, 1) };
    let Err(e) = stoker::tokens::TokenLoader::open(src, &text, cfg).await else {
        panic!("uint16 ids for 70,002 tokens")
    };
    let e = e.to_string();
    assert!(e.contains("big.json") && e.contains("uint16") && e.contains("int32 ids"), "{e}");
}

use std::io::Read as _;

/// `FieldDecode::Tokens` in the plain Loader: each row is its document's ids (the Python
/// wheel's), EOS after, truncated or padded to `seq_len`, with its length beside; tokenized on
/// two decode threads, shuffled, so rows land from either thread in any order.
#[test]
fn the_tokens_decode_gives_each_document_its_wheel_ids_truncated_or_padded() {
    use stoker::decode::{DecodeSpec, Dtype, FieldDecode, TokenRef, TokensSpec};
    use stoker::loader::{Loader, LoaderConfig};
    use stoker::sampler::Order;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("text");
    fixture(&dir);
    let want: Vec<Vec<u32>> = serde_json::from_slice(&std::fs::read(dir.join("tokens.json")).unwrap()).unwrap();
    let tok = TextTokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    let eos = tok.token_id("<|endoftext|>").unwrap();
    let src = rt.block_on(open(dir.to_str().unwrap()));
    let seq = 24;
    // Some documents are longer than a row and some shorter: both paths run.
    assert!(want.iter().any(|w| w.len() + 1 > seq) && want.iter().any(|w| w.len() + 1 < seq));
    // uint16 ids have no negative pad: 7 there.
    let pad_of = |dtype: Dtype| if dtype == Dtype::U16 { 7 } else { -7 };
    let spec = |dtype: Dtype, truncate: bool| {
        let mut t = TokensSpec::new(dir.join("tokenizer.json").to_str().unwrap(), seq);
        let eos = Some(TokenRef::Text("<|endoftext|>".into()));
        (t.eos, t.pad_id, t.dtype, t.truncate) = (eos, pad_of(dtype), dtype, truncate);
        DecodeSpec::new().with("text", FieldDecode::Tokens(t))
    };
    for dtype in [Dtype::I32, Dtype::I64, Dtype::U16] {
        let mut cfg = LoaderConfig::new(16);
        cfg.order = Order::Shuffle { seed: 3 };
        cfg.decode = Some(spec(dtype, true));
        cfg.transform_threads = 2;
        let mut seen = 0;
        for b in Loader::new(src.clone(), cfg).unwrap().epoch_blocking(0).unwrap() {
            let b = b.unwrap();
            let ids = b.field("text").unwrap();
            let ty = ids.ty.expect("a typed column");
            assert_eq!((ty.dtype, ty.shape.as_slice()), (dtype, &[seq][..]));
            let lens = b.field("text_len").unwrap();
            for (row, &i) in b.indices().iter().enumerate() {
                let r = ids.get(row).unwrap();
                let got: Vec<i64> = match dtype {
                    Dtype::I64 => r.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect(),
                    Dtype::U16 => r.chunks_exact(2).map(|c| u16::from_ne_bytes([c[0], c[1]]) as i64).collect(),
                    _ => r.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap()) as i64).collect(),
                };
                let w = &want[i as usize];
                let doc = &w[..w.len().min(seq - 1)];
                let mut expect: Vec<i64> = doc.iter().map(|&t| t as i64).collect();
                expect.push(eos as i64);
                let len = expect.len();
                expect.resize(seq, pad_of(dtype));
                assert_eq!(got, expect, "document {i}");
                assert_eq!(lens.get(row).unwrap(), &(len as i32).to_ne_bytes(), "document {i}'s length");
                seen += 1;
            }
        }
        assert_eq!(seen, want.len());
    }
    // Without truncation, a long document is a decode error naming it and the fix; skipped, it
    // is counted and the rest arrive.
    let long = want.iter().position(|w| w.len() + 1 > seq).unwrap();
    let mut cfg = LoaderConfig::new(want.len());
    cfg.decode = Some(spec(Dtype::I32, false));
    let e = Loader::new(src.clone(), cfg.clone()).unwrap().epoch_blocking(0).unwrap().next().unwrap().unwrap_err();
    let e = e.to_string();
    let n = want[long].len();
    assert!(e.contains(&format!("(index {long})")) && e.contains("corpus-a.jsonl"), "{e}");
    assert!(e.contains(&format!("{n} tokens, more than the row's {}", seq - 1)) && e.contains("truncate"), "{e}");
    cfg.on_error = stoker::loader::ErrorPolicy::Skip;
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let rows: usize = loader.epoch_blocking(0).unwrap().map(|b| b.unwrap().len()).sum();
    let too_long = want.iter().filter(|w| w.len() + 1 > seq).count();
    assert_eq!(rows, want.len() - too_long);
    assert_eq!(loader.stats().skipped, too_long as u64);
    // Specs that cannot work are refused before a batch: a missing tokenizer, an EOS not in
    // the vocabulary, a row too short for its specials, a float dtype.
    let bad = |t: TokensSpec| {
        let mut cfg = LoaderConfig::new(4);
        cfg.decode = Some(DecodeSpec::new().with("text", FieldDecode::Tokens(t)));
        Loader::new(src.clone(), cfg).map(|_| ()).unwrap_err().to_string()
    };
    let e = bad(TokensSpec::new(root.path().join("nope.json").to_str().unwrap(), 8));
    assert!(e.contains("nope.json"), "{e}");
    let mut t = TokensSpec::new(dir.join("tokenizer.json").to_str().unwrap(), 8);
    t.eos = Some(TokenRef::Text("<|nope|>".into()));
    let e = bad(t.clone());
    assert!(e.contains("<|nope|>") && e.contains("not a token"), "{e}");
    (t.eos, t.bos, t.seq_len) = (Some(TokenRef::Id(eos)), Some(TokenRef::Id(eos)), 2);
    assert!(bad(t.clone()).contains("no room"));
    (t.seq_len, t.dtype) = (8, Dtype::F32);
    assert!(bad(t.clone()).contains("int32, int64 or uint16"));
    (t.dtype, t.pad_id) = (Dtype::U16, -100);
    let e = bad(t);
    assert!(e.contains("-100") && e.contains("uint16") && e.contains("int32"), "{e}");
    // The command line's form.
    let cli =
        DecodeSpec::from_args(&["text=tokens:tok.json:2048:eos=<|endoftext|>:bos=1:int64:no_truncate:pad=-1"]).unwrap();
    let Some(FieldDecode::Tokens(t)) = cli.get("text") else { panic!("{cli:?}") };
    assert_eq!(
        (t.tokenizer.as_str(), t.seq_len, t.pad_id, t.dtype, t.truncate),
        ("tok.json", 2048, -1, Dtype::I64, false)
    );
    assert_eq!((t.bos.clone(), t.eos.clone()), (Some(TokenRef::Id(1)), Some(TokenRef::Text("<|endoftext|>".into()))));
    assert!(DecodeSpec::from_args(&["text=tokens:tok.json"]).unwrap_err().to_string().contains("SEQ_LEN"));
    let cli = DecodeSpec::from_args(&["text=tokens:tok.json:512:uint16"]).unwrap();
    assert!(matches!(cli.get("text"), Some(FieldDecode::Tokens(t)) if t.dtype == Dtype::U16), "{cli:?}");
}

/// Text in the other layouts, each written by its own writer (one `.txt` file a document, tar
/// `.txt` members, an MDS `str` column, LitData `str` leaves, a Parquet string column):
/// tokenized in Rust into the tokens cache, every document's ids are the Python wheel's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_from_txt_files_tar_mds_litdata_and_parquet_tokenizes_like_the_wheel() {
    use stoker::tokens::tokenized;
    let root = tempfile::tempdir().unwrap();
    script_fixture(&writers_python(), "write_text.py", &["formats"], root.path());
    let want: Vec<Vec<u32>> = serde_json::from_slice(&std::fs::read(root.path().join("tokens.json")).unwrap()).unwrap();
    let tok = Arc::new(TextTokenizer::from_file(&root.path().join("tokenizer.json")).unwrap());
    let cache = root.path().join("cache");
    for (dir, field, layout) in [
        ("txt", "txt", Layout::Objects),
        ("tar", "txt", Layout::Tar),
        ("mds", "text", Layout::Mds),
        ("litdata", "text", Layout::Litdata),
        ("parquet", "text", Layout::Parquet),
    ] {
        let src = open(root.path().join(dir).to_str().unwrap()).await;
        assert_eq!(src.info().known_layout(), Some(layout), "{dir}");
        // What the tokens cache is keyed by follows the files: the same opened again, another
        // once every file's time moved (an edit).
        let fingerprint = src.fingerprint();
        assert!(fingerprint.is_some(), "{dir}");
        assert_eq!(open(root.path().join(dir).to_str().unwrap()).await.fingerprint(), fingerprint, "{dir}");
        let tokens = tokenized(src, Some(tok.clone()), Some(field.into()), &cache, false).await.unwrap();
        assert_eq!(tokens.len(), want.len(), "{dir}");
        let got = tokens.get_many(&(0..tokens.len()).collect::<Vec<_>>()).await.unwrap();
        for (i, (s, w)) in got.iter().zip(&want).enumerate() {
            let ids = ids_u16(s);
            assert_eq!(&ids, w, "{dir}: document {i}");
        }
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
        for f in files_under(&root.path().join(dir)) {
            std::fs::File::options().write(true).open(&f).unwrap().set_modified(later).unwrap();
        }
        assert_ne!(open(root.path().join(dir).to_str().unwrap()).await.fingerprint(), fingerprint, "{dir}");
    }
    // A tokenized copy whose part lost its .idx is not taken as finished (it would open with
    // that part's documents missing): the next open writes the part again, every id right.
    let alone = root.path().join("cache-txt");
    let txt_dir = root.path().join("txt").to_str().unwrap().to_string();
    let txt = || open(&txt_dir);
    tokenized(txt().await, Some(tok.clone()), Some("txt".into()), &alone, false).await.unwrap();
    let idx: Vec<_> = files_under(&alone).into_iter().filter(|p| p.extension().is_some_and(|e| e == "idx")).collect();
    assert_eq!(idx.len(), 1, "{idx:?}");
    std::fs::remove_file(&idx[0]).unwrap();
    let tokens = tokenized(txt().await, Some(tok.clone()), Some("txt".into()), &alone, false).await.unwrap();
    assert!(idx[0].exists(), "the part's index written again");
    let got = tokens.get_many(&(0..tokens.len()).collect::<Vec<_>>()).await.unwrap();
    assert_eq!(got.iter().map(ids_u16).collect::<Vec<_>>(), want);
}

/// Bad documents under `skip_errors`: a line that is not JSON, one without the field and one
/// that is not UTF-8 are written empty and listed with their reasons; the good ones keep their
/// ids and their places. Without it, the first bad line stops the run, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_documents_are_packed_empty_and_listed_under_skip_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("text");
    std::fs::create_dir(&data).unwrap();
    let mut body = b"{\"text\": \"hello world\"}\nnot json\n{\"body\": \"world\"}\n{\"text\": \"world\"}\n".to_vec();
    body.extend_from_slice(b"{\"text\": \"bad \xff utf8\"}\n{\"text\": \"hello hello\"}\n");
    std::fs::write(data.join("a.jsonl"), body).unwrap();
    let vocab = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":2,"<eos>":3},"unk_token":"[UNK]"}}"#;
    let tok = Arc::new(TextTokenizer::from_bytes(vocab.as_bytes(), "words").unwrap());
    let src = open(data.to_str().unwrap()).await;
    assert_eq!(src.len(), 6);
    let out = dir.path().join("tokens");
    let strict = TokenizeOptions { append_eos: Some(3), ..Default::default() };
    let e = pretokenize(src.clone(), tok.clone(), &out, &strict, &|_| {}).await.unwrap_err().to_string();
    assert!(e.contains("a.jsonl") && e.contains("not a JSON object"), "{e}");
    // The part the error stopped left nothing behind: no part, no temporary file.
    let left: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "{left:?}");
    let skip = TokenizeOptions { skip_errors: true, ..strict };
    let m = pretokenize(src, tok, &out, &skip, &|_| {}).await.unwrap();
    let skipped: Vec<u64> = m.parts.iter().flat_map(|p| p.skipped.iter().map(|(d, _)| *d)).collect();
    assert_eq!(skipped, [1, 2, 4]);
    let why: Vec<&str> = m.parts[0].skipped.iter().map(|(_, w)| w.as_str()).collect();
    assert!(why[0].contains("not a JSON object") && why[1].contains("no field `text`"), "{why:?}");
    assert!(why[2].contains("UTF-8"), "{why:?}");
    let tokens = open(out.to_str().unwrap()).await;
    let got = tokens.get_many(&(0..6).collect::<Vec<_>>()).await.unwrap();
    let ids: Vec<Vec<u16>> = got.iter().map(|s| ids_u16(s).into_iter().map(|t| t as u16).collect()).collect();
    assert_eq!(ids, vec![vec![1, 2, 3], vec![], vec![], vec![2, 3], vec![], vec![1, 1, 3]]);
}

/// The tokens cache is keyed by the corpus's files at their versions: a line damaged in place
/// (not the first, middle or last document) is read again and its error named, not served
/// from the cache; a second corpus of the same name and document count in another directory
/// gets its own tokens; the same files opened again reuse theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokens_cache_follows_the_files_not_their_name_or_a_sample_of_documents() {
    use stoker::tokens::tokenized;
    let dir = tempfile::tempdir().unwrap();
    let vocab = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":2},"unk_token":"[UNK]"}}"#;
    let tok = Arc::new(TextTokenizer::from_bytes(vocab.as_bytes(), "words").unwrap());
    let corpus = |root: &Path, word: &str| {
        let data = root.join("data");
        std::fs::create_dir_all(&data).unwrap();
        // Documents 0, 4 and 8 (the first, middle and last) are alike in every corpus.
        let text = |i: usize| if i.is_multiple_of(4) { "hello".to_string() } else { [word; 3][..1 + i % 3].join(" ") };
        let body: String = (0..9).map(|i| format!("{{\"text\": \"{}\"}}\n", text(i))).collect();
        std::fs::write(data.join("a.jsonl"), body).unwrap();
        data
    };
    let cache = dir.path().join("cache");
    let ids = |t: Arc<stoker::DynSampleSource>| async move {
        let got = t.get_many(&(0..t.len()).collect::<Vec<_>>()).await.unwrap();
        got.iter().map(ids_u16).collect::<Vec<_>>()
    };
    // Opened through a link (as a relative path is, from another working directory): the
    // name stays, the files behind it change.
    let hello = corpus(&dir.path().join("one"), "hello");
    let world = corpus(&dir.path().join("two"), "world");
    let link = dir.path().join("current");
    std::os::unix::fs::symlink(dir.path().join("one"), &link).unwrap();
    let named = link.join("data");
    let src = || async { open(named.to_str().unwrap()).await };
    let first = ids(tokenized(src().await, Some(tok.clone()), None, &cache, false).await.unwrap()).await;
    assert_eq!(first[..3], [vec![1], vec![1, 1], vec![1, 1, 1]]);
    let made = files_under(&cache);
    let again = ids(tokenized(src().await, Some(tok.clone()), None, &cache, false).await.unwrap()).await;
    assert_eq!((again, files_under(&cache)), (first.clone(), made.clone()), "the same files reuse their tokens");

    // Another corpus under the same name, of the same count: its own tokens.
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(dir.path().join("two"), &link).unwrap();
    let theirs = ids(tokenized(src().await, Some(tok.clone()), None, &cache, false).await.unwrap()).await;
    assert_eq!(theirs[..3], [vec![1], vec![2, 2], vec![2, 2, 2]]);
    assert_eq!(world, dir.path().join("two").join("data"));
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(dir.path().join("one"), &link).unwrap();

    // Line 2 (neither the first, the middle nor the last document) damaged in place, at the
    // same size: tokenized again, which names the bad line.
    let a = hello.join("a.jsonl");
    let mut body = std::fs::read(&a).unwrap();
    let at = body.iter().enumerate().find(|(_, &b)| b == b'\n').unwrap().0 + 1;
    body[at] = b'x';
    std::fs::write(&a, &body).unwrap();
    let e = tokenized(src().await, Some(tok.clone()), None, &cache, false).await.unwrap_err().to_string();
    assert!(e.contains("a.jsonl") && e.contains("JSON"), "{e}");

    // A corpus of blank lines holds no documents: said of it, not of the cache directory.
    let blank = dir.path().join("blank");
    std::fs::create_dir_all(&blank).unwrap();
    std::fs::write(blank.join("a.jsonl"), "\n\n\n").unwrap();
    let e = tokenized(open(blank.to_str().unwrap()).await, Some(tok), None, &cache, false).await.err().unwrap();
    assert_eq!(e.kind(), stoker::ErrorKind::Empty, "{e}");
    assert!(e.to_string().contains("blank") && !e.to_string().contains("cache"), "{e}");
}

/// The texts of documents `0..n` of `src`.
async fn texts(src: &Arc<stoker::DynSampleSource>) -> Vec<String> {
    let got = src.get_many(&(0..src.len()).collect::<Vec<_>>()).await.unwrap();
    got.iter().map(|s| String::from_utf8(s.field("text").unwrap().to_vec()).unwrap()).collect()
}

/// The line index is written on the first open (next to a local file, or in `index_dir`) and
/// read instead of the file on the next; a compressed file is then decompressed at its first
/// read. A damaged index, or one of another version of the file, is walked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_index_is_kept_on_disk_and_a_damaged_or_stale_one_is_walked_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").join("text");
    std::fs::create_dir_all(&data).unwrap();
    let line = |i: usize| format!("{{\"text\": \"doc {i}\"}}\n");
    std::fs::write(data.join("a.jsonl"), (0..3).map(line).collect::<String>()).unwrap();
    let zst = |n: usize| zstd::encode_all((0..n).map(|i| line(10 + i)).collect::<String>().as_bytes(), 3).unwrap();
    std::fs::write(data.join("b.jsonl.zst"), zst(4)).unwrap();
    let want: Vec<String> = (0..3).chain(10..14).map(|i| format!("doc {i}")).collect();
    let first = open(data.to_str().unwrap()).await;
    assert_eq!(texts(&first).await, want);
    let a_idx = data.join("a.jsonl.stoker-lines");
    assert!(a_idx.is_file() && data.join("b.jsonl.zst.stoker-lines").is_file());
    let kept = std::fs::read(&a_idx).unwrap();
    // An index written again is a new file (written aside, renamed into place).
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let first_inode = inode(&a_idx);

    let second = open(data.to_str().unwrap()).await;
    assert_eq!(inode(&a_idx), first_inode, "the second open reads the index it found");
    assert_eq!(texts(&second).await, want, "b decompressed at its first read");

    // A flipped bit in an entry: the index is not trusted, the file is walked again.
    let mut damaged = kept.clone();
    damaged[60] ^= 0x40;
    std::fs::write(&a_idx, &damaged).unwrap();
    let third = open(data.to_str().unwrap()).await;
    assert_ne!(inode(&a_idx), first_inode, "walked again");
    assert_eq!(texts(&third).await, want);
    assert_eq!(std::fs::read(&a_idx).unwrap(), kept, "rewritten whole");

    // A file that grew has another version: its old index is stale.
    std::fs::write(data.join("a.jsonl"), (0..5).map(line).collect::<String>()).unwrap();
    let grown = open(data.to_str().unwrap()).await;
    assert_eq!(grown.len(), 9);

    // A compressed file changed under an index that still looks current (same size and time)
    // is refused at its first read, not read by the old line table.
    let b = data.join("b.jsonl.zst");
    let (old_len, old_time) =
        (std::fs::metadata(&b).unwrap().len(), std::fs::metadata(&b).unwrap().modified().unwrap());
    // Padding after a zstd frame is not a frame: skippable frames are, so pad with one.
    let body = zstd::encode_all(b"{\"text\": \"x\"}\n".as_slice(), 3).unwrap();
    assert!(body.len() + 8 <= old_len as usize, "room for a skippable frame");
    let mut same_size = body.clone();
    let pad = old_len as usize - body.len() - 8;
    same_size.extend_from_slice(&0x184D2A50u32.to_le_bytes());
    same_size.extend_from_slice(&(pad as u32).to_le_bytes());
    same_size.resize(old_len as usize, 0);
    let f = std::fs::OpenOptions::new().write(true).open(&b).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &same_size, 0).unwrap();
    f.set_modified(old_time).unwrap();
    drop(f);
    let changed = open(data.to_str().unwrap()).await;
    let e = changed.get(5).await.unwrap_err().to_string();
    assert!(e.contains("b.jsonl.zst") && e.contains("b.jsonl.zst.stoker-lines"), "{e}");

    // Sidecars off: the index goes to index_dir, and nothing is written beside the data.
    let fresh = tempfile::tempdir().unwrap();
    std::fs::write(fresh.path().join("c.jsonl"), (0..2).map(line).collect::<String>()).unwrap();
    let idx_dir = dir.path().join("indexes");
    let local = format!("{}?write_sidecar=false&index_dir={}", fresh.path().display(), idx_dir.display());
    let c = open(&local).await;
    assert_eq!(texts(&c).await, ["doc 0", "doc 1"]);
    assert_eq!(std::fs::read_dir(fresh.path()).unwrap().count(), 1, "only c.jsonl");
    let kept: Vec<_> = std::fs::read_dir(&idx_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(kept.len() == 1 && kept[0].to_string_lossy().ends_with("-c.jsonl.stoker-lines"), "{kept:?}");
    let kept_inode = inode(&idx_dir.join(&kept[0]));
    assert_eq!(texts(&open(&local).await).await, ["doc 0", "doc 1"]);
    assert_eq!(inode(&idx_dir.join(&kept[0])), kept_inode, "found in index_dir");

    // Remote files: the index goes to index_dir, and a second open reads none of the files.
    let server = common::s3::serve(dir.path()).await;
    let remote = format!("{}&index_dir={}", uri(&server.endpoint(), "text", ""), idx_dir.display());
    let cold = open(&remote).await;
    assert!(cold.io_counters().unwrap().remote_bytes > 0, "the first open walks the files");
    assert_eq!(texts(&cold).await.len(), 6, "a grown to five documents, b changed to one");
    let warm = open(&remote).await;
    // (Its two requests are the listing and the probe for a manifest, neither reading the files.)
    assert_eq!(warm.io_counters().unwrap().remote_bytes, 0, "the second open reads its indexes only");
    assert_eq!(texts(&warm).await, texts(&cold).await);
}

/// Compressed files are read from their decompressed copy: documents of every length, those
/// longer than a recycled read buffer's granule (32 KiB and more) included, come back whole
/// and alone, at the end of a file or followed by others. TFRecord takes the same path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_documents_of_compressed_files_come_back_whole() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let lens = [10usize, 33_000, 5, 40_000, 70_000, 300_000, 7, 65_536];
    let text = |i: usize, n: usize| ((b'a' + i as u8) as char).to_string().repeat(n);
    let body: String = lens.iter().enumerate().map(|(i, &n)| format!("{{\"text\": \"{}\"}}\n", text(i, n))).collect();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(body.as_bytes()).unwrap();
    std::fs::write(dir.path().join("a.jsonl.gz"), gz.finish().unwrap()).unwrap();
    std::fs::write(dir.path().join("b.jsonl.zst"), zstd::encode_all(body.as_bytes(), 3).unwrap()).unwrap();
    // The same documents as TFRecord records (length, its CRC, data, its CRC), gzipped.
    let masked = |b: &[u8]| {
        let c = crc32c::crc32c(b);
        (c.rotate_right(15).wrapping_add(0xa282_ead8)).to_le_bytes()
    };
    let mut records = Vec::new();
    for (i, &n) in lens.iter().enumerate() {
        let data = text(i, n).into_bytes();
        let len = (data.len() as u64).to_le_bytes();
        records.extend_from_slice(&len);
        records.extend_from_slice(&masked(&len));
        records.extend_from_slice(&data);
        records.extend_from_slice(&masked(&data));
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&records).unwrap();
    let tf = tempfile::tempdir().unwrap();
    std::fs::write(tf.path().join("c.tfrecord.gz"), gz.finish().unwrap()).unwrap();
    for (uri, files) in [(dir.path(), 2), (tf.path(), 1)] {
        let src = stoker::open(uri.to_str().unwrap(), Default::default()).await.unwrap();
        assert_eq!(src.len(), lens.len() * files);
        let got = src.get_many(&(0..src.len()).collect::<Vec<_>>()).await.unwrap();
        for (k, s) in got.iter().enumerate() {
            let i = k % lens.len();
            assert_eq!(s.fields.len(), 1, "{}", s.key);
            assert!(s.fields[0].data == text(i, lens[i]).as_bytes(), "{}: {} bytes", s.key, s.fields[0].data.len());
        }
    }
}
