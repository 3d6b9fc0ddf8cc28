//! Digests of what a source reads, for caches derived from its samples (the tokens of a text
//! corpus, tokenized once into the user's cache): a file edited or replaced, or another corpus
//! opened under the same name, must not be served the tokens of the one before.

use std::hash::Hasher;

use super::{Backend, Store};
use crate::fetch::Expect;

impl Store {
    /// A digest of `objects` (each a path in this store and the version this run pins it to,
    /// where the source knows one), in the order given, with the store's root.
    ///
    /// A local file is looked up now, and keyed by its size and modification time: not by its
    /// inode (a copy of the data to each node's own disk, or one made again with `rsync -a`,
    /// keys alike, so the nodes and later jobs sharing a cache share its tokens), and not by a
    /// version a manifest recorded (an edit after it must change the key). A remote object is
    /// keyed by its entity tag, else its modification time, with its size; one that has
    /// neither by its size alone, never by anything of this process's own: the ranks of a
    /// node must agree on the key to share one tokenizing pass.
    pub(crate) fn fingerprint<'a>(&self, objects: impl IntoIterator<Item = (&'a str, Option<Expect>)>) -> u64 {
        let mut h = twox_hash::XxHash64::with_seed(0);
        h.write(self.describe("").as_bytes());
        for (path, pinned) in objects {
            let version = match &self.0.backend {
                Backend::Local(l) => match l.file(&self.obj_path(path)) {
                    Ok(file) => local_version(&file),
                    Err(_) => "outside the root".to_string(),
                },
                Backend::Remote { .. } => pinned.as_ref().map_or_else(|| "unknown".to_string(), remote_version),
            };
            // Lengths first: no two lists run together into the same bytes.
            for part in [path, version.as_str()] {
                h.write_u64(part.len() as u64);
                h.write(part.as_bytes());
            }
        }
        h.finish()
    }
}

/// A local file's size and modification time (nanoseconds), or why it has none.
fn local_version(file: &std::path::Path) -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(file) {
        Ok(md) => format!("{}.{:09}/{}", md.mtime(), md.mtime_nsec(), md.len()),
        Err(e) => format!("unreadable: {:?}", e.kind()),
    }
}

/// A remote object's entity tag, else modification time, with its size.
fn remote_version(e: &Expect) -> String {
    match (&e.e_tag, e.modified_us) {
        (Some(tag), _) => format!("{tag}/{}", e.size),
        (None, 0) => format!("unversioned/{}", e.size),
        (None, t) => format!("{t}/{}", e.size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_local_file_is_keyed_by_its_size_and_time_now_and_a_remote_one_by_its_tag() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"12345").unwrap();
        let s = Store::local(dir.path()).unwrap();
        let pinned = s.open_object("a").await.unwrap().pinned();
        let key = || s.fingerprint([("a", Some(pinned.clone()))]);
        let first = key();
        assert_eq!(key(), first, "the same file, the same key");
        // Copied anew (another inode) at the same size and time: the same key.
        let copy = dir.path().join("a.copy");
        std::fs::copy(dir.path().join("a"), &copy).unwrap();
        let time = std::fs::metadata(dir.path().join("a")).unwrap().modified().unwrap();
        std::fs::File::options().write(true).open(&copy).unwrap().set_modified(time).unwrap();
        std::fs::rename(&copy, dir.path().join("a")).unwrap();
        assert_eq!(key(), first, "a copy keeping size and time");
        // Edited in place: the key follows the file, not the version pinned at open.
        std::fs::write(dir.path().join("a"), b"12346").unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options().write(true).open(dir.path().join("a")).unwrap().set_modified(later).unwrap();
        assert_ne!(key(), first, "edited");
        // Another root, the same names: another key.
        let other = tempfile::tempdir().unwrap();
        std::fs::copy(dir.path().join("a"), other.path().join("a")).unwrap();
        let o = Store::local(other.path()).unwrap();
        assert_ne!(o.fingerprint([("a", Some(pinned.clone()))]), key());

        let tagged = Expect { size: 5, e_tag: Some("\"abc\"".into()), modified_us: 7 };
        assert_eq!(remote_version(&tagged), "\"abc\"/5");
        let timed = Expect { e_tag: None, ..tagged.clone() };
        assert_eq!(remote_version(&timed), "7/5");
        // Neither: the size alone, the same in every process.
        let bare = Expect { modified_us: 0, ..timed };
        assert_eq!(remote_version(&bare), "unversioned/5");
    }
}
