//! The `objects` layout: one file or object per sample, ordered by sorted relative path.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use super::{check_index, copy_into, fill_blocking, Capability, SampleSource, SourceInfo};
use crate::batch::BatchBuilder;
use crate::error::{Error, Result};
use crate::sample::{split_key, Field, Sample, SampleMeta};
use crate::store::{IoCounters, ObjectInfo, Store};
use crate::uri::{Layout, SourceOptions};

/// One sample per object. Key = path without its extension (WebDataset's split: up to the
/// first dot of the basename); the single field is named by the extension, or `data` when
/// there is none.
pub struct ObjectsSource {
    store: Store,
    display: String,
    objects: Vec<Entry>,
    concurrency: usize,
}

struct Entry {
    /// As listed or looked up: what every read of it is held to.
    info: ObjectInfo,
    key_len: usize,
    field: Arc<str>,
}

impl Entry {
    fn key(&self) -> &str {
        &self.info.path[..self.key_len]
    }
}

impl ObjectsSource {
    /// A source over `listing` (already filtered and sorted) in `store`.
    pub fn new(store: Store, mut listing: Vec<ObjectInfo>, opts: &SourceOptions, display: String) -> Result<Self> {
        if listing.is_empty() {
            return Err(Error::Empty {
                uri: display,
                reason: "no files found (hidden files and Stoker indexes are ignored)".into(),
            });
        }
        listing.sort_by(|a, b| a.path.cmp(&b.path));
        // Field names repeat across millions of samples; share one allocation per name.
        let mut names: HashMap<String, Arc<str>> = HashMap::new();
        let objects = listing
            .into_iter()
            .map(|o| {
                let (key_len, ext) = match split_key(&o.path) {
                    Some((key, ext)) => (key.len(), ext.to_ascii_lowercase()),
                    None => (o.path.len(), "data".to_string()),
                };
                let field = names.entry(ext.clone()).or_insert_with(|| Arc::from(ext)).clone();
                Entry { info: o, key_len, field }
            })
            .collect();
        Ok(ObjectsSource { store, display, objects, concurrency: opts.concurrency() })
    }
}

impl fmt::Debug for ObjectsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectsSource").field("uri", &self.display).field("samples", &self.objects.len()).finish()
    }
}

impl fmt::Display for ObjectsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "objects:{}", self.display)
    }
}

#[async_trait]
impl SampleSource for ObjectsSource {
    fn len(&self) -> usize {
        self.objects.len()
    }

    fn capability(&self) -> Capability {
        Capability {
            random_access: true,
            coalesced_reads: false,
            locality: false,
            cheap_meta: true,
            local: self.store.local_root().is_some(),
        }
    }

    fn info(&self) -> SourceInfo {
        SourceInfo::of(Layout::Objects, self.objects.len())
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        check_index(index, self.objects.len())?;
        let e = &self.objects[index];
        // Pinned per read: an object is read once an epoch, and a million pins held for the
        // whole run would cost more memory than the listing itself.
        let data = self.store.read_all(&self.store.object(&e.info)).await?;
        Ok(Sample { key: e.key().to_string(), fields: vec![Field { name: e.field.clone(), data }] })
    }

    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        let mut objs = Vec::with_capacity(indices.len());
        for &i in indices {
            check_index(i, self.objects.len())?;
            objs.push(self.store.object(&self.objects[i].info));
        }
        let data = self.store.read_all_many(objs, self.concurrency).await?;
        Ok(indices
            .iter()
            .zip(data)
            .map(|(&i, data)| {
                let e = &self.objects[i];
                Sample { key: e.key().to_string(), fields: vec![Field { name: e.field.clone(), data }] }
            })
            .collect())
    }

    async fn get_many_into(&self, indices: &[usize], out: &mut BatchBuilder) -> Result<()> {
        // Objects are read whole around the caches: only local files are read straight in
        // (a remote object's blocks on disk, cached by some other reader, are not enough).
        if !self.store.reads_whole_directly() {
            return copy_into(self, indices, out).await;
        }
        let mut jobs = Vec::with_capacity(indices.len());
        for &i in indices {
            check_index(i, self.objects.len())?;
            let e = &self.objects[i];
            jobs.push((i as u64, self.store.object(&e.info), e.key_len, e.field.clone()));
        }
        let Some(mut reader) = self.store.direct_reader() else { return copy_into(self, indices, out).await };
        fill_blocking(out, move |b| {
            for (i, obj, key_len, field) in jobs {
                let size = obj.size();
                b.begin(i, &obj.path()[..key_len]);
                if let Err(e) = reader.read_whole(&obj, b.field(&field, size as usize)) {
                    b.abandon_row();
                    return Err(e);
                }
            }
            Ok(())
        })
        .await
    }

    async fn meta(&self, index: usize) -> Result<SampleMeta> {
        check_index(index, self.objects.len())?;
        let e = &self.objects[index];
        Ok(SampleMeta { key: e.key().to_string(), fields: vec![(e.field.clone(), e.info.size)] })
    }

    fn io_counters(&self) -> Option<IoCounters> {
        Some(self.store.counters())
    }

    fn fingerprint(&self) -> Option<u64> {
        Some(self.store.fingerprint(self.objects.iter().map(|e| (e.info.path.as_str(), Some(e.info.expect())))))
    }

    async fn flush(&self) {
        self.store.flush().await
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Error;

    /// Local files read together on one thread: each sample's bytes in the order asked
    /// (repeats included); a file cut since it was listed is `Changed`, named, and a file
    /// gone is an error naming it, not a short or empty sample.
    #[tokio::test]
    async fn local_get_many_gives_each_file_in_the_order_asked_and_refuses_a_changed_one() {
        let dir = tempfile::tempdir().unwrap();
        let body = |i: usize| (0..100 + 37 * i).map(|b| (b * 7 + i) as u8).collect::<Vec<u8>>();
        for i in 0..70 {
            std::fs::write(dir.path().join(format!("{i:02}.bin")), body(i)).unwrap();
        }
        let src = crate::source::open(dir.path().to_str().unwrap(), Default::default()).await.unwrap();
        // More than two runs of LOCAL_RUN, in an order of their own.
        let asked: Vec<usize> = [3, 0, 3, 4, 1].into_iter().chain((0..70).map(|i| (i * 31) % 70)).collect();
        let got = src.get_many(&asked).await.unwrap();
        assert_eq!(got.len(), asked.len());
        for (s, &i) in got.iter().zip(&asked) {
            assert_eq!(s.key, format!("{i:02}"));
            assert_eq!(&s.fields[0].data[..], &body(i)[..], "sample {i}");
        }
        assert!(src.get_many(&[0, 70]).await.is_err(), "an index past the end");
        std::fs::File::options().write(true).open(dir.path().join("04.bin")).unwrap().set_len(10).unwrap();
        let cut = src.get_many(&[0, 4]).await.unwrap_err();
        assert!(matches!(cut, Error::Changed { .. }) && cut.to_string().contains("04.bin"), "{cut:?}");
        std::fs::remove_file(dir.path().join("01.bin")).unwrap();
        let gone = src.get_many(&[1]).await.unwrap_err();
        assert!(gone.to_string().contains("01.bin"), "{gone}");
        assert_eq!(&src.get_many(&[2]).await.unwrap()[0].fields[0].data[..], &body(2)[..]);
    }
}
