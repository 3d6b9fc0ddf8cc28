//! Where Stoker keeps what it writes for a user (indexes, disk cache blocks, spilled
//! decodes, tokenized corpora) when no option names a directory: the user's cache directory,
//! else a private one in the shared temporary directory.

use std::path::{Path, PathBuf};

/// `name` in the user's cache directory for Stoker: `$STOKER_CACHE_DIR/name`, else
/// `$XDG_CACHE_HOME/stoker/name`, else `~/.cache/stoker/name`, else a directory of this user's
/// own in the temporary directory ([`private_tmp_dir`]).
pub(super) fn user_cache_dir(name: &str) -> PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = env("STOKER_CACHE_DIR") {
        return d.join(name);
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return d.join("stoker").join(name);
    }
    if let Some(h) = env("HOME") {
        return h.join(".cache/stoker").join(name);
    }
    private_tmp_dir(&std::env::temp_dir(), name)
}

/// `stoker-<uid>-<name>` in `tmp`, made only this user may enter (0700). The temporary
/// directory is shared: another user could make that name first and plant cache blocks
/// (training data) or read what is cached there. So a directory that is not this user's own,
/// or that others may write, or anything else under that name, is not used: a fresh private
/// directory is made beside it for this process (said once on standard error).
fn private_tmp_dir(tmp: &Path, name: &str) -> PathBuf {
    // Chosen once a process for each name: a fresh directory per call would put an index
    // where the next look does not find it, and a disk cache per source.
    static CHOSEN: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<PathBuf, PathBuf>>> =
        std::sync::OnceLock::new();
    let key = tmp.join(name);
    let mut chosen = CHOSEN.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    chosen.entry(key).or_insert_with(|| choose_tmp_dir(tmp, name)).clone()
}

/// [`private_tmp_dir`]'s choice, made once a name.
fn choose_tmp_dir(tmp: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let private = |dir: &Path| {
        std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0)
    };
    let dir = tmp.join(format!("stoker-{uid}-{name}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    if private(&dir) {
        return dir;
    }
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "stoker: warning: {} is not a directory of this user's own that only it may enter; its cache goes to a new \
             one for this process instead (set STOKER_CACHE_DIR or HOME to keep a cache between runs)",
            dir.display()
        );
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let fresh = tmp.join(format!("stoker-{uid}-{name}-{}-{now:x}", std::process::id()));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&fresh);
    fresh
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temporary_fallback_is_this_users_own_or_a_fresh_one() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let tmp = tempfile::tempdir().unwrap();
        let mine = private_tmp_dir(tmp.path(), "blocks");
        let m = std::fs::metadata(&mine).unwrap();
        assert!(m.is_dir() && m.mode() & 0o777 == 0o700, "{:o}", m.mode());
        assert_eq!(private_tmp_dir(tmp.path(), "blocks"), mine, "the same one again");
        // Made by someone else's rules first (open to all), or a symlink in its place: not used.
        let open = tmp.path().join(format!("stoker-{}-index", m.uid()));
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let other = private_tmp_dir(tmp.path(), "index");
        assert_ne!(other, open);
        assert_eq!(std::fs::metadata(&other).unwrap().mode() & 0o777, 0o700);
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), tmp.path().join(format!("stoker-{}-spill", m.uid()))).unwrap();
        let not_link = private_tmp_dir(tmp.path(), "spill");
        assert!(!std::fs::symlink_metadata(&not_link).unwrap().file_type().is_symlink());
    }
}
