//! A destination directory locked while a writer fills it.

use crate::error::{Error, Result};

/// A local destination directory locked (`flock`) while a pack writes it, unlocked when
/// dropped. Two packs into one directory raced: both wrote the plan, one indexed or removed
/// what the other was landing, and the loser failed on a file gone under it. The lock holds
/// among the processes of one machine; on a network file system whose directories take no
/// `flock`, it holds on this machine only, and where one is refused outright (`ENOLCK`, no
/// lock daemon) the pack goes on without it.
pub(crate) struct DestLock(Option<std::fs::File>);

impl Drop for DestLock {
    fn drop(&mut self) {
        if let Some(f) = &self.0 {
            let _ = f.unlock();
        }
    }
}

/// Lock the destination directory `dir` (named `shown`), or refuse: another pack holds it.
/// The directory itself is locked, not a file in it, so a finished pack leaves nothing behind.
pub(crate) fn lock_dest(dir: &std::path::Path, shown: &str) -> Result<DestLock> {
    let file = std::fs::File::open(dir).map_err(|e| Error::io(dir.display(), e))?;
    match file.try_lock() {
        Ok(()) => Ok(DestLock(Some(file))),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Pack {
            dest: shown.to_string(),
            reason: "another pack is writing it now (it holds the directory's lock): wait for that one to finish, \
                     or stop it and rerun"
                .into(),
        }),
        Err(std::fs::TryLockError::Error(e))
            if matches!(e.raw_os_error(), Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS)) =>
        {
            Ok(DestLock(None))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(Error::io(dir.display(), e)),
    }
}
