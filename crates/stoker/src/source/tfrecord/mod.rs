//! TFRecord files (`.tfrecord`, `.tfrecords`, `.tfrec`, and gzip-compressed `.gz` of each), as
//! TensorFlow's `TFRecordWriter` and the `tfrecord` package write them: records framed as
//!
//! ```text
//! u64 length (LE) | u32 masked CRC32C of the length | data | u32 masked CRC32C of the data
//! ```
//!
//! The first open walks each file once, checking every length's checksum (or, where the
//! `tfrecord` package's index lies beside a plain file, reads that instead: [`tfindex`]), and keeps where each
//! record's data lies in a span index on disk (see [`super::span_file`], also for the `.gz`
//! files: decompressed once per process). A record is then one ranged read, its data checked
//! against its CRC32C before it is used: a flipped bit is an error naming the file, the record
//! and its byte offset (`on_damage=skip` / `skip_errors` step over the record, counted). A
//! length that fails its checksum, or a file that ends inside a record, is an error at open
//! naming the file, record and offset: past it, nothing says where the next record starts.
//!
//! Records holding a `tf.train.Example` (decided by the first record that reads) become samples whose
//! fields are its features ([`example`]); any other payload (a `SequenceExample`, raw bytes)
//! is one field, `data`. A file is a shard; keys are `<file without suffix>/<record, 9 digits>`.

mod example;
mod tfindex;

use std::fmt;
use std::io::Read;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::span_file::SpanFiles;
use super::span_index::TFRECORD_RECORDS;
use super::{Capability, DynSampleSource, SampleSource, SourceInfo};
use crate::error::{Error, Result};
use crate::sample::{Field, Sample};
use crate::store::{IoCounters, ObjectInfo, Store};
use crate::uri::{Layout, SourceOptions};

/// File name endings this layout reads.
pub(crate) const SUFFIXES: [&str; 6] =
    [".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz", ".tfrec.gz"];

/// The checksum TFRecord frames carry: CRC32C, rotated and offset so that a CRC of data that
/// holds CRCs is not itself trivial.
pub(crate) fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// What the records hold, decided by the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Payload {
    Example,
    Raw,
}

/// TFRecord files, records in file order.
pub(crate) struct TfRecordSource {
    files: SpanFiles,
    payload: Payload,
    data: Arc<str>,
    display: String,
}

impl fmt::Debug for TfRecordSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TfRecordSource").field("source", &self.display).field("files", &self.files.count()).finish()
    }
}

impl fmt::Display for TfRecordSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

/// Open the TFRecord files `listing` (in path order).
pub(crate) async fn open(
    store: Store,
    listing: Vec<ObjectInfo>,
    opts: &SourceOptions,
    display: String,
) -> Result<Arc<DynSampleSource>> {
    let files =
        SpanFiles::open(store, listing, opts, &TFRECORD_RECORDS, (scan, Some(&tfindex::TFINDEX)), &SUFFIXES).await?;
    let mut src = TfRecordSource { files, payload: Payload::Raw, data: "data".into(), display };
    // The first record that reads decides (a damaged one is the reads' to report, counted
    // under the skip policy, not a reason to refuse the dataset).
    for i in 0..src.len().min(8) as u64 {
        let (f, r) = src.files.locate(i).ok_or_else(|| Error::internal("a record below the count not found"))?;
        let read = src.files.read(f, &[r]).await.and_then(|mut got| {
            let (at, framed) = got.pop().ok_or_else(|| Error::internal("no record read"))?;
            src.unframe(f, r, at, framed)
        });
        if let Ok(first) = read {
            if example::parse(&first).is_some() {
                src.payload = Payload::Example;
            }
            break;
        }
    }
    Ok(Arc::new(src))
}

/// Walk one file's records, handing each record's data and its CRC (`data..data + len + 4`) to
/// `record`; returns the file's length.
fn scan(r: &mut dyn Read, record: &mut dyn FnMut(u64, u64) -> std::io::Result<()>) -> std::io::Result<u64> {
    let mut r = std::io::BufReader::with_capacity(1 << 20, r);
    let (mut at, mut n) = (0u64, 0u64);
    let bad = |n: u64, at: u64, why: &str| std::io::Error::other(format!("record {n} at byte {at}: {why}"));
    loop {
        let mut head = [0u8; 12];
        let got = read_full(&mut r, &mut head)?;
        if got == 0 {
            return Ok(at);
        }
        if got < head.len() {
            return Err(bad(n, at, "the file ends inside a record's header (truncated?)"));
        }
        let len = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
        let crc = u32::from_le_bytes(head[8..].try_into().unwrap_or_default());
        if masked_crc(&head[..8]) != crc {
            return Err(bad(n, at, "its length fails its checksum: not a TFRecord file, or damaged here"));
        }
        let data = at + 12;
        let skipped = std::io::copy(&mut (&mut r).take(len.saturating_add(4)), &mut std::io::sink())?;
        if skipped < len.saturating_add(4) {
            return Err(bad(n, at, &format!("the file ends inside the record ({len} bytes of data announced)")));
        }
        record(data, data + len + 4)?;
        (at, n) = (data + len + 4, n + 1);
    }
}

/// Read until `buf` is full or the reader ends; how many bytes were read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..])? {
            0 => break,
            k => got += k,
        }
    }
    Ok(got)
}

impl TfRecordSource {
    /// The data of record `r` of file `f` (starting at byte `at`) from its bytes and CRC,
    /// checked against the CRC.
    fn unframe(&self, f: usize, r: usize, at: u64, framed: Bytes) -> Result<Bytes> {
        let cut = framed.len().checked_sub(4).ok_or_else(|| self.damaged(f, r, at, "a short read"))?;
        let (data, crc) = (framed.slice(..cut), &framed[cut..]);
        if masked_crc(&data).to_le_bytes() != crc {
            let why = "its data fails its CRC32C: the file is damaged here (or a `.tfindex` it was first opened \
                       with places this record wrongly: then delete that, and the `.stoker-records` index made from \
                       it beside the file or in index_dir, and open it again)";
            return Err(self.damaged(f, r, at, why));
        }
        Ok(data)
    }

    fn damaged(&self, f: usize, r: usize, at: u64, why: &str) -> Error {
        Error::CorruptData {
            shard: self.files.describe(f),
            key: self.files.key(f, r),
            field: String::new(),
            reason: format!("record {r} (data at byte {at}): {why}"),
        }
    }

    fn sample(&self, f: usize, r: usize, data: Bytes, names: &mut example::NameCache) -> Result<Sample> {
        let key = self.files.key(f, r);
        match self.payload {
            Payload::Raw => Ok(Sample { key, fields: vec![Field { name: self.data.clone(), data }] }),
            Payload::Example => match example::parse(&data) {
                Some(features) => match example::to_fields(features, names) {
                    Ok(fields) => Ok(Sample { key, fields }),
                    Err(why) => Err(Error::CorruptData {
                        shard: self.files.describe(f),
                        key,
                        field: String::new(),
                        reason: format!("record {r}: {why}"),
                    }),
                },
                None => Err(Error::CorruptData {
                    shard: self.files.describe(f),
                    key,
                    field: String::new(),
                    reason: format!(
                        "record {r} is not a tf.train.Example with features, where the first record of the dataset is"
                    ),
                }),
            },
        }
    }
}

#[async_trait]
impl SampleSource for TfRecordSource {
    fn len(&self) -> usize {
        self.files.len()
    }

    fn capability(&self) -> Capability {
        self.files.capability()
    }

    fn info(&self) -> SourceInfo {
        SourceInfo::of(Layout::Tfrecord, self.files.count())
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        self.get_many(&[index]).await?.pop().ok_or_else(|| Error::internal("no sample for a checked index"))
    }

    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        let mut names = example::NameCache::default();
        self.files
            .get_many(indices, |f, r, at, framed| {
                let data = self.unframe(f, r, at, framed)?;
                self.sample(f, r, data, &mut names)
            })
            .await
    }

    fn locality(&self, index: usize) -> Option<usize> {
        self.files.locality(index)
    }

    fn location(&self, index: usize) -> Option<String> {
        self.files.location(index)
    }

    fn io_counters(&self) -> Option<IoCounters> {
        Some(self.files.store().counters())
    }

    fn fingerprint(&self) -> Option<u64> {
        Some(self.files.fingerprint())
    }
}

/// The fuzz target's body (see [`crate::fuzzing::tfrecord`]): spans the walk hands out
/// increase inside the file, and every record (and the whole input) parses or is refused
/// without a panic, its fields inside the record.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz(data: &[u8]) {
    let mut spans = Vec::new();
    let walked = scan(&mut &data[..], &mut |s, e| {
        spans.push((s, e));
        Ok(())
    });
    if let Ok(len) = walked {
        assert_eq!(len, data.len() as u64);
        let mut next = 0;
        for &(s, e) in &spans {
            assert!(next <= s && s + 4 <= e && e <= len, "span {s}..{e} after {next} in {len} bytes");
            next = e;
        }
    }
    let whole = Bytes::copy_from_slice(data);
    let records = spans.iter().map(|&(s, e)| whole.slice(s as usize..e as usize - 4)).chain([whole.clone()]);
    for record in records {
        if let Some(features) = example::parse(&record) {
            let total: usize = example::to_fields(features, &mut example::NameCache::default())
                .unwrap_or_default()
                .iter()
                .filter(|f| !f.data.starts_with(b"\x93NUMPY"))
                .map(|f| f.data.len())
                .sum();
            assert!(total <= record.len() * 20 + 64, "fields out of proportion to the record");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(data: &[u8]) -> Vec<u8> {
        let len = (data.len() as u64).to_le_bytes();
        [&len[..], &masked_crc(&len).to_le_bytes(), data, &masked_crc(data).to_le_bytes()].concat()
    }

    fn walk(b: &[u8]) -> std::io::Result<(Vec<(u64, u64)>, u64)> {
        let mut spans = Vec::new();
        let len = scan(&mut &b[..], &mut |s, e| {
            spans.push((s, e));
            Ok(())
        })?;
        Ok((spans, len))
    }

    #[test]
    fn records_are_framed_and_checked() {
        // The masked CRC of the `tfrecord` package and TensorFlow (crc32c of b"" is 0).
        assert_eq!(masked_crc(b""), 0xa282_ead8);
        let file = [frame(b"abc"), frame(b""), frame(&[7u8; 300])].concat();
        let (spans, len) = walk(&file).unwrap();
        assert_eq!(spans, vec![(12, 19), (31, 35), (47, 351)]);
        assert_eq!(len, file.len() as u64);
        let e = walk(&file[..file.len() - 2]).unwrap_err().to_string();
        assert!(e.contains("record 2 at byte 35") && e.contains("ends inside the record"), "{e}");
        let e = walk(&file[..20]).unwrap_err().to_string();
        assert!(e.contains("record 1 at byte 19") && e.contains("header"), "{e}");
        let mut bad = file.clone();
        bad[20] ^= 1; // the second record's length
        let e = walk(&bad).unwrap_err().to_string();
        assert!(e.contains("record 1") && e.contains("checksum"), "{e}");
        let e = walk(b"not a tfrecord file at all").unwrap_err().to_string();
        assert!(e.contains("record 0 at byte 0"), "{e}");
    }
}
