//! Local files mapped into memory, for a reader that cuts many small spans out of one file per
//! batch (token documents: a shuffled epoch reads one span of ~1-2 KiB per document). A
//! `pread` per span costs a system call and a page-cache lookup each (about 1.5 µs on the
//! project's VM, a third of what the copy itself costs); a span of a mapping is a `memcpy`.
//!
//! What a mapping gives up, and what is kept: every read still checks that the file has the
//! size it was listed at, so a file cut, grown or replaced at another size between batches is
//! [`Error::Changed`], never other bytes at the indexed offsets; one replaced at the same size
//! goes on being read from the bytes mapped. The check is a seek to the end of the file held
//! open (0.15 µs on the project's VM), with a `stat` of its path (1.25 µs: the walk of the path)
//! every [`PATH_EVERY`]th read: a cut of the mapped file is seen at the next read, a file
//! renamed over it within [`PATH_EVERY`] (until then the bytes read are the mapped file's, the
//! ones indexed). A quarter of the process's descriptor limit at most is held
//! ([`held_budget`]): past it, a corpus of many files costs maps, not open files, and each read
//! of the rest checks the path. A file cut *while* a batch copies from it is the one case a
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
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use super::{Backend, Object, Store};
use crate::error::{Error, Result};

/// A local object mapped read-only for the life of its reader. Made by [`Store::map_local`].
pub(crate) struct MappedObject {
    store: Store,
    obj: Object,
    /// The file's path, for the size check of every read without `held`, and every
    /// [`PATH_EVERY`]th with it.
    path: std::path::PathBuf,
    /// The file held open (see the module docs), while the budget allows.
    held: Option<Held>,
    /// Reads so far, for [`PATH_EVERY`].
    reads: AtomicU32,
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
        Ok(MappedObject {
            store: self.clone(),
            obj: obj.clone(),
            path: full,
            held: hold(file),
            reads: AtomicU32::new(0),
            map,
        })
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
        let shown = || self.store.describe(self.obj.path());
        match &self.held {
            Some(Held(file)) if !self.reads.fetch_add(1, Relaxed).is_multiple_of(PATH_EVERY) => {
                super::local::end_held_to(file, shown, self.obj.size())?
            }
            _ => super::local::path_held_to(&self.path, shown, self.obj.size())?,
        }
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

/// A mapped file held open counts against [`held_budget`] until it is dropped.
struct Held(std::fs::File);

impl Drop for Held {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Relaxed);
    }
}

/// Mapped files held open in this process.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// `file` held, if the process holds fewer than [`held_budget`] mapped files.
fn hold(file: std::fs::File) -> Option<Held> {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    let budget = *BUDGET.get_or_init(|| {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the struct it is given, nothing else.
        let soft = (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit.rlim_cur);
        held_budget(soft)
    });
    HELD.fetch_update(Relaxed, Relaxed, |n| (n < budget).then_some(n + 1)).ok().map(|_| Held(file))
}

/// How many mapped files a process may hold open under a soft descriptor limit of `soft`
/// (unknown: 1,024, Linux's usual): a quarter of it, at most 4,096, so the rest of the
/// process (sockets, a DataLoader's pipes, other files) keeps three quarters.
fn held_budget(soft: Option<u64>) -> usize {
    (soft.unwrap_or(1024) / 4).min(4096) as usize
}

/// A held file's path is checked every this many reads (see the module docs).
const PATH_EVERY: u32 = 16;

/// How many spans ahead [`MappedObject::spans`] prefetches (4 was the best of 1, 2 and 4).
const AHEAD: usize = 4;
/// At most this much of a span is prefetched: past it, the hardware prefetcher has found the
/// stream.
const PREFETCH_CAP: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    /// A file renamed over a held one is seen at the next check of the path, the reads until
    /// then getting the mapped file's bytes (the ones indexed); without a held file, at the
    /// next read. A cut of the held file is seen at once (the test below).
    #[tokio::test]
    async fn a_file_renamed_over_a_mapped_one_is_changed_within_path_every_reads() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..4_096u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("t.bin"), &data).unwrap();
        let s = Store::local(dir.path()).unwrap();
        let obj = s.open_object("t.bin").await.unwrap();
        let (held, mut unheld) =
            (s.map_local(&obj, MapAdvice::default()).unwrap(), s.map_local(&obj, MapAdvice::default()).unwrap());
        assert!(held.held.is_some(), "two descriptors are within any budget");
        unheld.held = None;
        let read = |m: &MappedObject| {
            m.spans(std::slice::from_ref(&(0..8)), |b| {
                assert_eq!(b, &data[..8], "the mapped file's bytes");
                Ok(())
            })
        };
        read(&held).unwrap(); // read 0: the path's check
        std::fs::write(dir.path().join("new"), vec![7u8; 100]).unwrap();
        std::fs::rename(dir.path().join("new"), dir.path().join("t.bin")).unwrap();
        assert!(matches!(read(&unheld), Err(Error::Changed { .. })));
        for i in 1..PATH_EVERY {
            read(&held).unwrap_or_else(|e| panic!("read {i}: {e}"));
        }
        assert!(matches!(read(&held), Err(Error::Changed { .. })), "read {PATH_EVERY}: the path's check");
    }

    #[test]
    fn a_quarter_of_the_descriptor_limit_is_held_at_most() {
        assert_eq!(held_budget(Some(1024)), 256);
        assert_eq!(held_budget(None), 256);
        assert_eq!(held_budget(Some(8)), 2);
        assert_eq!(held_budget(Some(u64::MAX)), 4096);
    }

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
