//! A walk of `data.mdb`'s B-tree with plain reads before LMDB maps it.
//!
//! LMDB trusts every page it reads: a page header with a damaged node count or node offset
//! sends it to read outside its map (SIGSEGV), and a branch naming a page past the file's end
//! touches unbacked map (SIGBUS); either ends the process with no error to report. So the
//! main database's branch and leaf pages are read here first, by offset from the file, and
//! every number LMDB would follow is checked: each page's own number and kind, its node
//! table, each node's key within the page, each child within the file, and no page reached
//! twice. Values are not read (each is checked against the file when its sample is read);
//! the pages walked are those LMDB's own key listing at open reads.

use std::os::unix::fs::FileExt;

use super::{lmdb_err, Meta};
use crate::error::{Error, Result};

/// LMDB's page header: page number (8 bytes), pad (2), flags (2), then lower and upper
/// bounds of free space (2 + 2), or an overflow run's page count (4).
const PAGE_HEADER: usize = 16;
/// A node's header: data size (or a branch's child page) in two u16 halves, flags, key size.
const NODE_HEADER: usize = 8;
const P_BRANCH: u16 = 0x01;
const P_LEAF: u16 = 0x02;
/// Bits that may be set on a page on disk besides its kind.
const P_HOUSEKEEPING: u16 = 0x10 | 0x4000 | 0x8000;
/// The data of a leaf node with this flag is the first page of an overflow run.
const F_BIGDATA: u16 = 0x01;
/// The value of a leaf node with this flag is a sub-database of duplicates: only in a
/// database opened with MDB_DUPSORT.
const F_DUPDATA: u16 = 0x04;
/// A database's flag (in the meta page's record of it) for sorted duplicates.
const MDB_DUPSORT: u16 = 0x04;
/// An empty database's root.
const P_INVALID: u64 = u64::MAX;

/// Check the main database's tree of `data.mdb` (opened as `f`) as `meta` describes it.
pub(super) fn check(path: &std::path::Path, f: &std::fs::File, meta: &Meta) -> Result<()> {
    if meta.root == P_INVALID {
        return Ok(());
    }
    let psize = meta.psize as usize;
    let pages = meta.last_page + 1;
    let bad = |pgno: u64, why: String| -> Error {
        lmdb_err(path, format!("data.mdb page {pgno} is damaged ({why}): the file is damaged; copy it again"))
    };
    // One bit a page, so that a damaged child pointing back up cannot loop the walk.
    let mut seen = vec![0u64; usize::try_from(pages.div_ceil(64)).map_err(|_| bad(0, "too many pages".into()))?];
    let mut page = vec![0u8; psize];
    let mut stack = vec![(meta.root, 0u32)];
    while let Some((pgno, depth)) = stack.pop() {
        if pgno < 2 || pgno >= pages {
            return Err(bad(pgno, format!("a branch points to page {pgno}, outside pages 2 to {}", pages - 1)));
        }
        let (word, bit) = ((pgno / 64) as usize, 1u64 << (pgno % 64));
        if seen[word] & bit != 0 {
            return Err(bad(pgno, "two branches point to it".into()));
        }
        seen[word] |= bit;
        // LMDB's cursors hold 32 levels; a deeper tree is a damaged one.
        if depth >= 32 {
            return Err(bad(pgno, "the tree is more than 32 levels deep".into()));
        }
        f.read_exact_at(&mut page, pgno * meta.psize)
            .map_err(|e| lmdb_err(path, format!("reading page {pgno}: {e}")))?;
        let u16_at = |o: usize| u16::from_le_bytes([page[o], page[o + 1]]);
        let own = u64::from_le_bytes(page[..8].try_into().unwrap_or_default());
        if own != pgno {
            return Err(bad(pgno, format!("it says it is page {own}")));
        }
        let kind = u16_at(10) & !P_HOUSEKEEPING;
        let (lower, upper) = (u16_at(12) as usize, u16_at(14) as usize);
        if (kind != P_BRANCH && kind != P_LEAF)
            || lower < PAGE_HEADER
            || lower % 2 != 0
            || lower > upper
            || upper > psize
        {
            return Err(bad(pgno, format!("flags {:#x}, node table to {lower}, nodes from {upper}", u16_at(10))));
        }
        let nodes = (lower - PAGE_HEADER) / 2;
        if nodes == 0 {
            return Err(bad(pgno, "no nodes".into()));
        }
        for n in 0..nodes {
            let at = u16_at(PAGE_HEADER + 2 * n) as usize;
            if at < upper || at + NODE_HEADER > psize {
                return Err(bad(pgno, format!("node {n} at {at}, outside the page's nodes ({upper} to {psize})")));
            }
            let (lo, hi, flags, ksize) =
                (u16_at(at) as u64, u16_at(at + 2) as u64, u16_at(at + 4), u16_at(at + 6) as usize);
            // A leaf's value is not checked here: LMDB does not follow its size or place while
            // it lists the keys, and a value is checked against the file when it is read (a
            // damaged one is then that sample's error; the others still read). Of a value in
            // an overflow run, LMDB reads the run's first page number from the node.
            // A duplicates node in a database without duplicates makes LMDB's cursor open a
            // sub-database that is not there (a SIGSEGV).
            if kind == P_LEAF && flags & F_DUPDATA != 0 && meta.db_flags & MDB_DUPSORT == 0 {
                return Err(bad(pgno, format!("node {n} is marked as duplicates in a database without them")));
            }
            let named = if kind == P_LEAF && flags & F_BIGDATA != 0 { 8 } else { 0 };
            if at + NODE_HEADER + ksize + named > psize {
                return Err(bad(pgno, format!("node {n}'s key of {ksize} bytes runs past the page")));
            }
            if kind == P_BRANCH {
                stack.push((lo | hi << 16 | u64::from(flags) << 32, depth + 1));
            }
        }
    }
    Ok(())
}
