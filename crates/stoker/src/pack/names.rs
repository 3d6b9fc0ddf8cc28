//! Tar member names that cannot escape and that read back as the sample they were written from.
//!
//! A member is `KEY.FIELD`. Readers extract members to disk (`tar -x`) and split names into
//! key and field with webdataset's regular expression, so a key is refused (never silently
//! rewritten) when its member name would be absolute, climb out with `..`, carry control
//! characters, or split differently than it was joined.

use crate::sample::{is_webdataset_meta, split_key};

/// The member name for field `field` of sample `key`, or why there cannot be one.
///
/// Field names are written lower-case: webdataset and Stoker's tar index lower-case
/// extensions when reading, so this is the name a reader will see either way.
pub(crate) fn member(key: &str, field: &str) -> Result<String, String> {
    let field = field.to_ascii_lowercase();
    if key.is_empty() {
        return Err("the sample key is empty".into());
    }
    if let Some(c) = key.chars().chain(field.chars()).find(|c| c.is_control()) {
        return Err(format!(
            "key `{}` / field `{}` holds the control character U+{:04X}, which tar tools and terminals mangle",
            key.escape_debug(),
            field.escape_debug(),
            c as u32
        ));
    }
    if key.starts_with('/') {
        return Err(format!("key `{key}` is an absolute path; extracting the shard would write outside its directory"));
    }
    if let Some(bad) = key.split('/').find(|c| c.is_empty() || *c == "." || *c == "..") {
        let what = if bad.is_empty() {
            "an empty path component (`//` or a trailing `/`)".into()
        } else {
            format!("a `{bad}` component")
        };
        return Err(format!("key `{key}` has {what}; member names must stay inside the shard's directory"));
    }
    if key.contains('\\') {
        return Err(format!("key `{key}` holds a backslash, a path separator on Windows extractors"));
    }
    if field.is_empty() || field.contains('/') {
        return Err(format!("field name `{field}` of key `{key}` must be non-empty and hold no `/`"));
    }
    if is_webdataset_meta(key) {
        return Err(format!("key `{key}` starts with a `__name__` component, which webdataset skips as metadata"));
    }
    let name = format!("{key}.{field}");
    match split_key(&name) {
        Some((k, f)) if k == key && f == field => Ok(name),
        Some((k, f)) => Err(format!(
            "member `{name}` would read back as key `{k}`, field `{f}`: the last part of a key must hold no dot \
             (webdataset splits at the first dot of the file name)"
        )),
        None => Err(format!("member `{name}` would be skipped by webdataset readers")),
    }
}

/// Bytes a member with this name and payload size takes in a tar written by the `tar` crate
/// with GNU headers: one header, a GNU long-name entry when the name exceeds the 100-byte
/// field, and the payload padded to 512-byte blocks.
pub(crate) fn member_bytes(name: &str, size: u64) -> u64 {
    let long = if name.len() > 100 { 512 + (name.len() as u64 + 1).div_ceil(512) * 512 } else { 0 };
    long + 512 + size.div_ceil(512) * 512
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_names_pass_and_lower_case_the_field() {
        assert_eq!(member("000123", "jpg").unwrap(), "000123.jpg");
        assert_eq!(member("a/b/000123", "seg.png").unwrap(), "a/b/000123.seg.png");
        assert_eq!(member("x", "JPG").unwrap(), "x.jpg");
        assert_eq!(member("a.b/c", "d").unwrap(), "a.b/c.d");
    }

    #[test]
    fn escaping_and_ambiguous_names_are_refused() {
        for (key, field, why) in [
            ("", "jpg", "empty"),
            ("/etc/passwd", "x", "absolute"),
            ("../up", "jpg", "`..`"),
            ("a/../../b", "jpg", "`..`"),
            ("a/./b", "jpg", "`.`"),
            ("a//b", "jpg", "empty path component"),
            ("dir/", "jpg", "empty path component"),
            ("a\0b", "jpg", "U+0000"),
            ("a\nb", "jpg", "U+000A"),
            ("k", "j\x1bpg", "U+001B"),
            ("a\\..\\b", "jpg", "backslash"),
            ("img.001", "jpg", "hold no dot"),
            ("k", "", "non-empty"),
            ("k", "a/b", "no `/`"),
            ("__meta__/x", "json", "metadata"),
        ] {
            let e = member(key, field).expect_err(key);
            assert!(e.contains(why), "{key:?}.{field:?}: {e}");
        }
    }

    #[test]
    fn sizes_match_the_tar_crate() {
        for name in [
            "a.b",
            &format!("{}.jpg", "k".repeat(96)),
            &format!("{}.jpg", "k".repeat(97)),
            &format!("{}y.jpg", "x/".repeat(300)),
        ] {
            for size in [0u64, 1, 511, 512, 513, 70_000] {
                let mut b = tar::Builder::new(Vec::new());
                let mut h = tar::Header::new_gnu();
                h.set_size(size);
                b.append_data(&mut h, name, &vec![7u8; size as usize][..]).unwrap();
                let out = b.into_inner().unwrap();
                assert_eq!(out.len() as u64, member_bytes(name, size) + 1024, "{name} {size}");
            }
        }
    }
}
