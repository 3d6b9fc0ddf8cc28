//! One tar shard written sample by sample ([`ShardStream`]): what
//! [`ShardWriter::write`](super::ShardWriter::write) and
//! the Ray datasink's write tasks use, so a task holds the rows in hand, not its whole shard.
//!
//! The members go straight into the destination's [`ObjectWriter`] (a local file under a
//! temporary name, written to the disk as it grows; a remote object in parts of a multipart
//! upload), with each payload's checksum computed as it is written and each member's headers
//! kept aside. At the end the shard's headers are walked in those (as a reader will walk them
//! in the shard), the shard already under the name is kept if it hashes as this one, and the
//! sidecar index is saved.

use super::names;
use super::tar_sink::TarSink;
use crate::error::{Error, Result};
use crate::sample::display_key;
use crate::source::tar_index::{self, ShardIndex};
use crate::store::{ObjectInfo, ObjectWriter, Store};
use crate::uri::SourceOptions;

/// A tar shard being written one sample at a time; see
/// [`ShardWriter::shard`](super::ShardWriter::shard).
///
/// Nothing appears under the shard's name until [`finish`](Self::finish). A sample that cannot
/// be written (a key or field name that would not read back, a write that failed) is an error,
/// and the stream is then spent: `finish` refuses it, and dropping it removes what was written.
pub struct ShardStream {
    out: Store,
    /// The destination, credentials redacted.
    shown: String,
    options: SourceOptions,
    name: String,
    /// `None` once finished.
    sink: Option<TarSink>,
    samples: usize,
    payload_bytes: u64,
    last_key: Option<String>,
    broken: Option<String>,
}

impl std::fmt::Debug for ShardStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardStream").field("name", &self.name).field("samples", &self.samples).finish_non_exhaustive()
    }
}

/// What [`ShardStream::finish`] (and [`ShardWriter::write`](super::ShardWriter::write)) did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardWritten {
    /// The shard's name in the destination.
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Samples in it.
    pub samples: usize,
    /// Payload bytes over its members.
    pub payload_bytes: u64,
    /// The shard was already there with these bytes (an earlier run wrote it: its XXH3-128 is
    /// the new shard's) and was left as it was.
    pub kept: bool,
}

/// The bytes of a tar's end: two zero blocks.
pub(super) const TAR_END: u64 = 1024;

impl ShardStream {
    pub(super) fn new(out: Store, shown: String, options: SourceOptions, name: &str, writer: ObjectWriter) -> Self {
        ShardStream {
            out,
            shown,
            options,
            name: name.to_string(),
            sink: Some(TarSink::new(writer, true)),
            samples: 0,
            payload_bytes: 0,
            last_key: None,
            broken: None,
        }
    }

    /// The shard's name in the destination.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Samples written so far.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// The shard's size were it finished now: the members written and the tar's end.
    pub fn bytes(&self) -> u64 {
        self.sink.as_ref().map_or(0, |t| t.written()) + TAR_END
    }

    /// Write one sample: its key and its fields (name and payload), in order. Blocking (the
    /// bytes go to a file): call it from a thread that may block.
    ///
    /// The same refusals as [`ShardWriter::write`](super::ShardWriter::write): a key equal to the previous sample's (a
    /// reader would merge the two), no fields, a field twice (names compared lower-case), a
    /// key or field name that would not read back as written.
    pub fn add(&mut self, key: &str, fields: &[(&str, &[u8])]) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(self.spent(why));
        }
        let members = match sample_members(self.last_key.as_deref(), key, fields.iter().map(|(n, _)| *n)) {
            Ok(members) => members,
            Err(reason) => {
                self.broken = Some(reason.clone());
                return Err(self.fail(reason));
            }
        };
        if let Err(e) = self.append(&members, fields) {
            self.broken = Some(e.to_string());
            return Err(e);
        }
        self.samples += 1;
        self.last_key = Some(key.to_string());
        Ok(())
    }

    /// A failed write is the store's error (a remote part: its kind and redacted text).
    fn append(&mut self, members: &[String], fields: &[(&str, &[u8])]) -> Result<()> {
        let Some(sink) = self.sink.as_mut() else { return Err(self.fail("the shard was already finished".into())) };
        for (member, (_, data)) in members.iter().zip(fields) {
            sink.member(member, data).map_err(|e| self.out.write_error(&self.name, e))?;
            self.payload_bytes += data.len() as u64;
        }
        Ok(())
    }

    fn fail(&self, reason: String) -> Error {
        Error::Pack { dest: self.shown.clone(), reason: format!("{}: {reason}", self.name) }
    }

    /// What a stream an earlier sample broke (`why`) answers.
    fn spent(&self, why: &str) -> Error {
        self.fail(format!("an earlier sample could not be written ({why}); nothing was kept"))
    }

    /// Give the shard up: nothing appears under its name (a local temporary file is removed,
    /// a remote upload aborted once the parts being sent have ended). Dropping the stream does
    /// the same, a remote abort then running on after the drop.
    pub async fn abort(mut self) {
        if let Some(sink) = self.sink.take() {
            sink.into_writer().discard().await;
        }
    }

    /// End the shard: its end blocks written, its headers walked in the bytes written, and
    /// then either the shard already under the name kept (it holds exactly these bytes:
    /// [`ShardWritten::kept`]) or this one published; its sidecar index saved with the
    /// checksums computed while writing.
    pub async fn finish(mut self) -> Result<ShardWritten> {
        if let Some(why) = &self.broken {
            return Err(self.spent(why));
        }
        let sink = self.sink.take().ok_or_else(|| self.fail("the shard was already finished".into()))?;
        let store = self.out.clone();
        let existing = store.head(&self.name).await.ok();
        let (name, shown) = (self.name.clone(), store.describe(&self.name));
        let expected = sink.members();
        let walked = tokio::task::spawn_blocking(move || -> Result<(ObjectWriter, ShardIndex, Vec<u64>, bool)> {
            let (writer, sums, headers, hash) = sink.end().map_err(|e| store.write_error(&name, e))?;
            let headers = headers.ok_or_else(|| Error::internal("a shard stream's sink keeps its headers"))?;
            let info = ObjectInfo { path: name, size: writer.written(), modified_us: 0, e_tag: None, recorded: false };
            let walk = tar_index::Walk { skip: false, checksums: false };
            let idx = tar_index::build_with(headers.reader(info.size), &info, &shown, walk)?;
            if idx.fields.len() != expected || !idx.damage.is_empty() {
                return Err(Error::internal(format!(
                    "{shown}: the shard just written reads back as {} members, not {expected}",
                    idx.fields.len()
                )));
            }
            let kept = match existing {
                Some(old) if old.size == info.size => hash_of(&store, &old) == Some(hash),
                _ => false,
            };
            Ok((writer, idx, sums, kept))
        });
        let (writer, idx, sums, kept) = walked.await.map_err(Error::task)??;
        let bytes = writer.written();
        if kept {
            writer.discard().await;
        } else {
            writer.finish().await?;
        }
        self.index(bytes, idx, sums).await?;
        Ok(ShardWritten {
            name: self.name.clone(),
            bytes,
            samples: self.samples,
            payload_bytes: self.payload_bytes,
            kept,
        })
    }

    /// Save the shard's sidecar index, of `bytes` bytes: `idx`, walked in the bytes written
    /// (a checksum a member: `finish` checked the count), with `sums`, the checksums computed
    /// from them (nothing is read back), made the index of the object now in the store (its
    /// size, and version where the store gives one).
    async fn index(&self, bytes: u64, mut idx: ShardIndex, sums: Vec<u64>) -> Result<()> {
        let name = &self.name;
        let info = self.out.head(name).await?;
        if info.size != bytes {
            return Err(Error::Changed {
                object: self.out.describe(name),
                reason: format!("it holds {} bytes just after {bytes} were written: another writer?", info.size),
            });
        }
        (idx.size, idx.modified_us, idx.e_tag) = (info.size, info.modified_us, info.e_tag);
        idx.sums = sums;
        idx.digest = tar_index::PayloadDigest::Xxh3;
        tar_index::save(&self.out, &idx, &self.options).await;
        Ok(())
    }
}

/// The XXH3-128 of the object `old`, read a piece at a time (blocking); `None` if it cannot be
/// read. A shard already under the name is kept when it hashes as the one just written: the
/// same bytes, short of a collision nobody but the destination's own writers could arrange.
pub(super) fn hash_of(store: &Store, old: &ObjectInfo) -> Option<u128> {
    let mut hash = twox_hash::XxHash3_128::new();
    store.read_pieces(old, |b| hash.write(b)).then(|| hash.finish_128())
}

/// The member names of one sample (after the sample keyed `previous`), or why it cannot be
/// written: see [`ShardStream::add`].
pub(super) fn sample_members<'a>(
    previous: Option<&str>,
    key: &str,
    fields: impl Iterator<Item = &'a str>,
) -> std::result::Result<Vec<String>, String> {
    if previous == Some(key) {
        return Err(format!(
            "two adjacent samples share the key `{}`; in one tar they would read back as one sample",
            display_key(key)
        ));
    }
    let tar_key = names::tar_key(key);
    let mut out: Vec<String> = Vec::new();
    for field in fields {
        let member = names::member(&tar_key, field)?;
        if out.contains(&member) {
            return Err(format!(
                "sample `{}` has two `{}` fields (field names are compared lower-case, as readers do)",
                display_key(key),
                display_key(&field.to_ascii_lowercase())
            ));
        }
        out.push(member);
    }
    if out.is_empty() {
        return Err(format!("sample `{}` has no fields; a tar holds a sample as its members", display_key(key)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::ShardWriter;

    #[test]
    fn names_that_would_not_read_back_are_refused() {
        let bad: [(Option<&str>, &str, &[&str], &str); 5] = [
            (Some("a"), "a", &["cls"], "share the key"),
            (None, "a", &["jpg", "JPG"], "two `jpg` fields"),
            (None, "../a", &["jpg"], "`..` component"),
            (None, "a.b", &["jpg"], "no dot"),
            (None, "a", &[], "no fields"),
        ];
        for (previous, key, fields, why) in bad {
            let err = sample_members(previous, key, fields.iter().copied()).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        assert_eq!(sample_members(None, "dir/a", ["JPG", "cls"].into_iter()).unwrap(), ["dir/a.jpg", "dir/a.cls"]);
        assert_eq!(sample_members(Some("a"), "b", ["cls"].into_iter()).unwrap(), ["b.cls"]);
    }

    fn shard_of(dir: &std::path::Path, name: &str) -> Vec<u8> {
        std::fs::read(dir.join(name)).unwrap()
    }

    #[tokio::test]
    async fn a_shard_lands_whole_or_not_at_all_and_an_equal_one_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let out = ShardWriter::open(dir.path().to_str().unwrap(), Default::default()).unwrap();
        let mut s = out.shard("a.tar", 0).unwrap();
        let big = vec![7u8; 3000];
        s.add("k/1", &[("jpg", b"one"), ("cls", b"1")]).unwrap();
        s.add("k/2", &[("jpg", &big)]).unwrap();
        assert_eq!(s.bytes(), 2 * 1024 + (512 + 3072) + 1024, "three members and the tar's end");
        let listed = |d: &std::path::Path| {
            let mut v: Vec<String> =
                std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
            v.sort();
            v
        };
        assert_eq!(listed(dir.path()), [".a.tar.partial"], "nothing under the name before finish");
        let done = s.finish().await.unwrap();
        assert_eq!((done.samples, done.payload_bytes, done.kept), (2, 3 + 1 + 3000, false));
        let first = shard_of(dir.path(), "a.tar");
        assert_eq!(first.len() as u64, done.bytes);
        let mut members = tar::Archive::new(&first[..]);
        let names: Vec<String> =
            members.entries().unwrap().map(|e| e.unwrap().path().unwrap().to_string_lossy().into()).collect();
        assert_eq!(names, ["k/1.jpg", "k/1.cls", "k/2.jpg"]);
        assert!(listed(dir.path()).contains(&"a.tar.stoker-idx.json".to_string()));

        // The same samples again: the shard there is kept, untouched (same inode).
        let ino = |p: std::path::PathBuf| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let before = ino(dir.path().join("a.tar"));
        let mut s = out.shard("a.tar", 0).unwrap();
        s.add("k/1", &[("jpg", b"one"), ("cls", b"1")]).unwrap();
        s.add("k/2", &[("jpg", &big)]).unwrap();
        assert!(s.finish().await.unwrap().kept);
        assert_eq!(ino(dir.path().join("a.tar")), before);
        assert!(!listed(dir.path()).iter().any(|n| n.ends_with(".partial")), "the unneeded copy is removed");

        // Same size, one byte changed: replaced.
        let mut s = out.shard("a.tar", 0).unwrap();
        s.add("k/1", &[("jpg", b"onE"), ("cls", b"1")]).unwrap();
        s.add("k/2", &[("jpg", &big)]).unwrap();
        assert!(!s.finish().await.unwrap().kept);
        let second = shard_of(dir.path(), "a.tar");
        assert_eq!(second.len(), first.len());
        assert_ne!(second, first);

        // A sample that cannot be written spends the stream; dropped, it leaves nothing.
        let mut s = out.shard("b.tar", 0).unwrap();
        s.add("x", &[("jpg", b"1")]).unwrap();
        let err = s.add("x", &[("jpg", b"2")]).unwrap_err().to_string();
        assert!(err.contains("b.tar") && err.contains("share the key"), "{err}");
        assert!(s.add("y", &[("jpg", b"3")]).unwrap_err().to_string().contains("nothing was kept"));
        let err = s.finish().await.unwrap_err().to_string();
        assert!(err.contains("nothing was kept"), "{err}");
        assert!(
            !listed(dir.path()).iter().any(|n| n.starts_with(".b.tar") || n.starts_with("b.tar")),
            "{:?}",
            listed(dir.path())
        );
    }
}
