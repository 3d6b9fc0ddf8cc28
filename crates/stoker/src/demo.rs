//! A small demo dataset to try Stoker on and to run the docs' examples against: JPEG images
//! with labels in WebDataset tar shards, a JSONL text corpus, and a tokenizer for that text.
//! `stoker demo DIR` (CLI), `stoker.demo(DIR)` (Python) and [`write()`] write the same bytes
//! (the content is a function of the counts alone). Writing the same counts again where a
//! whole demo is (`.stoker-demo.json` records its files and sizes) writes nothing.
//!
//! ```text
//! DIR/images/train-0000.tar .. train-0003.tar   keys 000000.., fields jpg (RGB, 320x240 or
//!                                               240x320) and cls (the label, ASCII 0-9)
//! DIR/text/part-0000.jsonl, part-0001.jsonl     {"id": N, "text": "..."} per line
//! DIR/tokenizer.json                            word-level, with <|endoftext|> (id 0) and <unk>
//! ```

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// How much demo data to write.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Images (samples of `images/`), spread over four tar shards.
    pub images: usize,
    /// Documents of `text/`, spread over two JSONL files.
    pub documents: usize,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions { images: 512, documents: 1000 }
    }
}

/// What [`write()`] wrote.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The directory of image tar shards (a URI for [`open`](crate::open)).
    pub images: PathBuf,
    /// The directory of JSONL files.
    pub text: PathBuf,
    /// The tokenizer for the text (`tokenizer.json`).
    pub tokenizer: PathBuf,
    /// Bytes written in all.
    pub bytes: u64,
}

const SHARDS: usize = 4;
const TEXT_FILES: usize = 2;

/// The words of the demo text; the tokenizer's vocabulary is these, `.` and `,`.
const WORDS: &[&str] = &[
    "the", "a", "of", "and", "to", "in", "is", "it", "that", "on", "was", "for", "with", "as", "by", "at", "from",
    "this", "data", "model", "train", "batch", "sample", "shard", "read", "write", "fast", "slow", "river", "stone",
    "light", "green", "small", "large", "early", "late", "north", "south", "field", "house", "city", "road", "water",
    "tree", "cloud", "night", "day", "year", "time", "people", "work", "world", "number", "part", "place", "hand",
    "eye", "voice", "song", "story", "letter", "paper", "window", "door", "table", "chair", "garden", "bridge",
    "mountain", "valley", "forest", "ocean", "island", "winter", "summer", "spring", "autumn", "morning", "evening",
    "bright", "quiet", "open", "close", "old", "new", "long", "short", "high", "low", "warm", "cold", "red", "blue",
    "walks", "runs", "sees", "makes", "finds", "holds", "turns", "keeps", "brings", "leaves", "carries", "builds",
];

/// Write the demo dataset under `dir` (created if missing; files of the same names are
/// replaced). Errors name the file that could not be written.
pub fn write(dir: &Path, opts: &DemoOptions) -> Result<DemoReport> {
    if opts.images == 0 || opts.documents == 0 {
        return Err(Error::InvalidOption { message: "the demo needs at least one image and one document".to_owned() });
    }
    let images = dir.join("images");
    let text = dir.join("text");
    let tokenizer = dir.join("tokenizer.json");
    let marker = dir.join(MARKER);
    if let Some(bytes) = already_written(dir, opts) {
        return Ok(DemoReport { images, text, tokenizer, bytes });
    }
    // Each file written, with its size: the record that lets a second write skip the work.
    let mut written: Vec<(PathBuf, u64)> = Vec::new();
    let mut put = |path: PathBuf, fill: &dyn Fn(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>| {
        let n = write_file(&path, fill)?;
        written.push((path, n));
        Ok::<(), Error>(())
    };
    for d in [&images, &text] {
        std::fs::create_dir_all(d).map_err(|e| io_err(d, e))?;
    }
    for s in 0..SHARDS {
        let range = part(opts.images, SHARDS, s);
        put(images.join(format!("train-{s:04}.tar")), &|w| {
            let mut b = tar::Builder::new(w);
            b.mode(tar::HeaderMode::Deterministic);
            for i in range.clone() {
                let label = format!("{}", label(i));
                append(&mut b, &format!("{i:06}.jpg"), &jpeg(i)?)?;
                append(&mut b, &format!("{i:06}.cls"), label.as_bytes())?;
            }
            b.into_inner()?.flush()
        })?;
    }
    for f in 0..TEXT_FILES {
        let range = part(opts.documents, TEXT_FILES, f);
        put(text.join(format!("part-{f:04}.jsonl")), &|w| {
            for i in range.clone() {
                let line = serde_json::json!({ "id": i, "text": document(i) });
                serde_json::to_writer(&mut *w, &line)?;
                w.write_all(b"\n")?;
            }
            w.flush()
        })?;
    }
    put(tokenizer.clone(), &|w| {
        serde_json::to_writer_pretty(&mut *w, &tokenizer_json())?;
        w.flush()
    })?;
    let bytes = written.iter().map(|(_, n)| n).sum();
    let files: serde_json::Map<String, serde_json::Value> = written
        .iter()
        .filter_map(|(p, n)| Some((p.strip_prefix(dir).ok()?.to_str()?.to_owned(), (*n).into())))
        .collect();
    let record = serde_json::json!({"images": opts.images, "documents": opts.documents, "files": files});
    write_file(&marker, &|w| {
        serde_json::to_writer(&mut *w, &record)?;
        w.flush()
    })?;
    Ok(DemoReport { images, text, tokenizer, bytes })
}

/// The record of a finished write, beside the data.
const MARKER: &str = ".stoker-demo.json";

/// The bytes of a demo of these counts already under `dir` (every file its recorded size).
fn already_written(dir: &Path, opts: &DemoOptions) -> Option<u64> {
    // Our record is a few hundred bytes; anything else there is not ours, and is not read whole.
    let mut text = Vec::new();
    std::fs::File::open(dir.join(MARKER)).ok()?.take(64 << 10).read_to_end(&mut text).ok()?;
    let record: serde_json::Value = serde_json::from_slice(&text).ok()?;
    if record["images"].as_u64()? != opts.images as u64 || record["documents"].as_u64()? != opts.documents as u64 {
        return None;
    }
    let mut bytes = 0;
    for (name, size) in record["files"].as_object()? {
        let len = std::fs::metadata(dir.join(name)).ok()?.len();
        (Some(len) == size.as_u64()).then_some(())?;
        bytes += len;
    }
    Some(bytes)
}

/// Items `k`'s share of `n` split into `parts` runs (the last ones may be short or empty).
fn part(n: usize, parts: usize, k: usize) -> std::ops::Range<usize> {
    let each = n.div_ceil(parts);
    (k * each).min(n)..((k + 1) * each).min(n)
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::Io { path: format!("{} (writing the demo dataset)", path.display()), source: e }
}

/// Write `path` through `fill`, via a temporary name, so a file is whole or absent; its size.
fn write_file(
    path: &Path,
    fill: &dyn Fn(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<u64> {
    let tmp = path.with_extension("partial");
    let run = || -> std::io::Result<u64> {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        fill(&mut w)?;
        let n = w.get_ref().metadata()?.len();
        drop(w);
        std::fs::rename(&tmp, path)?;
        Ok(n)
    };
    run().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_err(path, e)
    })
}

fn append<W: Write>(b: &mut tar::Builder<W>, name: &str, data: &[u8]) -> std::io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_cksum();
    b.append_data(&mut h, name, data)
}

/// SplitMix64: the demo's only randomness, so its bytes depend on the counts alone.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn label(i: usize) -> u64 {
    mix(i as u64 ^ 0x5eed) % 10
}

/// A photo-like image: a smooth two-colour gradient, a disc whose hue is the label's, and
/// mild noise (so it compresses like a photo, not like a flat test card).
fn jpeg(i: usize) -> std::io::Result<Vec<u8>> {
    let r = mix(i as u64);
    let (w, h) = if r & 1 == 0 { (320usize, 240usize) } else { (240, 320) };
    let c0 = [(r >> 8) as u8, (r >> 16) as u8, (r >> 24) as u8];
    let c1 = [(r >> 32) as u8, (r >> 40) as u8, (r >> 48) as u8];
    let hue = label(i) as f32 / 10.0;
    let disc = hsv(hue, 0.8, 0.9);
    let (cx, cy) = ((r >> 56) as usize % w, (r >> 4) as usize % h);
    let radius = (w.min(h) / 4 + (r >> 12) as usize % (w.min(h) / 4)) as isize;
    let mut px = Vec::with_capacity(w * h * 3);
    let mut noise = r;
    for y in 0..h {
        for x in 0..w {
            let t = (x + y) as f32 / (w + h) as f32;
            let (dx, dy) = (x as isize - cx as isize, y as isize - cy as isize);
            let inside = dx * dx + dy * dy <= radius * radius;
            noise = mix(noise);
            for c in 0..3 {
                let base = if inside { disc[c] } else { c0[c] as f32 * (1.0 - t) + c1[c] as f32 * t };
                let n = (noise >> (c * 8)) as u8 as f32 / 255.0 * 12.0 - 6.0;
                px.push((base + n).clamp(0.0, 255.0) as u8);
            }
        }
    }
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 90)
        .encode(&px, w as u16, h as u16, jpeg_encoder::ColorType::Rgb)
        .map_err(std::io::Error::other)?;
    Ok(out)
}

fn hsv(h: f32, s: f32, v: f32) -> [f32; 3] {
    let i = (h * 6.0).floor();
    let f = h * 6.0 - i;
    let (p, q, t) = (v * (1.0 - s), v * (1.0 - f * s), v * (1.0 - (1.0 - f) * s));
    let rgb = match i as i32 % 6 {
        0 => [v, t, p],
        1 => [q, v, p],
        2 => [p, v, t],
        3 => [p, q, v],
        4 => [t, p, v],
        _ => [v, p, q],
    };
    rgb.map(|c| c * 255.0)
}

/// Document `i`: 20 to 300 words in sentences of 5 to 16 words.
fn document(i: usize) -> String {
    let mut r = mix(i as u64 ^ 0xd0c5);
    let words = 20 + (r % 281) as usize;
    let mut out = String::new();
    let mut in_sentence = 0;
    let mut sentence = 5 + (mix(r) % 12) as usize;
    for n in 0..words {
        r = mix(r);
        if n > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[(r % WORDS.len() as u64) as usize]);
        in_sentence += 1;
        if in_sentence == sentence || n + 1 == words {
            out.push('.');
            in_sentence = 0;
            sentence = 5 + (mix(r ^ 1) % 12) as usize;
        } else if r >> 60 == 0 {
            out.push(',');
        }
    }
    out
}

/// A Hugging Face `tokenizer.json` (word level, whitespace and punctuation split) whose
/// vocabulary is the demo's words.
fn tokenizer_json() -> serde_json::Value {
    let special = |id: usize, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let mut vocab = serde_json::Map::new();
    for (id, w) in ["<|endoftext|>", "<unk>", ".", ","].iter().chain(WORDS).enumerate() {
        vocab.insert((*w).to_owned(), id.into());
    }
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<|endoftext|>"), special(1, "<unk>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_use_only_the_tokenizers_words() {
        for i in 0..50 {
            let d = document(i);
            let n = d.split_whitespace().count();
            assert!((20..=300).contains(&n), "{n} words");
            for w in d.split(|c: char| c.is_whitespace() || c == '.' || c == ',').filter(|w| !w.is_empty()) {
                assert!(WORDS.contains(&w), "{w}");
            }
        }
    }
}
