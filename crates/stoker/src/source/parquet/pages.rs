//! Page headers checked before the Parquet reader sees them.
//!
//! The reader (parquet 60) sizes a page's decompression buffer by the `uncompressed_page_size`
//! its header claims before it decompresses a byte (apache/arrow-rs#10734): a file of a few
//! KB can ask for 2 GiB per page. Every column-chunk or page range the reader asks the store
//! for starts at a page header, so the bytes are walked here first, header by header (Thrift
//! compact protocol, [`super::thrift`]), and a page that claims more than its column chunk's whole
//! uncompressed size (a lie) or more than `decoded_bytes` allows (a decompression bomb, or a
//! page too big for the memory given) is refused before the reader allocates for it.

use super::thrift::{zigzag, Kind, Reader};

/// What a walk found wrong.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BadPage {
    /// A page claims more than the column chunk's total: the file lies.
    Lie(String),
    /// A page claims more than the budget: `decoded_bytes` would have to grow.
    OverBudget { claimed: u64, limit: u64 },
}

/// What the offset index says of a run of pages, for [`check`] to hold their headers to:
/// the rows it gives the page starting at a byte of the run (`None` where it locates no page,
/// as at a dictionary page), and whether the column is flat (only a flat column's pages give
/// rows to check: see `Header::rows_of`).
pub(super) struct Located<'a> {
    pub(super) rows_at: &'a dyn Fn(usize) -> Option<u64>,
    pub(super) flat: bool,
}

/// Walk the page headers of `data` (whole pages, a page header first): each page's
/// uncompressed size must be at most `chunk_total` (the column chunk's total) and at most
/// `limit`, its compressed bytes must lie inside `data`, and the rows it holds must be those
/// the offset index gives it (`index`): a row selection follows the index to its pages, so
/// an index that miscounts them delivers other rows than those asked for.
pub(super) fn check(data: &[u8], chunk_total: u64, limit: u64, index: Option<&Located>) -> Result<(), BadPage> {
    let mut at = 0usize;
    // The pages of a chunk add up to its total (headers aside): so do any run of them.
    let mut sum = 0u64;
    while at < data.len() {
        let h = page_header(&data[at..]).map_err(BadPage::Lie)?;
        let told = index.and_then(|ix| Some(((ix.rows_at)(at)?, h.rows_of(ix.flat)?)));
        if let Some((want, holds)) = told.filter(|&(want, holds)| u64::try_from(holds) != Ok(want)) {
            return Err(BadPage::Lie(format!(
                "the page at byte {at} of bytes read holds {holds} rows, but the offset index gives it {want}"
            )));
        }
        let (header, compressed) = (h.len, h.compressed);
        let (uncompressed, compressed) = match (u64::try_from(h.uncompressed), u64::try_from(compressed)) {
            (Ok(u), Ok(c)) => (u, c),
            _ => return Err(BadPage::Lie(format!("a page header at byte {at} of a range claims a negative size"))),
        };
        sum = sum.saturating_add(uncompressed);
        if sum > chunk_total {
            return Err(BadPage::Lie(format!(
                "its pages claim {sum} bytes uncompressed or more, more than its whole column chunk's {chunk_total}"
            )));
        }
        if uncompressed > limit {
            return Err(BadPage::OverBudget { claimed: uncompressed, limit });
        }
        at = at
            .checked_add(header)
            .and_then(|a| a.checked_add(usize::try_from(compressed).ok()?))
            .filter(|&end| end <= data.len())
            .ok_or_else(|| BadPage::Lie(format!("a page of {compressed} bytes runs past the bytes read")))?;
    }
    Ok(())
}

/// The page header at the start of a column chunk's bytes: its length, whether the page is
/// a dictionary page, and the compressed size it claims (the uncompressed one is [`check`]'s).
pub(super) struct First {
    pub(super) header: usize,
    pub(super) dictionary: bool,
    pub(super) compressed: u64,
}

/// The rows the data page whose header starts `b` claims to hold (see [`Header::rows_of`]);
/// `None` also for a header cut short in `b`.
pub(super) fn rows_claimed(b: &[u8], flat: bool) -> Option<i64> {
    page_header(b).ok()?.rows_of(flat)
}

/// The page header at the start of `b` (a column chunk's first bytes, enough to hold it).
pub(super) fn first(b: &[u8]) -> Result<First, String> {
    let h = page_header(b)?;
    match (u64::try_from(h.uncompressed), u64::try_from(h.compressed)) {
        // PageType DICTIONARY_PAGE is 2.
        (Ok(_), Ok(compressed)) => Ok(First { header: h.len, dictionary: h.ty == 2, compressed }),
        _ => Err("the first page header of a column chunk claims a negative size".into()),
    }
}

/// What a page header claims: its length, the page type, the uncompressed and compressed
/// sizes (PageHeader fields 1, 2 and 3), and a data page's value count (v1, field 5's field
/// 1) or row count (v2, field 8's field 3).
struct Header {
    len: usize,
    ty: i32,
    uncompressed: i64,
    compressed: i64,
    values: Option<i64>,
    rows: Option<i64>,
}

impl Header {
    /// The rows this data page holds, in a flat column (a v1 page counts one value, null or
    /// not, per row; a v2 page gives its rows). `None` for a repeated column (a v1 page counts
    /// values, and pyarrow before 12 wrote a v2 page's values as its rows) or another page.
    fn rows_of(&self, flat: bool) -> Option<i64> {
        flat.then(|| self.rows.or(self.values)).flatten()
    }
}

/// The page header at the start of `b`, read as the parquet crate reads it: a known field
/// declared as another type than Parquet's is refused ([`Reader::skip_field`]).
fn page_header(b: &[u8]) -> Result<Header, String> {
    let mut r = Reader::new(b, "a page header");
    let (mut ty, mut uncompressed, mut compressed, mut values, mut rows) = (-1, None, None, None, None);
    let mut last = 0i16;
    while let Some((id, t)) = r.field(last)? {
        last = id;
        match (id, t) {
            (1, 5) => ty = zigzag(r.varint()?) as i32,
            (2, 5) => uncompressed = Some(i64::from(zigzag(r.varint()?) as i32)),
            (3, 5) => compressed = Some(i64::from(zigzag(r.varint()?) as i32)),
            // DataPageHeader, DataPageHeaderV2: the count this walk checks, the rest skipped.
            (5 | 8, 12) => {
                let (kind, want) = if id == 5 { (Kind::DataPage, 1) } else { (Kind::DataPageV2, 3) };
                let mut last = 0i16;
                while let Some((sub, st)) = r.field(last)? {
                    last = sub;
                    match (sub == want, st) {
                        (true, 5) => {
                            let n = Some(i64::from(zigzag(r.varint()?) as i32));
                            if id == 5 {
                                values = n
                            } else {
                                rows = n
                            }
                        }
                        _ => r.skip_field(kind, sub, st, 1)?,
                    }
                }
            }
            _ => r.skip_field(Kind::PageHeader, id, t, 0)?,
        }
    }
    // The crate reads the header its page type names (DATA_PAGE 0, DATA_PAGE_V2 3).
    let (values, rows) = (values.filter(|_| ty == 0), rows.filter(|_| ty == 3));
    match (uncompressed, compressed) {
        (Some(uncompressed), Some(compressed)) => Ok(Header { len: r.at, ty, uncompressed, compressed, values, rows }),
        _ => Err("a page header without its sizes (not a Parquet page)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::thrift::put_varint as varint;
    use super::*;

    fn zz(v: i64) -> u64 {
        ((v << 1) ^ (v >> 63)) as u64
    }

    /// A page header as parquet writes one (type, sizes, crc, a data page header with a
    /// statistics struct holding binaries), then `compressed` bytes of payload.
    fn page(uncompressed: i64, compressed: i64) -> Vec<u8> {
        let mut h = Vec::new();
        h.push(0x15); // field 1, i32: type
        varint(zz(0), &mut h);
        h.push(0x15); // field 2, i32
        varint(zz(uncompressed), &mut h);
        h.push(0x15); // field 3, i32
        varint(zz(compressed), &mut h);
        h.push(0x15); // field 4, i32: crc
        varint(zz(-7), &mut h);
        h.push(0x1c); // field 5, struct: data page header
        h.push(0x15); // num_values
        varint(zz(100), &mut h);
        h.push(0x15); // encoding
        varint(zz(0), &mut h);
        h.push(0x15);
        varint(zz(3), &mut h);
        h.push(0x15);
        varint(zz(3), &mut h);
        h.push(0x1c); // field 5: statistics
        h.push(0x18); // binary max
        varint(3, &mut h);
        h.extend_from_slice(b"zzz");
        h.push(0x18); // binary min
        varint(1, &mut h);
        h.extend_from_slice(b"a");
        h.push(0x79); // field 9, a list of 2 i32 (a field Parquet does not know)
        h.push(0x25);
        varint(zz(1), &mut h);
        varint(zz(2), &mut h);
        h.push(0);
        h.push(0);
        h.push(0);
        h.extend(std::iter::repeat_n(9u8, usize::try_from(compressed.max(0)).unwrap()));
        h
    }

    #[test]
    fn pages_are_walked_and_held_to_their_chunk_and_the_budget() {
        let data = [page(100, 10), page(50, 20), page(0, 0)].concat();
        assert_eq!(check(&data, 150, 1 << 20, None), Ok(()));
        assert!(matches!(check(&data, 120, 1 << 20, None), Err(BadPage::Lie(w)) if w.contains("more than its whole")));
        assert!(matches!(check(&page(200, 0), 150, 1 << 20, None), Err(BadPage::Lie(_))), "one page over the chunk");
        assert_eq!(check(&data, 150, 60, None), Err(BadPage::OverBudget { claimed: 100, limit: 60 }));
        // A page whose payload runs past the range, a negative size, a header cut short.
        let long = page(10, 1000);
        assert!(matches!(check(&long[..200], 10, 100, None), Err(BadPage::Lie(_))));
        assert!(matches!(check(&page(-5, 0), 10, 100, None), Err(BadPage::Lie(_))));
        let p = page(10, 0);
        for cut in 1..p.len() {
            assert!(check(&p[..cut], 10, 100, None).is_err(), "cut at {cut}");
        }
        // The 2 GiB a few bytes can claim.
        assert!(matches!(
            check(&page(i64::from(i32::MAX), 4), u64::MAX, 1 << 30, None),
            Err(BadPage::OverBudget { .. })
        ));
        assert!(check(b"\x19\xff\xff\xff\xff\x0f", 10, 10, None).is_err(), "a huge list count");
        // A field id near i64::MAX (a long zigzag varint) then a delta: an error, not an
        // overflow (found by the `parquet_pages` fuzz target).
        let mut huge = vec![0x05];
        varint(u64::MAX - 1, &mut huge); // zigzag: i64::MAX
        huge.extend([0x00, 0x15, 0x02, 0x00]); // its value, then field +1: past i64::MAX
        assert!(check(&huge, 10, 10, None).is_err());
    }

    #[test]
    fn pages_hold_the_rows_the_offset_index_gives_them() {
        // Each `page` holds 100 values (a v1 data page): the second starts after the first's
        // header and 10 bytes.
        let (a, b) = (page(100, 10), page(50, 20));
        let data = [a.clone(), b].concat();
        let second = a.len();
        let index = |first: u64, second_rows: u64| {
            move |at: usize| match at {
                0 => Some(first),
                x if x == second => Some(second_rows),
                _ => None,
            }
        };
        let (right, shifted) = (index(100, 100), index(102, 100));
        let at =
            |f: &dyn Fn(usize) -> Option<u64>, flat| check(&data, 150, 1 << 20, Some(&Located { rows_at: f, flat }));
        assert_eq!(at(&right, true), Ok(()));
        assert!(
            matches!(at(&shifted, true), Err(BadPage::Lie(w)) if w.contains("holds 100 rows, but the offset index gives it 102"))
        );
        assert!(matches!(at(&index(100, 98), true), Err(BadPage::Lie(w)) if w.contains(&format!("byte {second}"))));
        // A repeated column's v1 page counts values, not rows: nothing to hold it to.
        assert_eq!(at(&shifted, false), Ok(()));
        // Pages the index does not locate (a dictionary page) are not held to it.
        assert_eq!(at(&|_| None, true), Ok(()));
    }
}
