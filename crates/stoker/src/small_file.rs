//! Small files a user names (an options file, a CA bundle, a tokenizer, a mix, a saved state),
//! read whole but never past a cap. The lowest floor: the fetch layer reads CA bundles with it,
//! the CLI its files.

use std::io;
use std::path::Path;

/// What a small file the user names (an options file, a CA bundle, a saved state) may hold:
/// [`read_capped`]'s cap for them.
pub const SMALL_FILE_BYTES: u64 = 64 << 20;

/// The bytes of a small file the user names (a tokenizer, a mix file), at most `cap` of them:
/// a path given by mistake (a corpus of gigabytes, a device that never ends) is refused, not
/// read into memory. A larger one is an `InvalidData` error saying so, as is a device or a
/// directory. A pipe (a shell's `<(command)`, which keeps a secret off the disk) is read to
/// its end, up to the cap; opened without waiting for a writer, so a named pipe nobody writes
/// to reads as empty instead of hanging.
pub fn read_capped(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    use io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let larger = || io::Error::new(io::ErrorKind::InvalidData, format!("it is larger than {cap} bytes"));
    // Non-blocking: opening a named pipe would otherwise wait for a writer.
    let file = std::fs::File::options().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let md = file.metadata()?;
    if !md.file_type().is_file() && !md.file_type().is_fifo() {
        let odd = "it is not a regular file or a pipe (a device or directory)";
        return Err(io::Error::new(io::ErrorKind::InvalidData, odd));
    }
    // Reads wait again: a pipe's writer may be slower than this reader.
    // SAFETY: plain system calls on a descriptor `file` holds open; no memory is passed.
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    // A file that says it is larger is refused unread; the read is capped anyway.
    if md.len() > cap {
        return Err(larger());
    }
    let mut bytes = Vec::new();
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(larger());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_read_takes_a_file_up_to_its_cap_and_refuses_more_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"12345").unwrap();
        assert_eq!(read_capped(&path, 5).unwrap(), b"12345");
        let e = read_capped(&path, 4).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("larger than 4 bytes"), "{e}");
        // A device that never ends and a directory are refused unread.
        for odd in [Path::new("/dev/zero"), dir.path()] {
            let e = read_capped(odd, 1 << 20).unwrap_err();
            assert!(e.to_string().contains("not a regular file or a pipe"), "{}: {e}", odd.display());
        }
        // A named pipe no one writes to reads as empty at once (its open does not wait).
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a plain system call given a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert_eq!(read_capped(&fifo, 5).unwrap(), b"");
        // A pipe as a shell's `<(command)` hands it (`/dev/fd/N`) is read to its end.
        let mut ends = [0; 2];
        // SAFETY: `pipe` fills the two descriptors of the array it is given.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        // SAFETY: the write end is this test's own, owned from here on (closed on drop).
        let mut w = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(ends[1]) };
        io::Write::write_all(&mut w, b"abc").unwrap();
        drop(w);
        assert_eq!(read_capped(Path::new(&format!("/dev/fd/{}", ends[0])), 5).unwrap(), b"abc");
        // SAFETY: the read end is this test's own and used no more.
        unsafe { libc::close(ends[0]) };
        assert_eq!(read_capped(&dir.path().join("missing"), 5).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
