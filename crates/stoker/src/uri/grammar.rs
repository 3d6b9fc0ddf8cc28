//! The URI grammar: a plain path, `file://`, `s3://`, `gs://`, `az://` or `http(s)://`, a
//! brace pattern naming several files, and a `?query` of options.

use std::path::PathBuf;

use super::braces::expand_braces;
use super::options::{Layout, SourceOptions};
use crate::error::{Error, Result};
use crate::redact::redact;

/// Where a source's bytes live, after parsing the URI.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Location {
    /// A local path (file or directory), absolute or relative to the working directory.
    Local(PathBuf),
    /// Local paths from a brace pattern, in expansion order.
    LocalPattern(Vec<PathBuf>),
    /// An object store location.
    Remote(RemoteLocation),
}

/// A remote location: `scheme://bucket/prefix`, or an HTTP base URL, and named objects when
/// the URI was a brace pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteLocation {
    /// `s3`, `gs`, `az` or `http`/`https`.
    pub scheme: String,
    /// Bucket or container; for HTTP the origin (`http://host:port`).
    pub bucket: String,
    /// Path inside the bucket that everything is relative to (no leading or trailing `/`).
    pub prefix: String,
    /// Object names relative to `prefix`, when the URI named them (brace pattern or one file).
    pub names: Option<Vec<String>>,
}

/// A parsed source URI: where, plus the options from its query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceUri {
    /// Where the bytes are.
    pub location: Location,
    /// Options from the query string.
    pub options: SourceOptions,
    /// The URI as given, credentials redacted, for messages and `Display`.
    pub display: String,
}

/// Schemes this build understands.
pub const SCHEMES: &[&str] = &["file", "s3", "gs", "az", "http", "https"];

/// Parse a source URI: a plain path, `file://`, with an optional `?query` of options.
pub fn parse(uri: &str) -> Result<SourceUri> {
    let display = redact(uri);
    let bad = |reason: String| Error::InvalidUri { uri: display.clone(), reason };
    if uri.trim().is_empty() {
        return Err(bad("empty URI; give a path such as ./data or file:///data/shards".into()));
    }
    let (base, query) = match uri.split_once('?') {
        Some((b, q)) => (b, q),
        None => (uri, ""),
    };
    let options = SourceOptions::from_query(query)?;
    let path = if let Some((scheme, rest)) = base.split_once("://") {
        match scheme.to_ascii_lowercase().as_str() {
            "file" => {
                let rest = rest.strip_prefix("localhost").unwrap_or(rest);
                if !rest.starts_with('/') {
                    return Err(bad("file:// URIs need an absolute path, e.g. file:///data/train".into()));
                }
                percent_encoding::percent_decode_str(rest)
                    .decode_utf8()
                    .map_err(|_| bad("path is not valid UTF-8 after percent-decoding".into()))?
                    .into_owned()
            }
            s @ ("s3" | "gs" | "az" | "http" | "https") => {
                let remote = parse_remote(s, rest).map_err(bad)?;
                return Ok(SourceUri { location: Location::Remote(remote), options, display });
            }
            other => {
                return Err(bad(format!(
                    "unknown scheme `{other}`; supported: {}, or a plain path",
                    SCHEMES.join(", ")
                )))
            }
        }
    } else {
        base.to_string()
    };
    let location = if path.contains('{') {
        let expanded = expand_braces(&path).map_err(bad)?;
        Location::LocalPattern(expanded.into_iter().map(PathBuf::from).collect())
    } else {
        Location::Local(PathBuf::from(path))
    };
    Ok(SourceUri { location, options, display })
}

fn parse_remote(scheme: &str, rest: &str) -> std::result::Result<RemoteLocation, String> {
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i + 1..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(format!("`{scheme}://` needs a bucket (or host), e.g. {scheme}://my-bucket/train"));
    }
    if authority.contains('@') {
        return Err("credentials do not go in the URI's host part; use options or environment variables".into());
    }
    let bucket = if scheme.starts_with("http") { format!("{scheme}://{authority}") } else { authority.to_string() };
    let path = percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map_err(|_| "path is not valid UTF-8 after percent-decoding".to_string())?
        .into_owned();
    if path.contains('{') {
        let names = expand_braces(&path)?;
        // Everything is relative to the deepest directory shared by all names.
        let first_brace = path.find('{').unwrap_or(0);
        let prefix = path[..first_brace].rsplit_once('/').map_or("", |(d, _)| d).to_string();
        let cut = if prefix.is_empty() { 0 } else { prefix.len() + 1 };
        let names = names.into_iter().map(|n| n[cut..].to_string()).collect();
        return Ok(RemoteLocation { scheme: scheme.to_string(), bucket, prefix, names: Some(names) });
    }
    let last = path.rsplit('/').next().unwrap_or("");
    // A `.bin` is a token file (a Megatron pair's, by its `.bin`, or a flat one), not a prefix.
    if scheme.starts_with("http") || Layout::of_shard_name(last).is_some() || last.ends_with(".bin") {
        // HTTP cannot list: a URI there names a file (a shard, or the list's directory).
        if last.contains('.') {
            let (prefix, name) = path.rsplit_once('/').map_or(("", path.as_str()), |(d, n)| (d, n));
            return Ok(RemoteLocation {
                scheme: scheme.to_string(),
                bucket,
                prefix: prefix.to_string(),
                names: Some(vec![name.to_string()]),
            });
        }
    }
    Ok(RemoteLocation { scheme: scheme.to_string(), bucket, prefix: path, names: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_forms() {
        let u = parse("/data/x?layout=tar&concurrency=4").unwrap();
        assert_eq!(u.location, Location::Local("/data/x".into()));
        assert_eq!(u.options.layout, Some(Layout::Tar));
        assert_eq!(u.options.concurrency, Some(4));
        let f = parse("file:///data/a%20b").unwrap();
        assert_eq!(f.location, Location::Local("/data/a b".into()));
        assert!(matches!(parse("file:///d/s-{0..1}.tar").unwrap().location, Location::LocalPattern(v) if v.len() == 2));
    }

    #[test]
    fn bad_uris_and_options_name_the_choices() {
        let e = parse("/d?layout=zip").unwrap_err().to_string();
        assert!(e.contains("objects") && e.contains("tar") && e.contains("lmdb"), "{e}");
        let e = parse("/d?colour=red").unwrap_err().to_string();
        assert!(e.contains("colour") && e.contains("concurrency"), "{e}");
        let e = parse("/d?concurrency=many").unwrap_err().to_string();
        assert!(e.contains("concurrency"), "{e}");
        let e = parse("ftp://host/x").unwrap_err().to_string();
        assert!(e.contains("ftp") && e.contains("file"), "{e}");
        assert!(parse("file://relative/x").is_err());
        assert!(parse("").is_err());
    }
}
