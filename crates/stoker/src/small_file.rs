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
/// read into memory. A larger one is an `InvalidData` error saying so, as is anything but a
/// regular file (after links): a named pipe would block the open until some writer came, a
/// device would be read up to the cap.
pub fn read_capped(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    use io::Read;
    let larger = || io::Error::new(io::ErrorKind::InvalidData, format!("it is larger than {cap} bytes"));
    // Looked at before it is opened: opening a named pipe waits for a writer.
    if !std::fs::metadata(path)?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "it is not a regular file (a pipe, device or directory)",
        ));
    }
    let file = std::fs::File::open(path)?;
    // A file that says it is larger is refused unread; the size is asked again of what was
    // opened (the path may have been replaced in between), and the read is capped anyway.
    let md = file.metadata()?;
    if !md.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "it is not a regular file (a pipe, device or directory)",
        ));
    }
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
        // A device that never ends, a directory, and a named pipe no one writes to (whose
        // open would wait for ever) are refused unread.
        for odd in [Path::new("/dev/zero"), dir.path()] {
            let e = read_capped(odd, 1 << 20).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{}: {e}", odd.display());
        }
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a plain system call given a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert!(read_capped(&fifo, 5).unwrap_err().to_string().contains("not a regular file"));
        assert_eq!(read_capped(&dir.path().join("missing"), 5).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
