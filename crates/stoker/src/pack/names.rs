//! Tar member names that cannot escape and that read back as the sample they were written from.
//!
//! A member is `KEY.FIELD`. Readers extract members to disk (`tar -x`) and split names into
//! key and field with webdataset's regular expression, so a key is refused (never silently
//! rewritten) when its member name would be absolute, climb out with `..`, carry control
//! characters, or split differently than it was joined. The one rewrite: a byte that is not
//! UTF-8, which a key from bytes (LMDB) holds as `\xNN`, is named `%NN` ([`tar_key`]).

use std::borrow::Cow;

use crate::sample::{display_key, is_webdataset_meta, split_key};

/// The key as a tar member names it: each `\xNN` escape of [`crate::sample::escape_key`] (a
/// byte that is not UTF-8) becomes `%NN`, so the name is UTF-8 that every extractor and
/// reader handles (a raw byte breaks macOS file systems and Python readers; a backslash is a
/// Windows path separator). An escaped backslash (`\\`) is kept, for [`member`] to refuse.
/// The plan checks that no two keys end up with one name.
pub(crate) fn tar_key(key: &str) -> Cow<'_, str> {
    if !key.contains("\\x") {
        return Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(key.len());
    let mut rest = key;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let esc = &rest[at..];
        let hex = esc.get(2..4).filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        match (esc.as_bytes().get(1), hex) {
            (Some(b'\\'), _) => {
                out.push_str("\\\\");
                rest = &esc[2..];
            }
            (Some(b'x'), Some(h)) => {
                out.push('%');
                out.push_str(h);
                rest = &esc[4..];
            }
            _ => {
                out.push('\\');
                rest = &esc[1..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// The member name for field `field` of sample `key`, or why there cannot be one.
///
/// Field names are written lower-case: webdataset and Stoker's tar index lower-case
/// extensions when reading, so this is the name a reader will see either way.
pub(crate) fn member(key: &str, field: &str) -> Result<String, String> {
    let field = field.to_ascii_lowercase();
    let shown = display_key(key);
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
        return Err(format!(
            "key `{shown}` is an absolute path; extracting the shard would write outside its directory"
        ));
    }
    if let Some(bad) = key.split('/').find(|c| c.is_empty() || *c == "." || *c == "..") {
        let what = if bad.is_empty() {
            "an empty path component (`//` or a trailing `/`)".into()
        } else {
            format!("a `{bad}` component")
        };
        return Err(format!("key `{shown}` has {what}; member names must stay inside the shard's directory"));
    }
    if key.contains('\\') {
        return Err(format!("key `{shown}` holds a backslash, a path separator on Windows extractors"));
    }
    if field.is_empty() || field.contains('/') {
        return Err(format!("field name `{}` of key `{shown}` must be non-empty and hold no `/`", display_key(&field)));
    }
    if is_webdataset_meta(key) {
        return Err(format!("key `{shown}` starts with a `__name__` component, which webdataset skips as metadata"));
    }
    let name = format!("{key}.{field}");
    match split_key(&name) {
        Some((k, f)) if k == key && f == field => Ok(name),
        Some((k, f)) => Err(format!(
            "member `{}` would read back as key `{}`, field `{}`: the last part of a key must hold no dot \
             (webdataset splits at the first dot of the file name)",
            display_key(&name),
            display_key(k),
            display_key(f)
        )),
        None => Err(format!("member `{}` would be skipped by webdataset readers", display_key(&name))),
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
    fn bytes_that_are_not_utf8_get_percent_names() {
        use crate::sample::escape_key;
        assert!(matches!(tar_key("plain/key"), Cow::Borrowed(_)));
        assert_eq!(tar_key(&escape_key(b"a\xff\xfe")), "a%ff%fe");
        assert_eq!(member(&tar_key(&escape_key(b"k\x80")), "jpg").unwrap(), "k%80.jpg");
        // A real backslash stays one, and is refused as before.
        assert_eq!(tar_key(&escape_key(b"a\\xff")), "a\\\\xff");
        assert!(member(&tar_key(&escape_key(b"a\\b\xff")), "jpg").unwrap_err().contains("backslash"));
        assert_eq!(tar_key("odd\\x4"), "odd\\x4");
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
