//! A Parquet file as the Arrow reader sees it: every byte through Stoker's store (its read
//! plan, caches, fetch layer and version rule), the metadata read once.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};

use crate::error::Error;
use crate::store::{Object, Store};

/// Why a file could not be opened as Parquet, naming it and what to do.
pub(super) fn not_parquet(store: &Store, path: &str, e: ParquetError) -> Error {
    match e {
        ParquetError::External(inner) => match inner.downcast::<Error>() {
            Ok(e) => *e,
            Err(other) => bad_file(store, path, &other.to_string()),
        },
        other => bad_file(store, path, &other.to_string()),
    }
}

pub(super) fn bad_file(store: &Store, path: &str, why: &str) -> Error {
    Error::BadIndex {
        path: store.describe(path),
        reason: format!(
            "not a complete Parquet file ({why}): it is truncated or not Parquet; download or write it again, or \
             leave it out of the source"
        ),
    }
}

/// One Parquet file read through a [`Store`] (remote files through the block cache, keyed
/// by their version); its metadata, once known, is handed out without another read.
pub(super) struct StoreFile {
    pub(super) store: Store,
    pub(super) obj: Object,
    pub(super) meta: Option<Arc<ParquetMetaData>>,
}

pub(super) fn external(e: Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl AsyncFileReader for StoreFile {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move { self.store.read_span(&self.obj, range).await.map_err(external) }.boxed()
    }

    /// The pages a read needs, in one read of the store (which merges them across small
    /// gaps: a row group's column chunks and pages lie side by side, and one request for them
    /// costs less than one per page).
    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move { self.store.read(&self.obj, &ranges).await.map_err(external) }.boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            if let Some(m) = &self.meta {
                return Ok(m.clone());
            }
            let size = self.obj.size();
            let policy = options.map_or(PageIndexPolicy::Optional, |_| PageIndexPolicy::Optional);
            let meta =
                ParquetMetaDataReader::new().with_page_index_policy(policy).load_and_finish(&mut *self, size).await?;
            let meta = Arc::new(meta);
            self.meta = Some(meta.clone());
            Ok(meta)
        }
        .boxed()
    }
}
