//! Whether a writer's destination is where a source reads ([`writes_into`]).

use std::path::{Component, Path, PathBuf};

use super::{parse, Layout, Location};

/// Whether writing to the destination URI `dest` writes where the source shown as `source` (a
/// source's display, `LAYOUT:URI`) reads: its directory or prefix (a file's, a data prefix's
/// or a brace pattern's is the one holding them), or for a directory or prefix, anywhere
/// inside it. A pack would write among the samples it reads (a rerun then reads its own output
/// as input), and `--force` first deletes an earlier pack's files, which are the source's own
/// when a pack is packed again in place. Locations are compared parsed (`file://` or not, a
/// relative path, links and `..` resolved); remote ones by scheme, bucket and prefix (the
/// endpoint aside: the same names on two endpoints are refused, never the other way).
pub(crate) fn writes_into(source: &str, dest: &str) -> bool {
    let (Ok(src), Ok(dst)) = (parse(source_uri(source)), parse(dest)) else { return false };
    match (src.location, dst.location) {
        (Location::Local(s), Location::Local(d)) => {
            let (s, d) = (resolved(&s), resolved(&d));
            let whole = s.is_dir();
            let root = if whole { s.clone() } else { s.parent().map(Path::to_path_buf).unwrap_or(s) };
            d == root || (whole && d.starts_with(&root))
        }
        (Location::LocalPattern(paths), Location::Local(d)) => {
            let d = resolved(&d);
            paths.iter().any(|p| resolved(p).parent() == Some(d.as_path()))
        }
        (Location::Remote(s), Location::Remote(d)) => {
            let (sp, dp) = (s.prefix.trim_matches('/'), d.prefix.trim_matches('/'));
            let inside = s.names.is_none() && (sp.is_empty() || dp.starts_with(&format!("{sp}/")));
            s.scheme == d.scheme && s.bucket == d.bucket && (dp == sp || inside)
        }
        _ => false,
    }
}

/// The URI in a source's display: a source shows itself as `LAYOUT:URI` (`tar:./data`).
pub(crate) fn source_uri(display: &str) -> &str {
    match display.split_once(':') {
        Some((head, rest)) if Layout::ALL.iter().any(|l| l.as_str() == head) => rest,
        _ => display,
    }
}

/// `path` absolute, with links resolved where it exists and `.` and `..` taken as the parts
/// that do not exist yet will be (directories made for a destination): where a writer would
/// write. Unresolvable (no working directory): as it is.
fn resolved(path: &Path) -> PathBuf {
    let mut rest: Vec<Component<'_>> = Vec::new();
    let mut at = path;
    loop {
        let here = if at.as_os_str().is_empty() { Path::new(".") } else { at };
        if let Ok(mut found) = std::fs::canonicalize(here) {
            for c in rest.iter().rev() {
                match c {
                    Component::ParentDir => {
                        found.pop();
                    }
                    Component::Normal(n) => found.push(n),
                    _ => {}
                }
            }
            return found;
        }
        let Some(last) = at.components().next_back() else { return path.to_path_buf() };
        rest.push(last);
        at = at.parent().unwrap_or(Path::new(""));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_in_the_source_is_found_however_either_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let (src, sib) = (root.join("packed"), root.join("packed2"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(&sib).unwrap();
        std::fs::write(src.join("shard-000000.tar"), b"x").unwrap();
        std::os::unix::fs::symlink(&src, root.join("link")).unwrap();
        let s = src.display().to_string();
        let tar = |u: &str| format!("tar:{u}");
        // The same directory, by another name; inside it; a new directory resolved through `..`.
        for dest in [
            s.clone(),
            format!("{s}/"),
            format!("file://{s}"),
            format!("{}/link", root.display()),
            format!("{s}/out"),
            format!("{s}/new/../"),
            format!("{s}/new/../out"),
        ] {
            assert!(writes_into(&tar(&s), &dest), "{dest}");
        }
        assert!(writes_into(&tar(&format!("file://{s}")), &s));
        // A file's or a pattern's directory, not below it; a data prefix names its directory.
        let file = format!("{s}/shard-000000.tar");
        assert!(writes_into(&tar(&file), &s) && !writes_into(&tar(&file), &format!("{s}/out")));
        let pattern = format!("{s}/shard-{{000000..000001}}.tar");
        assert!(writes_into(&tar(&pattern), &s) && !writes_into(&tar(&pattern), &format!("{s}/out")));
        assert!(writes_into(&format!("tokens:{s}/corpus"), &s));
        // Elsewhere: a sibling whose name begins the same, the parent, another bucket.
        for dest in [sib.display().to_string(), root.display().to_string(), format!("{s}2/out")] {
            assert!(!writes_into(&tar(&s), &dest), "{dest}");
        }
        assert!(writes_into("tar:s3://b/data", "s3://b/data/out?endpoint=http://x"));
        assert!(writes_into("tar:s3://b", "s3://b/anything"));
        assert!(writes_into("tar:s3://b/data/x-{0..3}.tar", "s3://b/data"));
        for dest in ["s3://b/data2", "s3://c/data", "gs://b/data", "s3://b"] {
            assert!(!writes_into("tar:s3://b/data", dest), "{dest}");
        }
    }

    #[test]
    fn a_pattern_named_from_the_working_directory_names_it() {
        let here = std::env::current_dir().unwrap().display().to_string();
        assert!(writes_into("tar:shard-{000000..000002}.tar", "."));
        assert!(writes_into("tar:shard-{000000..000002}.tar", &here));
        assert!(!writes_into("tar:shard-{000000..000002}.tar", "./out"));
    }
}
