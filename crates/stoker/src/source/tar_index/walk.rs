//! The header walk that builds a shard's index, and the resynchronisation that carries it
//! past damage under `on_damage=skip`: like GNU tar's "skipping to next header", it scans
//! 512-byte boundaries for a block that verifies as a header and goes on from there.

use std::collections::HashMap;
use std::io::{self, Read, Seek, SeekFrom};

use super::{header_checksum, header_digest, ShardIndex, HEADER};
use crate::error::{Error, Result};
use crate::sample::{is_webdataset_meta, split_key};
use crate::stats::{Damage, DamageCause};
use crate::store::ObjectInfo;

/// How to walk a shard.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Walk {
    /// Step over damage, recording it, instead of failing.
    pub skip: bool,
    /// Read every payload and record its XXH3-64.
    pub checksums: bool,
}

/// The strict, headers-only walk: [`build_with`] and the default [`Walk`].
#[cfg(feature = "fuzzing")]
pub(crate) fn build_from<R: Read + Seek>(reader: R, info: &ObjectInfo, shard: &str) -> Result<ShardIndex> {
    build_with(reader, info, shard, Walk::default())
}

/// Where one run of the tar reader stopped.
enum Stop {
    /// An end-of-archive block, or the end of the file, where the next header would start.
    End(u64),
    /// Damage at `at`.
    Damaged(Found),
}

/// Damage as the walk meets it.
struct Found {
    at: u64,
    cause: DamageCause,
    reason: String,
    /// Nothing after it can be read.
    to_end: bool,
    /// A readable header whose member runs past the end of the shard: the shard is cut
    /// short, or the header's size field lies. Its size is not trusted: the walk resumes at
    /// the next valid header after it, if any, and else counts the rest of the shard lost.
    past_end: bool,
    /// The key of the member lost, when its header was still readable.
    lost_key: Option<String>,
}

impl Found {
    fn header(at: u64, reason: String) -> Stop {
        Stop::Damaged(Found {
            at,
            cause: DamageCause::DamagedHeader,
            reason,
            to_end: false,
            past_end: false,
            lost_key: None,
        })
    }
}

/// A damaged stretch, with where the sample list stood when the walk met it.
struct Gap {
    found: Found,
    end: u64,
    samples_before: usize,
}

/// Walk the headers of a shard of `info.size` bytes and group members into samples as
/// webdataset does; `shard` names it in errors. Under `walk.skip` damage is stepped over and
/// recorded in the index's `damage`; otherwise it is an error naming the shard and offset.
pub(crate) fn build_with<R: Read + Seek>(
    mut reader: R,
    info: &ObjectInfo,
    shard: &str,
    walk: Walk,
) -> Result<ShardIndex> {
    let mut b = Builder::new(info, walk);
    let mut gaps: Vec<Gap> = Vec::new();
    let mut base = 0u64;
    loop {
        let (found, resume) = match b.segment(&mut reader, base) {
            // The tar crate stops quietly at end of file; a shard cut exactly at a member
            // boundary would look complete. Writers (tar, Python's tarfile, webdataset)
            // always end with zero blocks, so their absence means truncation.
            Stop::End(next) if next + HEADER > info.size => {
                let reason = "the shard ends without the end-of-archive marker (zero blocks): it was probably \
                              truncated; re-copy or re-pack it";
                let found = Found {
                    at: next,
                    cause: DamageCause::Truncated,
                    reason: reason.into(),
                    to_end: true,
                    past_end: false,
                    lost_key: None,
                };
                (found, None)
            }
            // A zero block ends the archive for every reader; a header after it means a
            // zeroed header (or archives joined with `cat`) hid the members that follow.
            Stop::End(next) => match resync(&mut reader, next, info.size) {
                None => break,
                Some(r) => {
                    let reason = format!(
                        "a zero block at byte {next} ends the archive, yet a member header follows at byte {r}: a \
                         header was zeroed, or archives were joined with `cat` (use `tar --concatenate`)"
                    );
                    let found = Found {
                        at: next,
                        cause: DamageCause::DamagedHeader,
                        reason,
                        to_end: false,
                        past_end: false,
                        lost_key: None,
                    };
                    (found, Some(r))
                }
            },
            Stop::Damaged(mut found) => {
                let resume =
                    if found.to_end || !walk.skip { None } else { resync(&mut reader, found.at + HEADER, info.size) };
                if let (Some(r), true) = (resume, found.past_end) {
                    // A valid header after a member said to run past the end: the shard is
                    // whole and the member's size field lies. Only that member is lost.
                    found.cause = DamageCause::DamagedHeader;
                    found.reason = format!(
                        "{}; a valid member header follows at byte {r}, so the shard is whole and this member's size \
                         field is wrong",
                        found.reason
                    );
                }
                (found, resume)
            }
        };
        if !walk.skip {
            return Err(Error::CorruptTar { shard: shard.to_string(), offset: found.at, reason: found.reason });
        }
        let end = resume.unwrap_or(info.size);
        gaps.push(Gap { found, end, samples_before: b.idx.keys.len() });
        match resume {
            Some(r) => base = r,
            None => break,
        }
    }
    Ok(b.finish(gaps))
}

/// The first 512-byte boundary at or after `from` holding a block that verifies as the header
/// of a member that fits in the shard, if any.
pub(crate) fn resync<R: Read + Seek>(reader: &mut R, from: u64, size: u64) -> Option<u64> {
    let mut at = from.div_ceil(HEADER).checked_mul(HEADER)?;
    let mut chunk = vec![0u8; 64 << 10];
    while at.checked_add(HEADER).is_some_and(|e| e <= size) {
        let n = ((size - at).min(chunk.len() as u64) / HEADER * HEADER) as usize;
        // A read failing here ends the scan: the rest of the shard counts as damaged.
        reader.seek(SeekFrom::Start(at)).ok()?;
        reader.read_exact(&mut chunk[..n]).ok()?;
        let found = chunk[..n].chunks_exact(HEADER as usize).position(|block| {
            let pos = at + (block.as_ptr() as usize - chunk.as_ptr() as usize) as u64;
            plausible_header(block, pos, size)
        });
        if let Some(i) = found {
            return Some(at + i as u64 * HEADER);
        }
        at += n as u64;
    }
    None
}

/// Whether `block`, at byte `at` of a shard of `size` bytes, is a header to resume at: a
/// named POSIX or GNU header (`ustar` magic: what tar, tarfile and webdataset write) whose
/// checksum verifies and whose member ends inside the shard. Old v7 headers carry no magic
/// and are not resumed at: a payload's bytes match too easily.
pub(crate) fn plausible_header(block: &[u8], at: u64, size: u64) -> bool {
    if block.len() != HEADER as usize || block[0] == 0 || !verifies(block) {
        return false;
    }
    let h = tar::Header::from_byte_slice(block);
    h.entry_size().ok().and_then(|n| (at + HEADER).checked_add(n)).is_some_and(|end| end <= size)
}

/// Whether a 512-byte `block` is a POSIX or GNU header (`ustar` magic) whose checksum verifies.
fn verifies(block: &[u8]) -> bool {
    &block[257..262] == b"ustar" && tar::Header::from_byte_slice(block).cksum().ok() == Some(header_checksum(block))
}

/// The index being built.
struct Builder<'a> {
    idx: ShardIndex,
    name_ids: HashMap<String, u32>,
    open_key: Option<String>,
    info: &'a ObjectInfo,
    walk: Walk,
    buf: Vec<u8>,
}

impl<'a> Builder<'a> {
    fn new(info: &'a ObjectInfo, walk: Walk) -> Self {
        let idx = ShardIndex::empty(info);
        Builder { idx, name_ids: HashMap::new(), open_key: None, info, walk, buf: Vec::new() }
    }

    /// Read members with the tar crate from `base` (a header boundary) until it stops.
    fn segment<R: Read + Seek>(&mut self, reader: &mut R, base: u64) -> Stop {
        if let Err(e) = reader.seek(SeekFrom::Start(base)) {
            return Found::header(base, format!("cannot read the shard: {e}"));
        }
        let in_payload = std::rc::Rc::new(std::cell::Cell::new(false));
        let mut archive = tar::Archive::new(FromBase { inner: reader, base, at: 0, in_payload: in_payload.clone() });
        let entries = match archive.entries_with_seek() {
            Ok(e) => e,
            Err(e) => return Found::header(base, describe_tar_error(&e)),
        };
        // Where the next header should start: the damage offset when a header fails to parse.
        let mut next_header = base;
        for entry in entries {
            let mut entry = match entry {
                Ok(e) => e,
                Err(e) => return Found::header(next_header, describe_tar_error(&e)),
            };
            let header_at = base + entry.raw_header_position();
            let data_pos = base + entry.raw_file_position();
            let size = entry.size();
            let Some(end) = data_pos.checked_add(size) else {
                return Found::header(header_at, "member size overflows".into());
            };
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            // A sparse file's member holds its map and its data runs, not its bytes (and, in
            // the pax form, sits under a placeholder name): read as a plain member it would be
            // other bytes under another key.
            let pax_sparse = entry
                .pax_extensions()
                .ok()
                .flatten()
                .is_some_and(|mut x| x.any(|e| e.is_ok_and(|e| e.key_bytes().starts_with(b"GNU.sparse."))));
            if pax_sparse || entry.header().entry_type().is_gnu_sparse() {
                return Found::header(
                    header_at,
                    format!(
                        "member `{name}` is a sparse file (tar --sparse), which Stoker does not read: its member holds \
                         the file's map and data runs, not its bytes; pack the shard again without --sparse"
                    ),
                );
            }
            if end > self.info.size {
                let reason = format!(
                    "member `{name}` claims {size} bytes at offset {data_pos}, past the end of the shard ({} bytes): \
                     the shard is truncated (or the member's header is wrong); re-copy or re-pack it",
                    self.info.size
                );
                let lost_key = split_key(&name).map(|(k, _)| k.to_string());
                return Stop::Damaged(Found {
                    at: header_at,
                    cause: DamageCause::Truncated,
                    reason,
                    to_end: false,
                    past_end: true,
                    lost_key,
                });
            }
            next_header = end.div_ceil(HEADER) * HEADER;
            let kind = entry.header().entry_type();
            if !(kind.is_file() || kind.is_contiguous()) || is_webdataset_meta(&name) {
                continue;
            }
            let Some((key, ext)) = split_key(&name) else { continue };
            let (key, ext) = (key.to_string(), ext.to_ascii_lowercase());
            if data_pos != header_at + HEADER {
                return Found::header(header_at, format!("member `{name}`: its payload does not follow its header"));
            }
            let id = self.name_id(&ext);
            let continues = self.open_key.as_deref() == Some(key.as_str());
            let sample_start =
                if continues { *self.idx.starts.last().unwrap_or(&0) as usize } else { self.idx.fields.len() };
            if self.idx.fields[sample_start..].iter().any(|f| f.0 == id) {
                return Found::header(
                    header_at,
                    format!("member `{name}`: sample `{key}` already has a `{ext}` field (webdataset rejects duplicate file names too)"),
                );
            }
            let crc = if self.walk.checksums {
                // A payload's bytes are not headers, whatever they look like.
                in_payload.set(true);
                let got = digest_of(self.idx.digest, &mut entry, &mut self.buf);
                in_payload.set(false);
                match got {
                    Ok(c) => Some(c),
                    Err(e) => return Found::header(header_at, format!("cannot read member `{name}`: {e}")),
                }
            } else {
                None
            };
            let digest = header_digest(entry.header().as_bytes());
            self.push(key, id, (data_pos, size), digest, crc);
        }
        Stop::End(next_header)
    }

    fn name_id(&mut self, ext: &str) -> u32 {
        let next_id = self.name_ids.len() as u32;
        let names = &mut self.idx.names;
        *self.name_ids.entry(ext.to_string()).or_insert_with(|| {
            names.push(ext.to_string());
            next_id
        })
    }

    fn push(&mut self, key: String, id: u32, (off, len): (u64, u64), digest: u32, crc: Option<u64>) {
        if self.open_key.as_deref() != Some(key.as_str()) {
            if self.open_key.is_some() {
                self.idx.starts.push(self.idx.fields.len() as u32);
            }
            self.idx.keys.push(key.clone());
            self.open_key = Some(key);
        }
        self.idx.fields.push((id, off, len));
        self.idx.headers.push(digest);
        if let Some(c) = crc {
            self.idx.sums.push(c);
        }
    }

    /// Close the last sample, then settle the samples the damage touched.
    fn finish(mut self, gaps: Vec<Gap>) -> ShardIndex {
        if self.open_key.is_some() {
            self.idx.starts.push(self.idx.fields.len() as u32);
        }
        if gaps.is_empty() {
            return self.idx;
        }
        let usual = usual_fields(&self.idx);
        let fields_of = |idx: &ShardIndex, i: usize| {
            let mut ids: Vec<u32> = idx.sample_fields(i).iter().map(|f| f.0).collect();
            ids.sort_unstable();
            ids
        };
        let mut dropped = vec![false; self.idx.len()];
        let mut reports = Vec::with_capacity(gaps.len());
        for gap in &gaps {
            let before = gap.samples_before.checked_sub(1);
            // The sample open at the damage went on after it: it lost the members in between.
            let merged = before.is_some_and(|b| self.idx.sample_fields(b).iter().any(|f| f.1 >= gap.end));
            let after = if merged { None } else { Some(gap.samples_before).filter(|&a| a < self.idx.len()) };
            let mut lost: Vec<String> = Vec::new();
            for i in before.into_iter().chain(after) {
                if merged || fields_of(&self.idx, i) != usual {
                    dropped[i] = true;
                    lost.push(self.idx.keys[i].clone());
                }
            }
            // A member cut off by the end of the shard: its key is known; a new sample is lost.
            let cut = gap
                .found
                .lost_key
                .as_ref()
                .filter(|k| !lost.contains(k) && before.is_none_or(|b| &self.idx.keys[b] != *k));
            lost.extend(cut.cloned());
            let exact = merged || gap.found.lost_key.is_some();
            reports.push((lost, exact));
        }
        let cause_of = |g: &Gap, kept: usize| match g.found.cause {
            DamageCause::DamagedHeader if g.found.at == 0 && kept == 0 => DamageCause::UnreadableShard,
            c => c,
        };
        self.idx = without(self.idx, &dropped);
        let kept = self.idx.len();
        for (gap, (lost, exact)) in gaps.into_iter().zip(reports) {
            let (start, end) = (gap.found.at, gap.end);
            let key_before = (0..kept).rev().find(|&i| self.idx.span(i).end <= start).map(|i| self.idx.keys[i].clone());
            let key_after = (0..kept).find(|&i| self.idx.span(i).start >= end).map(|i| self.idx.keys[i].clone());
            self.idx.damage.push(Damage {
                shard: self.idx.shard.clone(),
                cause: cause_of(&gap, kept),
                start,
                end,
                key_before,
                key_after,
                samples_lost: exact.then_some(lost.len() as u64),
                dropped: lost,
                reason: gap.found.reason,
            });
        }
        self.idx
    }
}

/// A reader seen from byte `base` on: the tar crate takes the positions its seeks return as
/// its own offsets, which must count from where its archive starts.
struct FromBase<'r, R> {
    inner: &'r mut R,
    base: u64,
    /// Where the next read starts, relative to `base`.
    at: u64,
    /// Set while the walk reads a member's payload (for its checksum).
    in_payload: std::rc::Rc<std::cell::Cell<bool>>,
}

/// The largest PAX or GNU long-name body the walk lets the tar crate read. It reads such a
/// body whole into memory before the walk sees the entry (and its size check): a damaged or
/// hostile header claiming the rest of a 50 GB shard would be read into memory. Most hold a
/// path and a few attributes (bytes to kilobytes); macOS's tar can store a file's extended
/// attributes there (a resource fork: megabytes), which the refusal's message names.
const MAX_EXTENSION: u64 = 1 << 20;

impl<R: Read> Read for FromBase<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        // The tar crate reads each header block alone, at a block boundary.
        if buf.len() == HEADER as usize && n == buf.len() && self.at.is_multiple_of(HEADER) && !self.in_payload.get() {
            refuse_long_extension(buf)?;
        }
        self.at += n as u64;
        Ok(n)
    }
}

/// An error for `block` if it is a valid header of an extension the tar crate reads into
/// memory (PAX `x`, GNU long name `L` or link `K`, in a POSIX or GNU header) whose body is over
/// [`MAX_EXTENSION`].
fn refuse_long_extension(block: &[u8]) -> io::Result<()> {
    if !matches!(block[156], b'x' | b'L' | b'K') || !verifies(block) {
        return Ok(());
    }
    match tar::Header::from_byte_slice(block).entry_size() {
        Ok(size) if size > MAX_EXTENSION => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a PAX or long-name header of {size} bytes (at most {MAX_EXTENSION})"),
        )),
        _ => Ok(()),
    }
}

impl<R: Seek> Seek for FromBase<'_, R> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let pos = match pos {
            SeekFrom::Start(n) => SeekFrom::Start(self.base.saturating_add(n)),
            other => other,
        };
        let at = self.inner.seek(pos)?;
        self.at = at
            .checked_sub(self.base)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the segment"))?;
        Ok(self.at)
    }
}

/// The field set most samples have (the larger on a tie, so a partial sample never sets it).
fn usual_fields(idx: &ShardIndex) -> Vec<u32> {
    let mut counts: HashMap<Vec<u32>, usize> = HashMap::new();
    for i in 0..idx.len() {
        let mut ids: Vec<u32> = idx.sample_fields(i).iter().map(|f| f.0).collect();
        ids.sort_unstable();
        *counts.entry(ids).or_default() += 1;
    }
    counts.into_iter().max_by_key(|(ids, n)| (*n, ids.len())).map(|(ids, _)| ids).unwrap_or_default()
}

/// `idx` without the samples marked in `dropped`.
fn without(mut idx: ShardIndex, dropped: &[bool]) -> ShardIndex {
    let (mut keys, mut starts, mut fields, mut headers, mut sums) =
        (Vec::new(), vec![0u32], Vec::new(), Vec::new(), Vec::new());
    for i in (0..idx.len()).filter(|&i| !dropped[i]) {
        let range = idx.starts[i] as usize..idx.starts[i + 1] as usize;
        keys.push(std::mem::take(&mut idx.keys[i]));
        fields.extend_from_slice(&idx.fields[range.clone()]);
        headers.extend_from_slice(&idx.headers[range.clone()]);
        if !idx.sums.is_empty() {
            sums.extend_from_slice(&idx.sums[range]);
        }
        starts.push(fields.len() as u32);
    }
    ShardIndex { keys, starts, fields, headers, sums, ..idx }
}

/// The `kind` digest of everything `r` yields, through `buf`.
fn digest_of(kind: super::PayloadDigest, r: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<u64> {
    buf.resize(256 << 10, 0);
    let mut h = kind.hasher();
    loop {
        match r.read(buf) {
            Ok(0) => return Ok(h.finish()),
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn describe_tar_error(e: &io::Error) -> String {
    // The tar crate quotes raw header bytes in some messages; garbage must not reach a
    // terminal, so keep printable ASCII and cut it short.
    let msg: String = e.to_string().chars().filter(|c| c.is_ascii_graphic() || *c == ' ').take(80).collect();
    let advice = "not a tar file, or a damaged header; re-pack the shard or leave it out (on_damage=skip keeps the \
                  samples around it)";
    if msg.contains("long-name header of") {
        format!(
            "{msg}: damaged, or extended attributes stored in the shard (macOS tar: pack again with \
             COPYFILE_DISABLE=1 or --no-xattrs)"
        )
    } else if msg.contains("entire block") {
        "the shard ends in the middle of a header: it is truncated; re-copy or re-pack it".into()
    } else if msg.contains("checksum mismatch") {
        format!("header checksum mismatch: {advice}")
    } else {
        format!("cannot parse the header ({msg}): {advice}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard of `prefix` then zeros up to `size` bytes, counting the bytes read from it.
    struct Zeros {
        prefix: Vec<u8>,
        size: u64,
        at: u64,
        read: u64,
    }

    impl Read for Zeros {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = (self.size.saturating_sub(self.at)).min(buf.len() as u64) as usize;
            for (i, b) in buf[..n].iter_mut().enumerate() {
                *b = self.prefix.get(self.at as usize + i).copied().unwrap_or(0);
            }
            self.at += n as u64;
            self.read += n as u64;
            Ok(n)
        }
    }

    impl Seek for Zeros {
        fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
            self.at = match pos {
                SeekFrom::Start(n) => n,
                SeekFrom::Current(d) => self.at.saturating_add_signed(d),
                SeekFrom::End(d) => self.size.saturating_add_signed(d),
            };
            Ok(self.at)
        }
    }

    fn header(path: &str, kind: tar::EntryType, size: u64) -> Vec<u8> {
        let mut h = tar::Header::new_ustar();
        h.set_path(path).unwrap();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_cksum();
        h.as_bytes().to_vec()
    }

    #[test]
    fn a_pax_or_long_name_header_claiming_megabytes_is_damage_not_read() {
        for kind in [tar::EntryType::XHeader, tar::EntryType::GNULongName] {
            let mut prefix = header("a.txt", tar::EntryType::Regular, 100);
            prefix.resize(1024, b'a');
            prefix.extend(header("b.txt", kind, 64 << 20));
            let size = prefix.len() as u64 + (64 << 20) + 1024;
            let info = ObjectInfo { path: "s.tar".into(), size, modified_us: 0, e_tag: None, recorded: false };
            // Strict: an error at the header, the extension's body never read (the tar crate
            // reads one whole into memory).
            let mut shard = Zeros { prefix: prefix.clone(), size, at: 0, read: 0 };
            let e = build_with(&mut shard, &info, "s.tar", Walk::default()).unwrap_err().to_string();
            assert!(e.contains("s.tar") && e.contains("PAX or long-name header of 67108864 bytes"), "{e}");
            assert!(e.contains("COPYFILE_DISABLE=1"), "{e}");
            assert!(shard.read < 1 << 20, "{} bytes read", shard.read);
            // Skipping damage: the sample before it is kept, the damage recorded.
            let mut shard = Zeros { prefix, size, at: 0, read: 0 };
            let idx = build_with(&mut shard, &info, "s.tar", Walk { skip: true, ..Walk::default() }).unwrap();
            assert_eq!(idx.keys, ["a"]);
            assert!(format!("{:?}", idx.damage).contains("PAX or long-name header"), "{:?}", idx.damage);
        }
    }

    #[test]
    fn a_payload_that_looks_like_a_long_extension_header_is_read_as_a_payload() {
        // A member (a tar inside the tar) whose 512 bytes are a valid PAX header claiming
        // 64 MiB: its checksum is read through the walk's reader, and it is data, not refused.
        let mut prefix = header("n.tar", tar::EntryType::Regular, 512);
        prefix.extend(header("inner", tar::EntryType::XHeader, 64 << 20));
        let size = prefix.len() as u64 + 1024;
        let info = ObjectInfo { path: "s.tar".into(), size, modified_us: 0, e_tag: None, recorded: false };
        let mut shard = Zeros { prefix, size, at: 0, read: 0 };
        let idx = build_with(&mut shard, &info, "s.tar", Walk { checksums: true, ..Walk::default() }).unwrap();
        assert_eq!((idx.keys.as_slice(), idx.sums.len()), (&["n".to_string()][..], 1));
    }
}
