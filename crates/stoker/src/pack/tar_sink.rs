//! The bytes of one tar shard on their way to its [`ObjectWriter`], with what its index and a
//! rerun's comparison need kept aside as they pass: each member's header blocks (the shard's
//! headers are walked in them, not in the shard, which may be a remote object sent in parts),
//! each payload's XXH3-64 and the whole shard's XXH3-128.
//!
//! Members are written as `tar::Builder::append_data` writes them (the same header, GNU
//! long-name entry and padding: the headers are made by the tar crate itself), so a shard
//! streamed here has the bytes [`super::pack`] gives the same samples.

use std::io::{self, Read, Seek, SeekFrom, Write};

use twox_hash::XxHash3_128;

use crate::store::ObjectWriter;

/// The zero bytes a member's payload is padded with, and a tar's end is made of.
const ZEROS: [u8; 1024] = [0; 1024];

pub(super) struct TarSink {
    writer: ObjectWriter,
    /// Makes each member's header blocks (its buffer is cleared for every member).
    scratch: tar::Builder<Vec<u8>>,
    /// What a [`ShardStream`](super::ShardStream) walks the shard's index in: its headers
    /// (about 512 bytes a member). `stoker pack`, whose plan has the shard's size and whose
    /// index is walked in the file, does not keep them.
    log: Option<HeaderLog>,
    /// The whole shard's XXH3-128: what a rerun compares a shard already there with (a
    /// stream's rerun, a pack's resume), a few percent of a copy's cost.
    hash: XxHash3_128,
    sums: Vec<u64>,
}

impl TarSink {
    /// A sink into `writer`, keeping the headers for [`end`](Self::end) if `headers`.
    pub(super) fn new(writer: ObjectWriter, headers: bool) -> Self {
        TarSink {
            writer,
            scratch: tar::Builder::new(Vec::with_capacity(2048)),
            log: headers.then(HeaderLog::default),
            hash: XxHash3_128::new(),
            sums: Vec::new(),
        }
    }

    /// Bytes written so far.
    pub(super) fn written(&self) -> u64 {
        self.writer.written()
    }

    /// Members written so far.
    pub(super) fn members(&self) -> usize {
        self.sums.len()
    }

    /// Write one member (fixed metadata: mode 0644, owner 0, mtime 0, so the same input always
    /// gives the same bytes). Blocking.
    pub(super) fn member(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        let mut h = header(data.len() as u64);
        self.scratch.get_mut().clear();
        // No payload: the tar crate writes the header blocks alone (a long name's entry
        // included), and pads nothing.
        self.scratch.append_data(&mut h, name, io::empty())?;
        let head = std::mem::take(self.scratch.get_mut());
        if let Some(log) = &mut self.log {
            log.push(self.writer.written(), &head);
        }
        self.emit(&head)?;
        *self.scratch.get_mut() = head;
        self.emit(data)?;
        let pad = (512 - data.len() % 512) % 512;
        self.emit(&ZEROS[..pad])?;
        self.sums.push(twox_hash::XxHash3_64::oneshot(data));
        Ok(())
    }

    fn emit(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hash.write(bytes);
        self.writer.write_all(bytes)
    }

    /// The writer, nothing more written.
    pub(super) fn into_writer(self) -> ObjectWriter {
        self.writer
    }

    /// Write the tar's end; returns the writer, the payloads' checksums, the headers if kept
    /// and the whole shard's XXH3-128.
    pub(super) fn end(mut self) -> io::Result<Ended> {
        self.emit(&ZEROS)?;
        Ok((self.writer, self.sums, self.log, self.hash.finish_128()))
    }
}

/// What [`TarSink::end`] gives back: the writer, the payloads' checksums, the headers if kept
/// and the whole shard's XXH3-128.
pub(super) type Ended = (ObjectWriter, Vec<u64>, Option<HeaderLog>, u128);

/// A member's header before its name: a regular file of `size` bytes, mode 0644, owner 0,
/// mtime 0.
fn header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

/// Each member's header blocks and where they lie in the shard.
#[derive(Default)]
pub(super) struct HeaderLog {
    bytes: Vec<u8>,
    /// `(offset in the shard, start in bytes)`, in order.
    at: Vec<(u64, usize)>,
}

impl HeaderLog {
    fn push(&mut self, offset: u64, head: &[u8]) {
        self.at.push((offset, self.bytes.len()));
        self.bytes.extend_from_slice(head);
    }

    /// The shard of `size` bytes as a reader: the headers where they were written, zeros
    /// elsewhere. A walk of the headers that skips the payloads reads what the shard holds.
    pub(super) fn reader(&self, size: u64) -> SparseShard<'_> {
        SparseShard { log: self, size, pos: 0 }
    }
}

pub(super) struct SparseShard<'a> {
    log: &'a HeaderLog,
    size: u64,
    pos: u64,
}

impl Read for SparseShard<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.size || buf.is_empty() {
            return Ok(0);
        }
        let at = &self.log.at;
        // The last header starting at or before the position.
        let i = at.partition_point(|&(o, _)| o <= self.pos);
        let room = (self.size - self.pos).min(buf.len() as u64) as usize;
        let n = match i.checked_sub(1).map(|i| (i, at[i])) {
            Some((i, (o, start))) => {
                let end = at.get(i + 1).map_or(self.log.bytes.len(), |&(_, s)| s);
                let len = (end - start) as u64;
                if self.pos < o + len {
                    let from = start + (self.pos - o) as usize;
                    let n = room.min(end - from);
                    buf[..n].copy_from_slice(&self.log.bytes[from..from + n]);
                    n
                } else {
                    zeros(buf, room, at.get(i + 1).map(|&(o, _)| o), self.pos)
                }
            }
            None => zeros(buf, room, at.first().map(|&(o, _)| o), self.pos),
        };
        self.pos += n as u64;
        Ok(n)
    }
}

/// Zero up to `room` bytes of `buf`, stopping at the next header (at `next`).
fn zeros(buf: &mut [u8], room: usize, next: Option<u64>, pos: u64) -> usize {
    let n = next.map_or(room, |o| room.min((o - pos) as usize));
    buf[..n].fill(0);
    n
}

impl Seek for SparseShard<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a seek before the start"))?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[tokio::test]
    async fn members_are_the_tar_crates_bytes_and_the_headers_read_back_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::local(dir.path()).unwrap();
        let long = format!("{}/x.jpg", "d".repeat(120));
        let members: [(&str, Vec<u8>); 4] =
            [("a.jpg", vec![1; 700]), (&long, vec![2; 512]), ("b.cls", b"7".to_vec()), ("c.txt", vec![])];
        let mut sink = TarSink::new(store.writer("s.tar", 0).unwrap(), true);
        let mut want = tar::Builder::new(Vec::new());
        let mut sums = Vec::new();
        for (name, data) in &members {
            sink.member(name, data).unwrap();
            // What the tar crate writes for the same member.
            want.append_data(&mut header(data.len() as u64), name, &data[..]).unwrap();
            sums.push(twox_hash::XxHash3_64::oneshot(data));
        }
        assert_eq!(sink.members(), 4);
        let (w, got_sums, log, hash) = sink.end().unwrap();
        let log = log.unwrap();
        let want = want.into_inner().unwrap();
        assert_eq!(w.written(), want.len() as u64);
        assert_eq!((got_sums, hash), (sums, XxHash3_128::oneshot(&want)));
        w.finish().await.unwrap();
        assert_eq!(std::fs::read(dir.path().join("s.tar")).unwrap(), want, "the tar crate's bytes");

        // Headers where they are, zeros elsewhere: every byte of the shard that is not payload.
        let mut sparse = Vec::new();
        log.reader(want.len() as u64).read_to_end(&mut sparse).unwrap();
        assert_eq!(sparse.len(), want.len());
        let mut payload = vec![false; want.len()];
        let mut archive = tar::Archive::new(&want[..]);
        for e in archive.entries().unwrap() {
            let e = e.unwrap();
            let at = e.raw_file_position() as usize;
            payload[at..at + e.size() as usize].fill(true);
        }
        for (i, (&s, &w)) in sparse.iter().zip(&want).enumerate() {
            assert_eq!(s, if payload[i] { 0 } else { w }, "byte {i}");
        }
        let mut r = log.reader(want.len() as u64);
        r.seek(SeekFrom::Start(1536)).unwrap();
        let mut block = [0u8; 512];
        r.read_exact(&mut block).unwrap();
        assert_eq!(block[..], want[1536..2048], "a read after a seek");
    }
}
