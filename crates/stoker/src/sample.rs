//! Samples: a key and named byte fields, the WebDataset convention. How keys that are bytes
//! become text without losing a byte, and how any key is shown safely, is in
//! `escape` (re-exported here).

use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Error, Result};
pub use crate::escape::{display_key, escape_controls, escape_key, unescape_key};

/// One field of a sample: a name (the file extension in WebDataset terms) and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Field name, e.g. `jpg`, `cls`, `seg.png`, or `data` for single-field sources.
    pub name: Arc<str>,
    /// The payload; a cheap reference-counted slice, often of a larger coalesced read.
    pub data: Bytes,
}

/// A training sample: a key and one or more named byte fields.
///
/// For tar shards, members sharing a basename form one sample and the extension names the
/// field (`000123.jpg` + `000123.cls` -> key `000123`, fields `jpg` and `cls`), exactly as the
/// `webdataset` Python library groups them. Files, objects and LMDB records give one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The sample key (path without extension, or the LMDB key). Keys stored as bytes (LMDB)
    /// are text by [`escape_key`]: a backslash is `\\` and a byte that is not UTF-8 is `\xNN`,
    /// so distinct keys stay distinct and [`unescape_key`] gives the bytes back.
    pub key: String,
    /// The fields in the order they appear in storage.
    pub fields: Vec<Field>,
}

impl Sample {
    /// A sample with a single field.
    pub fn single(key: impl Into<String>, name: impl Into<Arc<str>>, data: impl Into<Bytes>) -> Self {
        Sample { key: key.into(), fields: vec![Field { name: name.into(), data: data.into() }] }
    }

    /// The bytes of the field called `name`, if present.
    pub fn field(&self, name: &str) -> Option<&Bytes> {
        self.fields.iter().find(|f| &*f.name == name).map(|f| &f.data)
    }

    /// The bytes of field `name`, or an error naming the fields this sample has.
    pub fn require(&self, name: &str) -> Result<&Bytes> {
        self.field(name).ok_or_else(|| Error::MissingField {
            key: self.key.clone(),
            field: name.to_string(),
            available: self.field_names().collect::<Vec<_>>().join(", "),
        })
    }

    /// Field names in storage order.
    pub fn field_names(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|f| &*f.name)
    }

    /// Total payload bytes over all fields.
    pub fn total_bytes(&self) -> u64 {
        self.fields.iter().map(|f| f.data.len() as u64).sum()
    }

    /// Name and size of each field, without the payloads.
    pub fn meta(&self) -> SampleMeta {
        SampleMeta {
            key: self.key.clone(),
            fields: self.fields.iter().map(|f| (f.name.clone(), f.data.len() as u64)).collect(),
        }
    }
}

/// What a sample looks like without its payload: key, and each field's name and size.
///
/// Sources answer this from their index or listing, so `stoker ls` never reads payloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleMeta {
    /// The sample key.
    pub key: String,
    /// `(field name, size in bytes)` in storage order.
    pub fields: Vec<(Arc<str>, u64)>,
}

impl SampleMeta {
    /// Total payload bytes over all fields.
    pub fn total_bytes(&self) -> u64 {
        self.fields.iter().map(|(_, n)| n).sum()
    }
}

/// Split a member or object path into WebDataset `(key, extension)`.
///
/// This reproduces `webdataset.tariterators.base_plus_ext`, the regular expression
/// `^((?:.*/|)[^.]+)[.]([^/]*)$`: the key is the path up to the first dot of the basename
/// and the extension is the rest. Returns `None` where webdataset skips the member (no dot
/// in the basename, or a basename that starts with a dot).
pub fn split_key(path: &str) -> Option<(&str, &str)> {
    // The greedy `(?:.*/|)` prefers the longest directory prefix, then backtracks to shorter
    // ones (ending at earlier slashes) and finally to the empty prefix.
    let candidates = path.char_indices().filter(|&(_, c)| c == '/').map(|(i, _)| i + 1).rev().chain(std::iter::once(0));
    for start in candidates {
        let rest = &path[start..];
        let Some(dot) = rest.find('.') else { continue };
        if dot == 0 {
            continue;
        }
        let ext = &rest[dot + 1..];
        if ext.contains('/') {
            continue;
        }
        return Some((&path[..start + dot], ext));
    }
    None
}

/// Whether webdataset skips this member as metadata (`__...__` at the start of the path).
pub(crate) fn is_webdataset_meta(path: &str) -> bool {
    let first = path.split('/').next().unwrap_or("");
    first.len() >= 4 && first.starts_with("__") && first.ends_with("__")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_matches_webdataset_regex() {
        assert_eq!(split_key("000123.jpg"), Some(("000123", "jpg")));
        assert_eq!(split_key("a/b/000123.seg.png"), Some(("a/b/000123", "seg.png")));
        assert_eq!(split_key("a.b/c.d"), Some(("a.b/c", "d")));
        assert_eq!(split_key("x/y"), None);
        assert_eq!(split_key(".hidden"), None);
        assert_eq!(split_key("a."), Some(("a", "")));
        // The regex backtracks to the empty prefix: `[^.]+` may swallow slashes.
        assert_eq!(split_key("dir/.hidden.jpg"), Some(("dir/", "hidden.jpg")));
        assert_eq!(split_key("a.b/c"), None);
    }

    #[test]
    fn meta_members_are_recognised() {
        assert!(is_webdataset_meta("__meta__"));
        assert!(is_webdataset_meta("__meta__/x.json"));
        assert!(!is_webdataset_meta("__meta/x.json"));
        assert!(!is_webdataset_meta("a/__meta__"));
    }

    #[test]
    fn require_names_available_fields() {
        let s = Sample::single("k", "jpg", vec![1u8, 2]);
        assert_eq!(s.require("jpg").unwrap().len(), 2);
        let e = s.require("png").unwrap_err().to_string();
        assert!(e.contains("png") && e.contains("jpg"), "{e}");
    }
}
