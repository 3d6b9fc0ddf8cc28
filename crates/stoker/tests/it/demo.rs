//! The demo dataset (`stoker demo`, `stoker.demo`): what the docs' examples run against.

use std::path::Path;

use stoker::decode::TextTokenizer;
use stoker::demo::{write, DemoOptions};
use stoker::{Layout, SourceOptions};

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for sub in ["images", "text"] {
        let mut names: Vec<_> = std::fs::read_dir(dir.join(sub)).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        out.extend(names.into_iter().map(|p| (p.display().to_string(), std::fs::read(&p).unwrap())));
    }
    out.push(("tokenizer".into(), std::fs::read(dir.join("tokenizer.json")).unwrap()));
    out
}

#[tokio::test]
async fn the_demo_opens_in_every_part_and_its_bytes_depend_on_the_counts_alone() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let opts = DemoOptions { images: 37, documents: 25 };
    let report = write(a.path(), &opts).unwrap();
    write(b.path(), &opts).unwrap();
    let (fa, fb) = (files(a.path()), files(b.path()));
    assert_eq!(fa.len(), 4 + 2 + 1);
    assert!(fa.iter().zip(&fb).all(|(x, y)| x.1 == y.1), "two writes of the same counts differ");
    assert_eq!(report.bytes, fa.iter().map(|f| f.1.len() as u64).sum::<u64>());
    // Written again: nothing to do while every file is there, whole.
    let shard = a.path().join("images/train-0001.tar");
    let before = std::fs::metadata(&shard).unwrap().modified().unwrap();
    assert_eq!(write(a.path(), &opts).unwrap().bytes, report.bytes);
    assert_eq!(std::fs::metadata(&shard).unwrap().modified().unwrap(), before);
    // A file cut short is noticed, and the demo written again.
    let f = std::fs::OpenOptions::new().write(true).open(&shard).unwrap();
    f.set_len(1000).unwrap();
    write(a.path(), &opts).unwrap();
    assert_eq!(std::fs::read(&shard).unwrap(), fa[1].1);

    let images = stoker::open(report.images.to_str().unwrap(), SourceOptions::default()).await.unwrap();
    assert_eq!(images.info().known_layout(), Some(Layout::Tar));
    assert_eq!(images.len(), 37);
    let samples = images.get_many(&(0..37).collect::<Vec<_>>()).await.unwrap();
    let mut labels = std::collections::BTreeSet::new();
    for s in &samples {
        let jpg = s.fields.iter().find(|f| &*f.name == "jpg").expect("a jpg field");
        let mut d = zune_jpeg::JpegDecoder::new(zune_jpeg::zune_core::bytestream::ZCursor::new(&jpg.data[..]));
        d.decode_headers().unwrap();
        let (w, h) = d.dimensions().unwrap();
        assert!(matches!((w, h), (320, 240) | (240, 320)), "{w}x{h}");
        let cls = s.fields.iter().find(|f| &*f.name == "cls").expect("a cls field");
        labels.insert(std::str::from_utf8(&cls.data).unwrap().parse::<u8>().unwrap());
    }
    assert!(labels.len() > 5 && labels.iter().all(|&l| l < 10), "{labels:?}");

    let text = stoker::open(report.text.to_str().unwrap(), SourceOptions::default()).await.unwrap();
    assert_eq!(text.info().known_layout(), Some(Layout::Jsonl));
    assert_eq!(text.len(), 25);
    let tok = TextTokenizer::from_file(&report.tokenizer).unwrap();
    assert_eq!(tok.token_id("<|endoftext|>"), Some(0));
    let unk = tok.token_id("<unk>").unwrap();
    for s in text.get_many(&(0..25).collect::<Vec<_>>()).await.unwrap() {
        let body = &s.fields.iter().find(|f| &*f.name == "text").expect("a text field").data;
        let ids = tok.encode(std::str::from_utf8(body).unwrap()).unwrap();
        assert!(ids.len() >= 20 && !ids.contains(&unk), "{} ids, unknown words in the demo text", ids.len());
    }
}

#[test]
fn a_demo_of_nothing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let e = write(dir.path(), &DemoOptions { images: 0, documents: 5 }).unwrap_err();
    assert!(e.to_string().contains("at least one image"), "{e}");
}
