//! How errors show what they carry: a hint in parentheses, what a failed remote step was doing.

use std::fmt;

/// An error's hint, after its message in parentheses (nothing without one).
pub(super) struct Hint<'a>(pub(super) &'a Option<String>);

impl fmt::Display for Hint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(h) => write!(f, " ({h})"),
            None => Ok(()),
        }
    }
}

/// What a [`super::Error::Fetch`] was doing: writing for a write or an upload's step (the fetch layer
/// names them so), reading for the rest.
pub(super) struct Doing<'a>(pub(super) &'a str);

impl fmt::Display for Doing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0 == "write" || self.0.ends_with("multipart upload") { "writing" } else { "reading" })
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Error;

    #[test]
    fn a_failed_upload_is_said_to_be_writing() {
        let e = |what: &str| {
            let f = Error::Fetch {
                object: "s3://b/a.tar".into(),
                what: what.into(),
                attempts: 6,
                message: "503".into(),
                hint: None,
                transient: true,
            };
            f.to_string()
        };
        assert!(e("part 2 of a multipart upload").starts_with("writing s3://b/a.tar (part 2"), "{}", e("x"));
        assert!(e("write").starts_with("writing s3://b/a.tar (write)"));
        assert!(e("bytes 0..10").starts_with("reading s3://b/a.tar (bytes 0..10) failed after 6 attempt(s): 503"));
    }
}
