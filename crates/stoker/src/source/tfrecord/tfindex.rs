//! The `tfrecord` package's index files, read at a first open in place of the walk: text, one
//! line a record, `<byte offset of the record> <its length with framing>`, as its
//! `tfrecord2idx` writes them. Its `create_indices` names them `<file without extension>.tfindex`;
//! its `MultiTFRecordDataset` examples use `.index`.
//!
//! Untrusted like the file (see [`Sidecar`]): the records must cover the file exactly, and
//! the framing of up to [`CHECKED`] of them (the first, the last and some between) is read and
//! checked against the index: length and the length's checksum. A record the index gets wrong
//! that these miss fails its data checksum when it is read, an error naming it.

use std::ops::Range;

use super::masked_crc;
use crate::source::span_file::{Checked, ReadRanges, Sidecar, SpansOr};

/// What TFRecord opens look for beside a plain file.
pub(crate) static TFINDEX: Sidecar = Sidecar { names, max_len, parse, check };

/// Records whose framing is checked against the index at open.
const CHECKED: usize = 8;

/// A record's framing: the length (8 bytes), its checksum (4), and after the data, the data's
/// checksum (4).
const FRAMING: u64 = 16;

fn names(path: &str) -> Vec<String> {
    // As Python's `os.path.splitext`: the last extension of the file name, not of a directory.
    let cut = path.rfind('.').filter(|&dot| !path[dot..].contains('/'));
    let stem = &path[..cut.unwrap_or(path.len())];
    vec![format!("{stem}.tfindex"), format!("{stem}.index")]
}

/// The longest index of a file of `size` bytes: a line per record (at least [`FRAMING`]
/// bytes each), two numbers of at most 20 digits, a space and a line end (`\r\n`).
fn max_len(size: u64) -> u64 {
    (size / FRAMING + 1).saturating_mul(43)
}

/// Each record's data and data checksum (`data..data + len + 4`, the walk's spans), from the
/// index's lines.
fn parse(text: &[u8], size: u64) -> SpansOr {
    let text = std::str::from_utf8(text).map_err(|_| "not text".to_string())?;
    let (mut spans, mut at) = (Vec::new(), 0u64);
    for (n, line) in text.lines().enumerate() {
        let bad = |why: String| format!("line {}: {why}", n + 1);
        let numbers =
            line.trim_end().split_once(' ').and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
        let (start, len) = numbers.ok_or_else(|| bad(format!("`{}` is not `OFFSET LENGTH`", line.escape_debug())))?;
        if start != at {
            return Err(bad(format!("a record at byte {start} where the one before ends at {at}")));
        }
        if len < FRAMING {
            return Err(bad(format!("a record of {len} bytes, shorter than its framing ({FRAMING})")));
        }
        let end = start.checked_add(len).filter(|&end| end <= size);
        let end =
            end.ok_or_else(|| bad(format!("a record of {len} bytes at {start}, past the file's end ({size})")))?;
        spans.push((start + 12, end));
        at = end;
    }
    if at != size {
        return Err(format!("its records end at byte {at} of the file's {size}"));
    }
    Ok(spans)
}

/// The framing of the first, last and some records between, read and compared.
fn check(spans: &[(u64, u64)], read: ReadRanges) -> Checked {
    let Some(last) = spans.len().checked_sub(1) else {
        return Ok(());
    };
    let mut which: Vec<usize> = (0..CHECKED).map(|k| k * last / (CHECKED - 1)).collect();
    which.dedup();
    let heads: Vec<Range<u64>> = which.iter().map(|&r| spans[r].0 - 12..spans[r].0).collect();
    let got = read(&heads).map_err(|e| e.to_string())?;
    for (&r, head) in which.iter().zip(&got) {
        let (data, end) = spans[r];
        let len = head.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
        let crc = head.get(8..12).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
        let framed = len.zip(crc).is_some_and(|(len, crc)| {
            // Checked: both lengths are the file's and the index's, either may lie.
            masked_crc(&len.to_le_bytes()) == crc
                && len.checked_add(4).is_some_and(|l| Some(l) == end.checked_sub(data))
        });
        if !framed {
            return Err(format!("record {r} at byte {}: the file's framing there disagrees", data - 12));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_must_cover_the_file_in_order() {
        assert_eq!(names("d/a.b/train-0.tfrecord"), ["d/a.b/train-0.tfindex", "d/a.b/train-0.index"]);
        assert_eq!(names("d.x/noext"), ["d.x/noext.tfindex", "d.x/noext.index"]);
        assert_eq!(parse(b"0 20\n20 16\n", 36), Ok(vec![(12, 20), (32, 36)]));
        assert_eq!(parse(b"0 20\r\n20 16\r\n", 36), Ok(vec![(12, 20), (32, 36)]));
        assert_eq!(parse(b"", 0), Ok(vec![]));
        for (text, size, why) in [
            (&b"0 20\n"[..], 36, "end at byte 20"),
            (b"0 20\n21 15\n", 36, "line 2: a record at byte 21"),
            (b"0 20\n20 15\n", 35, "shorter than its framing"),
            (b"0 20\n20 99\n", 36, "past the file's end"),
            (b"0 18446744073709551615\n", 36, "past the file's end"),
            (b"0,20\n", 20, "not `OFFSET LENGTH`"),
            (b"0 -20\n", 20, "not `OFFSET LENGTH`"),
            (b"\xff\n", 20, "not text"),
        ] {
            let e = parse(text, size).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
        assert!(max_len(36) >= b"0 20\n20 16\n".len() as u64);
    }

    #[test]
    fn a_record_length_near_2_to_the_64_disagrees_with_the_index_and_does_not_overflow() {
        // One record of 24 bytes (12 of header, 8 of data, 4 of data CRC) whose length field,
        // with its CRC right, claims 2^64 - 2 bytes.
        let len = u64::MAX - 1;
        let mut head = len.to_le_bytes().to_vec();
        head.extend(masked_crc(&len.to_le_bytes()).to_le_bytes());
        let read = |_: &[std::ops::Range<u64>]| Ok(vec![bytes::Bytes::from(head.clone())]);
        let e = check(&[(12, 24)], &read).unwrap_err();
        assert!(e.contains("framing there disagrees"), "{e}");
    }
}
