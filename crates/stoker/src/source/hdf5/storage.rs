//! The reader's side of an HDF5 file: every byte it asks for through the [`Store`], the
//! options and limits each file opens with, the filters Stoker adds (LZF), and its failures
//! turned into Stoker's errors.

use std::sync::{Arc, Mutex};

use hdf5_reader::{FilterRegistry, OpenOptions, Storage, StorageBuffer};

use crate::error::{Error, Result};
use crate::store::RangeReader;

/// Every byte the reader asks for, read through the store's [`RangeReader`] from a blocking
/// thread (a local file in place: the reader asks for many small pieces).
pub(super) struct StoreStorage {
    pub(super) reader: RangeReader,
    /// The store's error behind the first read that failed: what to report instead of the
    /// reader's account of it.
    pub(super) failure: Mutex<Option<Error>>,
}

impl Storage for StoreStorage {
    fn len(&self) -> u64 {
        self.reader.object().size()
    }

    fn read_range(&self, offset: u64, len: usize) -> hdf5_reader::error::Result<StorageBuffer> {
        let size = self.reader.object().size();
        let end =
            offset.checked_add(len as u64).filter(|&e| e <= size).ok_or(hdf5_reader::error::Error::UnexpectedEof {
                offset,
                needed: len as u64,
                available: size.saturating_sub(offset),
            })?;
        match self.reader.read(offset..end) {
            Ok(b) => Ok(StorageBuffer::from_shared_owner(Arc::new(b), 0, len)?),
            Err(e) => self.failed(e),
        }
    }
}

impl StoreStorage {
    /// Keep the store's error `e` for the report, and hand the reader its account of it.
    fn failed<T>(&self, e: Error) -> hdf5_reader::error::Result<T> {
        let shown = e.to_string();
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
        Err(hdf5_reader::error::Error::Io(std::io::Error::other(shown)))
    }
}

/// The filters Stoker decodes besides the reader's own: LZF, h5py's fast compressor, held
/// to `cap` bytes a chunk (the reader's own limit is checked only after a filter returns).
fn filters(cap: usize) -> FilterRegistry {
    let mut r = FilterRegistry::new();
    r.register(LZF_FILTER, Box::new(move |desc, data, _| lzf_filter(desc, data, cap)));
    r
}

/// HDF5's registered id of the LZF filter (h5py's `compression="lzf"`).
const LZF_FILTER: u16 = 32000;

/// Decompress an LZF chunk to the size its filter parameters announce (h5py stores the
/// chunk's byte size as the third parameter), never past `cap` (the source's chunk limit:
/// a few KB of LZF announcing 256 MiB would otherwise take that much).
fn lzf_filter(
    desc: &hdf5_reader::messages::filter_pipeline::FilterDescription,
    data: &[u8],
    cap: usize,
) -> hdf5_reader::error::Result<Vec<u8>> {
    let bad = |why: String| hdf5_reader::error::Error::DecompressionError(format!("LZF: {why}"));
    let size = desc.client_data.get(2).copied().filter(|&s| s > 0).ok_or_else(|| bad("no chunk size given".into()))?;
    let limit = cap.min(hdf5_reader::DEFAULT_MAX_CHUNK_BYTES);
    if size as usize > limit {
        // Only the source's own cap is the user's to raise.
        let whose = if cap < hdf5_reader::DEFAULT_MAX_CHUNK_BYTES { " (decoded_bytes)" } else { "" };
        return Err(bad(format!("a chunk of {size} bytes announced, over the {limit} allowed{whose}")));
    }
    super::lzf::decompress(data, size as usize).map_err(bad)
}

/// How every file opens: decoded chunks kept within `cache` bytes, no chunk or read past
/// `cap` bytes, object headers within 16 MiB (h5py writes them in kilobytes), LZF besides the
/// reader's own filters.
pub(super) fn options(cache: usize, cap: usize) -> OpenOptions {
    OpenOptions {
        chunk_cache_bytes: cache,
        filter_registry: Some(filters(cap)),
        max_chunk_bytes: cap,
        max_read_bytes: cap,
        max_object_header_bytes: 16 << 20,
        ..OpenOptions::default()
    }
}

/// `f`, with a panic of the reader (a file it was not ready for) turned into an error naming
/// the file instead of failing the task that read it.
pub(super) fn guarded<T>(shown: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Error::BadIndex {
            path: shown.to_string(),
            reason: "the HDF5 reader failed on this file (damaged, or a case it does not handle); write it again, \
                     or leave it out of the source"
                .into(),
        })
    })
}

/// An error at open: the store's own when a read failed, else the reader's, named.
pub(super) fn bad_file(s: &StoreStorage, shown: &str, e: &hdf5_reader::error::Error) -> Error {
    if let Some(failed) = s.failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return failed;
    }
    Error::BadIndex {
        path: shown.to_string(),
        reason: format!(
            "not a readable HDF5 file ({e}): it is truncated, damaged or not HDF5; write it again, or leave it out of the \
             source"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdf5_reader::messages::filter_pipeline::FilterDescription;

    #[test]
    fn an_lzf_chunk_announcing_more_than_the_cap_is_refused_before_it_is_decoded() {
        let desc = |size| FilterDescription { id: LZF_FILTER, name: None, client_data: vec![0, 0, size] };
        let e = lzf_filter(&desc(1 << 20), &[0u8; 16], 4096).unwrap_err().to_string();
        assert!(e.contains("1048576 bytes announced, over the 4096 allowed (decoded_bytes)"), "{e}");
        // Past the reader's own limit, which no option raises, the message does not send the
        // user to `decoded_bytes`.
        let big = hdf5_reader::DEFAULT_MAX_CHUNK_BYTES as u32 + 1;
        let e = lzf_filter(&desc(big), &[0u8; 16], usize::MAX).unwrap_err().to_string();
        assert!(e.contains("allowed") && !e.contains("decoded_bytes"), "{e}");
        // Within the cap the bytes are decoded (these are not LZF: refused for that).
        let e = lzf_filter(&desc(4096), &[0xffu8; 16], 4096).unwrap_err().to_string();
        assert!(!e.contains("allowed"), "{e}");
    }
}
