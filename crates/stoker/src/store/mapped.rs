//! Local files mapped into memory, for a reader that cuts many small spans out of one file per
//! batch (token documents: a shuffled epoch reads one span of ~1-2 KiB per document). A
//! `pread` per span costs a system call and a page-cache lookup each (about 1.5 µs on the
//! project's VM, a third of what the copy itself costs); a span of a mapping is a `memcpy`.
//!
//! What a mapping gives up, and what is kept: every read still checks that the path has the
//! size the file was listed at (a `stat`; a reader groups its spans by file, so one per file
//! per batch), so a file cut, grown or replaced at another size between batches is
//! [`Error::Changed`], never other bytes at the indexed offsets; one replaced at the same size
//! goes on being read from the bytes mapped. No descriptor is held: a corpus of many files
//! costs maps, not open files. A file cut *while* a batch copies from it is the one case a
//! `pread` would report and a mapping cannot: touching a page past a file's new end raises
//! `SIGBUS` (as for numpy's `memmap`, Megatron's and nanoGPT's readers, and Arrow's
//! memory-mapped files); `docs/reliability.md` says so.
//!
//! A reader whose files fit in memory asks for them in huge pages (`MADV_HUGEPAGE`, unless
//! the machine has transparent huge pages turned off): spans
//! at random places of a file each cost a TLB miss through 4 KiB pages (two-dimensional page
//! walks on a VM), and file pages faulted in at random through a plain map land in the page
//! cache as 4 KiB folios for good, where read-ahead for an advised map brings 2 MiB ones,
//! mapped whole. On the project's VM, a 1 GB corpus evicted and then read by a shuffled
//! loader (three alternating rounds): its later epochs went from 1.48-1.65 to 1.56-1.81 G
//! tokens/s in batches of 8 rows and from 1.69-2.31 to 2.48-2.72 in batches of 64; a plain
//! `read` of the page cache the loader left, from 2.47-2.85 to 2.92-3.13. A file already in
//! the page cache keeps the folios it has. Where the files do not fit, each fault would read
//! 2-4 MiB where a document needs 2 KiB: plain pages there.

use std::ops::Range;

use super::{Backend, Object, Store};
use crate::error::{Error, Result};

/// A local object mapped read-only for the life of its reader. Made by [`Store::map_local`].
pub(crate) struct MappedObject {
    store: Store,
    obj: Object,
    /// The file's path, for the size check of every read.
    path: std::path::PathBuf,
    /// `None` for an empty file (a zero-length mapping is refused by the kernel).
    map: Option<memmap2::Mmap>,
}

/// How a reader's files are to be mapped (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MapAdvice {
    /// Ask for huge pages.
    pub(crate) huge_pages: bool,
}

impl MapAdvice {
    /// The advice for a reader that maps files of `bytes` in all: huge pages where they fit
    /// in half the memory this process may use (the machine's, or its cgroup's limit), so
    /// the page cache holds them and what the reader does not map.
    /// Not where the machine's administrator turned transparent huge pages off (`never`).
    pub(crate) fn for_files(bytes: u64) -> Self {
        let allowed = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|mode| huge_pages_allowed(&mode));
        MapAdvice { huge_pages: allowed && crate::memory::memory_bytes().is_some_and(|m| fits_huge(bytes, m)) }
    }
}

/// Whether a `transparent_hugepage/enabled` setting (`always [madvise] never`: the one in
/// brackets is in force) lets a map advised so have huge pages.
fn huge_pages_allowed(mode: &str) -> bool {
    mode.contains("[always]") || mode.contains("[madvise]")
}

/// Huge pages for `bytes` of files in `memory`: at least one huge page's worth, at most half.
fn fits_huge(bytes: u64, memory: u64) -> bool {
    (HUGE_PAGE..=memory / 2).contains(&bytes)
}

/// The size of a huge page of a file's map (x86-64's and aarch64's 2 MiB with 4 KiB pages).
const HUGE_PAGE: u64 = 2 << 20;

impl Store {
    /// Map local `obj` read-only, as `advice` says (see the module docs); a remote store is
    /// refused. The file must still have the size `obj` was listed at.
    pub(crate) fn map_local(&self, obj: &Object, advice: MapAdvice) -> Result<MappedObject> {
        let Backend::Local(l) = &self.0.backend else {
            return Err(Error::internal("map_local on a remote store"));
        };
        let shown = || self.describe(obj.path());
        let full = l.file(&self.obj_path(obj.path()))?;
        let file = super::local::open_sized(&full, shown, Some(obj.size()))?;
        let map = match obj.size() {
            0 => None,
            // SAFETY: the mapping is read-only and only read through `MappedObject::spans`,
            // which checks the file's size first and hands out the bytes for the length of one
            // call. Another process cutting the file during a call raises SIGBUS (see the
            // module docs); one writing the bytes in place changes the data read, not the
            // memory's validity (a token read twice, to check it and to convert it, may then
            // differ between the two: a damaged value, not unsafety).
            _ => Some(
                unsafe { memmap2::MmapOptions::new().len(obj.size() as usize).map(&file) }
                    .map_err(|e| Error::resource(format!("a memory map of {}", shown()), e))?,
            ),
        };
        #[cfg(target_os = "linux")]
        if let (Some(m), true) = (&map, advice.huge_pages) {
            // Advice only: a kernel without transparent huge pages for files maps 4 KiB pages.
            let _ = m.advise(memmap2::Advice::HugePage);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = advice;
        Ok(MappedObject { store: self.clone(), obj: obj.clone(), path: full, map })
    }
}

impl MappedObject {
    /// Check that the file still has its listed size ([`Error::Changed`] otherwise), then give
    /// `each` the bytes of every span in turn (counted as the store's reads). A span past the
    /// object's end is an error naming it, as for every read of the store.
    ///
    /// The bytes of the spans [`AHEAD`] places ahead are asked of the memory system while
    /// `each` works on the current one: spans cut from random places in a file start with a
    /// cache miss (and often a TLB miss) each, which the hardware's prefetcher, following
    /// one stream at a time, does not hide. On the project's VM this took a shuffled epoch's
    /// widening copy from 2.4 to 4.3 G tokens/s a core.
    pub(crate) fn spans(&self, spans: &[Range<u64>], mut each: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
        super::local::path_held_to(&self.path, || self.store.describe(self.obj.path()), self.obj.size())?;
        // A span past the end is damage (an index that lies), as for every read of the store.
        self.store.within(&self.obj, spans)?;
        let bytes: &[u8] = self.map.as_deref().unwrap_or(&[]);
        let slice = |s: &Range<u64>| {
            usize::try_from(s.start).ok().zip(usize::try_from(s.end).ok()).and_then(|(a, z)| bytes.get(a..z))
        };
        for s in spans.iter().take(AHEAD) {
            if let Some(b) = slice(s) {
                crate::prefetch::lines(b, PREFETCH_CAP);
            }
        }
        let mut total = 0u64;
        for (i, s) in spans.iter().enumerate() {
            let Some(b) = slice(s) else {
                return Err(Error::internal(format!("bytes {s:?} of a map of {} bytes", bytes.len())));
            };
            if let Some(b) = spans.get(i + AHEAD).and_then(slice) {
                crate::prefetch::lines(b, PREFETCH_CAP);
            }
            each(b)?;
            total += b.len() as u64;
        }
        self.store.count(spans.len() as u64, total);
        Ok(())
    }
}

/// How many spans ahead [`MappedObject::spans`] prefetches (4 was the best of 1, 2 and 4).
const AHEAD: usize = 4;
/// At most this much of a span is prefetched: past it, the hardware prefetcher has found the
/// stream.
const PREFETCH_CAP: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn spans_of_a_mapping_are_the_files_bytes_and_a_cut_file_is_changed() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("t.bin"), &data).unwrap();
        let s = Store::local(dir.path()).unwrap();
        let m = s.map_local(&s.open_object("t.bin").await.unwrap(), MapAdvice::default()).unwrap();
        let mut got = Vec::new();
        m.spans(&[10..20, 9_990..10_000, 5..5], |b| {
            got.push(b.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(got, vec![data[10..20].to_vec(), data[9_990..].to_vec(), vec![]]);
        assert_eq!(s.counters().requests, 3);
        let past = m.spans(std::slice::from_ref(&(9_995..10_001)), |_| Ok(())).unwrap_err();
        assert!(past.to_string().contains("t.bin"), "{past}");
        // Cut between batches: the next batch's check refuses it before any byte is touched.
        std::fs::File::options().write(true).open(dir.path().join("t.bin")).unwrap().set_len(5_000).unwrap();
        let cut = m.spans(std::slice::from_ref(&(0..10)), |_| panic!("no byte of a cut file is read")).unwrap_err();
        assert!(matches!(cut, Error::Changed { .. }), "{cut:?}");
    }

    #[tokio::test]
    async fn an_empty_file_maps_and_serves_only_empty_spans() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("e.bin"), b"").unwrap();
        let s = Store::local(dir.path()).unwrap();
        let m = s.map_local(&s.open_object("e.bin").await.unwrap(), MapAdvice { huge_pages: true }).unwrap();
        m.spans(std::slice::from_ref(&(0..0)), |b| {
            assert!(b.is_empty());
            Ok(())
        })
        .unwrap();
        assert!(m.spans(std::slice::from_ref(&(0..1)), |_| Ok(())).is_err());
    }

    /// The flags (`VmFlags`) of the mapping of this process that holds `addr`.
    #[cfg(target_os = "linux")]
    fn vm_flags_at(addr: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
            if let Some((a, z)) = range.filter(|(a, _)| a.chars().all(|c| c.is_ascii_hexdigit())) {
                let (a, z) = (usize::from_str_radix(a, 16).unwrap(), usize::from_str_radix(z, 16).unwrap());
                inside = (a..z).contains(&addr);
            } else if let (true, Some(flags)) = (inside, line.strip_prefix("VmFlags:")) {
                return flags.split_whitespace().map(str::to_string).collect();
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_map_asks_for_huge_pages_only_when_advised_to() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 241) as u8).collect();
        std::fs::write(dir.path().join("h.bin"), &data).unwrap();
        let s = Store::local(dir.path()).unwrap();
        let obj = s.open_object("h.bin").await.unwrap();
        for huge in [true, false] {
            let m = s.map_local(&obj, MapAdvice { huge_pages: huge }).unwrap();
            let addr = m.map.as_deref().unwrap().as_ptr() as usize;
            // `hg`: the map was advised MADV_HUGEPAGE (which a kernel built without
            // transparent huge pages refuses: the advice is a hint).
            let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
            assert_eq!(vm_flags_at(addr).iter().any(|f| f == "hg"), huge && thp, "{:?}", vm_flags_at(addr));
            let mut got = Vec::new();
            m.spans(std::slice::from_ref(&(3_000_000..3_000_100)), |b| {
                got.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
            assert_eq!(got, data[3_000_000..3_000_100]);
        }
    }

    #[test]
    fn huge_pages_are_asked_for_files_that_fit_in_half_the_memory_unless_turned_off() {
        let gib = 1u64 << 30;
        assert!(fits_huge(gib, 4 * gib));
        assert!(fits_huge(2 * gib, 4 * gib));
        assert!(!fits_huge(2 * gib + 1, 4 * gib), "more than half the memory");
        assert!(!fits_huge(HUGE_PAGE - 1, 4 * gib), "less than one huge page");
        assert!(!fits_huge(HUGE_PAGE, 0));
        assert!(huge_pages_allowed("always [madvise] never\n"));
        assert!(huge_pages_allowed("[always] madvise never\n"));
        assert!(!huge_pages_allowed("always madvise [never]\n"));
        assert!(!huge_pages_allowed(""));
    }
}
