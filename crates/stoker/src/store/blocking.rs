//! A blocking, block-buffered `Read + Seek` view of an object, for walks over tar headers
//! (indexing) that seek past payloads.

use std::io::{self, Read, Seek, SeekFrom};

use bytes::Bytes;

use super::{Backend, Store};
use crate::error::{Error, Result};

impl Store {
    /// A blocking `Read + Seek` view of an object for header walks (tar indexing).
    ///
    /// Reads go `block` bytes at a time and a seek within the current block is free, so
    /// walking headers does not read the payloads between them. Call it from a blocking
    /// thread, never from an async task.
    pub fn blocking_reader(&self, path: &str, size: u64, block: usize) -> Result<BlockReader> {
        let fetch = match &self.0.backend {
            Backend::Local(l) => {
                let full = l.file(&self.obj_path(path))?;
                Fetch::Local(std::fs::File::open(&full).map_err(|e| Error::io(full.display(), e))?)
            }
            Backend::Remote { .. } => Fetch::Remote(self.clone(), path.to_string(), tokio::runtime::Handle::current()),
        };
        Ok(BlockReader { fetch, size, pos: 0, buf: Bytes::new(), buf_start: 0, block: block.max(512) })
    }
}

enum Fetch {
    Local(std::fs::File),
    Remote(Store, String, tokio::runtime::Handle),
}

/// Blocking, block-buffered `Read + Seek` over one object. See [`Store::blocking_reader`].
pub struct BlockReader {
    fetch: Fetch,
    size: u64,
    pos: u64,
    buf: Bytes,
    buf_start: u64,
    block: usize,
}

impl BlockReader {
    /// The current position.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The object size given when the reader was made.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn fill(&mut self) -> io::Result<()> {
        let end = (self.pos + self.block as u64).min(self.size);
        let range = self.pos..end;
        self.buf = match &self.fetch {
            Fetch::Local(file) => {
                let mut v = vec![0u8; (end - self.pos) as usize];
                let done = super::local::read_at_most(file, &mut v, self.pos)?;
                v.truncate(done);
                Bytes::from(v)
            }
            Fetch::Remote(store, path, handle) => {
                handle.block_on(store.get_range(path, range)).map_err(|e| io::Error::other(e.to_string()))?
            }
        };
        self.buf_start = self.pos;
        Ok(())
    }
}

impl Read for BlockReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.size || out.is_empty() {
            return Ok(0);
        }
        let in_buf = self.pos >= self.buf_start && self.pos < self.buf_start + self.buf.len() as u64;
        if !in_buf {
            self.fill()?;
            if self.buf.is_empty() {
                return Ok(0);
            }
        }
        let off = (self.pos - self.buf_start) as usize;
        let n = out.len().min(self.buf.len() - off);
        out[..n].copy_from_slice(&self.buf[off..off + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for BlockReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
        };
        self.pos = target.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before start"))?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn block_reader_seeks_within_and_past_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let s = Store::local(dir.path()).unwrap();
        let mut r = s.blocking_reader("f", data.len() as u64, 1024).unwrap();
        let mut b = [0u8; 10];
        r.seek(SeekFrom::Start(1020)).unwrap();
        r.read_exact(&mut b).unwrap();
        assert_eq!(&b[..], &data[1020..1030]);
        r.seek(SeekFrom::Current(3000)).unwrap();
        r.read_exact(&mut b).unwrap();
        assert_eq!(&b[..], &data[4030..4040]);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, &data[4040..]);
    }
}
