//! Entry points for the coverage-guided fuzz targets in `fuzz/` (not a stable API).
//!
//! Each takes arbitrary bytes, runs one parser, and panics only when an invariant the rest
//! of the library relies on does not hold: a panic here is a bug, an `Err` is the right
//! answer to bad input.

use std::io::Cursor;

use crate::source::{manifest, tar_index};
use crate::store::ObjectInfo;

/// URIs, brace patterns, option queries and JSON option files.
pub fn uri(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    // Secret values that occur once in the URI must not show anywhere: not in the display
    // form, not in an error.
    let query = text.split_once('?').map_or("", |(_, q)| q);
    let secrets: Vec<&str> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, v)| crate::uri::is_secret_key(k) && v.len() >= 6 && text.matches(v).count() == 1)
        .map(|(_, v)| v)
        .collect();
    let said = shown_for(&text);
    for v in secrets {
        // A secret may only show where any other value would show the same (an option
        // name such as `backoff_ms` contains `ackoff_ms`): swap it and compare.
        let other: String = v.chars().map(|c| if c == 'Q' { 'Z' } else { 'Q' }).collect();
        let said_other = shown_for(&text.replacen(v, &other, 1));
        assert_eq!(said.matches(v).count(), said_other.matches(v).count(), "secret `{v}` shown: {said}");
    }
    let _ = crate::uri::expand_braces(&text);
    let _ = crate::SourceOptions::from_json(&text);
}

/// The display form and options (or the error) for a URI: everything a user may see of it.
fn shown_for(text: &str) -> String {
    let shown = crate::uri::redact(text);
    match crate::uri::parse(text) {
        Ok(parsed) => {
            assert_eq!(parsed.display, shown, "the display form is the redacted URI");
            format!("{shown} {} {:?}", parsed.display, parsed.options)
        }
        Err(e) => format!("{shown} {e} {e:?}"),
    }
}

/// A tar shard's bytes through the header walk, then every indexed field's header check.
pub fn tar_index(data: &[u8]) {
    let info =
        ObjectInfo { path: "f.tar".into(), size: data.len() as u64, modified_us: 0, e_tag: None, recorded: false };
    let Ok(idx) = tar_index::build_from(Cursor::new(data), &info, "f.tar") else { return };
    if let Err(e) = idx.check() {
        panic!("a built index must pass its own check: {e}");
    }
    for i in 0..idx.len() {
        let span = idx.span(i);
        assert!(span.end <= data.len() as u64, "sample {i} runs past the shard");
        let first = idx.starts[i] as usize;
        for (j, &(_, off, _)) in idx.sample_fields(i).iter().enumerate() {
            let header = &data[(off - tar_index::HEADER) as usize..off as usize];
            if let Err(e) = idx.check_header(first + j, &idx.keys[i], header) {
                panic!("an untouched shard fails its own header check: {e}");
            }
        }
    }
}

/// Read plans: a gap, a cap and a part size (one u16 each, 0 meaning "none" for the cap),
/// then ranges as (start, length) u16 pairs, scaled by the first byte: small numbers make
/// merges, overlaps and repeats likely; a scale near the top tests the arithmetic at u64's
/// end. [`crate::store::ranges::check`] holds the plan's invariants.
pub fn ranges(data: &[u8]) {
    use crate::store::ranges::{check, Policy};
    let Some((head, rest)) = data.split_first_chunk::<7>() else { return };
    let word = |i: usize| u16::from_le_bytes([head[i], head[i + 1]]) as u64;
    let base = if head[0] >= 0xf0 { u64::MAX - (1 << 20) } else { 0 };
    let gap = if word(1) == 0xffff { u64::MAX } else { word(1) };
    let cap = if word(3) == 0 { u64::MAX } else { word(3) };
    let part = word(5).max(1);
    let ranges: Vec<_> = rest
        .chunks_exact(4)
        .map(|c| {
            let start = base + u16::from_le_bytes([c[0], c[1]]) as u64;
            start..start.saturating_add(u16::from_le_bytes([c[2], c[3]]) as u64 % 4096)
        })
        .collect();
    check(&ranges, &Policy::new(gap, cap), part);
}

/// A sidecar index's JSON: whatever loads and validates must be safe to read by.
pub fn sidecar(data: &[u8]) {
    let Ok(idx) = serde_json::from_slice::<tar_index::ShardIndex>(data) else { return };
    if idx.check().is_err() {
        return;
    }
    exercise(&idx);
}

/// A manifest's JSON: what parses must be safe to open and read by.
pub fn manifest(data: &[u8]) {
    let Ok(mut m) = manifest::parse(data, "fuzz/.stoker-manifest.json") else { return };
    for o in m.take_listing() {
        assert!(manifest::is_clean_relative(&o.path), "path `{}` escapes the dataset", o.path);
    }
    for idx in &m.tar {
        exercise(idx);
    }
}

/// Everything a source does with a checked index short of reading: spans, fields, headers.
fn exercise(idx: &tar_index::ShardIndex) {
    for i in 0..idx.len() {
        let span = idx.span(i);
        assert!(span.start <= span.end && span.end <= idx.size, "sample {i} span {span:?} past {}", idx.size);
        let first = idx.starts[i] as usize;
        for (j, &(_, off, len)) in idx.sample_fields(i).iter().enumerate() {
            assert!(span.start + tar_index::HEADER <= off && off + len <= span.end);
            let _ = idx.check_header(first + j, &idx.keys[i], &[0u8; 512]);
        }
    }
    let _ = tar_index::intern_names(idx, &mut Default::default());
}

/// Encoded images (and labels) through the decoders under a few specs: an error is the right
/// answer to bad bytes; a panic, or an output of another size than promised, is a bug.
pub fn decode(data: &[u8]) {
    use crate::decode::SampleRng;
    use crate::decode::{decode_image, parse_int, parse_npy, Crop, Dtype, ImageLayout, ImageScratch, ImageSpec};
    let specs = [
        ImageSpec {
            size: [8, 8],
            crop: Crop::random_resized(),
            flip: 0.5,
            max_pixels: 1 << 22,
            ..ImageSpec::default()
        },
        ImageSpec {
            size: [5, 7],
            crop: Crop::Center { resize: None },
            layout: ImageLayout::Chw,
            dtype: Dtype::F16,
            max_pixels: 1 << 22,
            ..ImageSpec::default()
        },
    ];
    let mut scratch = ImageScratch::default();
    for spec in &specs {
        let mut out = vec![0u8; spec.out_bytes()];
        let _ = decode_image(spec, data, &mut SampleRng::new(1, 2, 3), &mut scratch, &mut out);
        assert_eq!(out.len(), spec.out_bytes());
    }
    let _ = parse_int(data);
    if let Ok(h) = parse_npy(data) {
        assert_eq!(Some(data.len() - h.data_offset), h.data_bytes(), "a parsed .npy promises what it holds");
    }
}

/// Random damage over a valid shard, through the skip-tolerant walk (`on_damage=skip`): it
/// must never panic or fail, and every sample it keeps must have payloads inside the file
/// behind a header that verifies; damage reports must lie inside the file too.
///
/// `data` steers the damage: each 6 bytes are (offset: u32, length / 4: u8, fill: u8)
/// overwriting part of the shard; a first byte with the low bit set also cuts the shard at
/// a point taken from the next two bytes.
pub fn resync(data: &[u8]) {
    let mut bytes = resync_fixture().to_vec();
    if data.first().is_some_and(|b| b & 1 == 1) && data.len() >= 3 {
        let cut = u16::from_le_bytes([data[1], data[2]]) as usize * 16;
        bytes.truncate(cut.min(bytes.len()));
    }
    for c in data.chunks_exact(6) {
        if bytes.is_empty() {
            break;
        }
        let off = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize % bytes.len();
        let end = (off + c[4] as usize * 4 + 1).min(bytes.len());
        // Fill values below 4 leave a recognisable pattern: zeros (a zeroed header), a copy
        // of the bytes 512 further on (a header moved), or the offset's own bytes.
        for i in off..end {
            bytes[i] = match c[5] {
                0 => 0,
                1 => bytes.get(i + 512).copied().unwrap_or(0),
                2 => (i as u8).wrapping_mul(31),
                f => f ^ (i as u8),
            };
        }
    }
    let info =
        ObjectInfo { path: "f.tar".into(), size: bytes.len() as u64, modified_us: 0, e_tag: None, recorded: false };
    let walk = tar_index::Walk { skip: true, checksums: true };
    let idx = match tar_index::build_with(Cursor::new(&bytes), &info, "f.tar", walk) {
        Ok(idx) => idx,
        Err(e) => panic!("the skip-tolerant walk must step over any damage, not fail: {e}"),
    };
    if let Err(e) = idx.check() {
        panic!("a built index must pass its own check: {e}");
    }
    for i in 0..idx.len() {
        let first = idx.starts[i] as usize;
        for (j, &(_, off, len)) in idx.sample_fields(i).iter().enumerate() {
            assert!(off >= tar_index::HEADER && off + len <= bytes.len() as u64, "sample {i} runs past the shard");
            let header = &bytes[(off - tar_index::HEADER) as usize..off as usize];
            let h = tar::Header::from_byte_slice(header);
            assert_eq!(h.cksum().ok(), Some(tar_index::header_checksum(header)), "sample {i}: a kept header verifies");
            if let Err(e) = idx.check_header(first + j, &idx.keys[i], header) {
                panic!("a kept header fails its own check: {e}");
            }
            if let Err(e) = idx.check_sum(first + j, &bytes[off as usize..(off + len) as usize]) {
                panic!("a kept payload fails the checksum taken from it: {e}");
            }
        }
    }
    for d in &idx.damage {
        assert!(d.start < d.end || d.end == bytes.len() as u64, "damage {}..{} is empty", d.start, d.end);
        assert!(d.end <= bytes.len() as u64, "damage {}..{} past the shard", d.start, d.end);
        for (_, off, len) in &idx.fields {
            assert!(off + len <= d.start || off - tar_index::HEADER >= d.end, "a kept member overlaps damage");
        }
    }
    // Resynchronisation on its own, from anywhere: only plausible headers.
    if let Some(at) = tar_index::resync(&mut Cursor::new(&bytes), data.len() as u64 * 512, bytes.len() as u64) {
        let block = &bytes[at as usize..at as usize + tar_index::HEADER as usize];
        assert!(tar_index::plausible_header(block, at, bytes.len() as u64));
    }
}

/// A valid shard of two-field samples of varied sizes (small, multi-block, and a long name
/// that needs a GNU long-name header), built once.
fn resync_fixture() -> &'static [u8] {
    static SHARD: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    SHARD.get_or_init(|| {
        let mut b = tar::Builder::new(Vec::new());
        for i in 0..16usize {
            let key = if i == 5 { format!("{}/s{i:03}", "long".repeat(30)) } else { format!("s{i:03}") };
            for (ext, len) in [("jpg", 100 + i * 173), ("cls", 1 + i % 3)] {
                let mut h = tar::Header::new_gnu();
                h.set_size(len as u64);
                h.set_mode(0o644);
                let data: Vec<u8> = (0..len).map(|j| (i * 7 + j) as u8).collect();
                // In memory: the builder cannot fail.
                let _ = b.append_data(&mut h, format!("{key}.{ext}"), &data[..]);
            }
        }
        b.into_inner().unwrap_or_default()
    })
}

/// A Parquet file's footer and page index: whatever parses must give a schema the reader
/// either maps to fields or refuses with an error.
#[cfg(feature = "parquet")]
pub fn parquet_footer(data: &[u8]) {
    crate::source::parquet::fuzz(data);
}

/// MDS and LitData `index.json` files and the items of their shards: the first byte picks
/// which; indexes must parse or fail, and items of a parsed layout must decode or fail,
/// never panic or read out of bounds.
pub fn records_index(data: &[u8]) {
    crate::source::records::fuzz(data);
}

/// Parquet page headers as the store hands a column chunk to the reader: the first 8 bytes
/// are the chunk's claimed total and the budget, the rest the pages. A walk that says yes
/// must have checked that every page's claims fit both.
#[cfg(feature = "parquet")]
pub fn parquet_pages(data: &[u8]) {
    crate::source::parquet::fuzz_pages(data);
}

/// A compressed shard or frame with the size its index claims: the first byte picks the
/// codec, the next 4 the claim (0: none), the rest is the data; decompression is bounded by
/// a 1 MiB limit, and whatever comes out holds to the claim and the limit.
pub fn records_codec(data: &[u8]) {
    crate::source::records::fuzz_codec(data);
}

/// A Megatron `.idx` (the first byte picks it) or a JSONL line (else): the first 8 bytes after
/// it are the `.bin`'s length, the rest the index, which must parse into sequences that all lie
/// inside that length, or fail; a line must give its text field or fail.
pub fn token_index(data: &[u8]) {
    crate::source::tokens::fuzz(data);
}

/// TFRecord framing and `tf.train.Example` payloads: the walk of a file's records, and each
/// record's parse into fields.
pub fn tfrecord(data: &[u8]) {
    crate::source::tfrecord::fuzz(data);
}

/// HDF5 files: the superblock, object headers, groups (symbol tables, link messages, fractal
/// heaps), chunk indexes, filters (LZF ours) and variable-length values, through the same walk
/// and column reads as the layout.
#[cfg(feature = "hdf5")]
pub fn hdf5(data: &[u8]) {
    crate::source::hdf5::fuzz(data);
}
