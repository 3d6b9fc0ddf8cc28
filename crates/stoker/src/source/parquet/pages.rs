//! Page headers checked before the Parquet reader sees them.
//!
//! The reader (parquet 60) sizes a page's decompression buffer by the `uncompressed_page_size`
//! its header claims before it decompresses a byte (apache/arrow-rs#10734): a file of a few
//! KB can ask for 2 GiB per page. Every column-chunk or page range the reader asks the store
//! for starts at a page header, so the bytes are walked here first, header by header (Thrift
//! compact protocol), and a page that claims more than its column chunk's whole
//! uncompressed size (a lie) or more than `decoded_bytes` allows (a decompression bomb, or a
//! page too big for the memory given) is refused before the reader allocates for it.

/// What a walk found wrong.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BadPage {
    /// A page claims more than the column chunk's total: the file lies.
    Lie(String),
    /// A page claims more than the budget: `decoded_bytes` would have to grow.
    OverBudget { claimed: u64, limit: u64 },
}

/// Walk the page headers of `data` (whole pages, a page header first): each page's
/// uncompressed size must be at most `chunk_total` (the column chunk's total) and at most
/// `limit`, and its compressed bytes must lie inside `data`.
pub(super) fn check(data: &[u8], chunk_total: u64, limit: u64) -> Result<(), BadPage> {
    let mut at = 0usize;
    // The pages of a chunk add up to its total (headers aside): so do any run of them.
    let mut sum = 0u64;
    while at < data.len() {
        let (header, _, uncompressed, compressed) = page_header(&data[at..]).map_err(BadPage::Lie)?;
        let (uncompressed, compressed) = match (u64::try_from(uncompressed), u64::try_from(compressed)) {
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

/// The page header at the start of `b` (a column chunk's first bytes, enough to hold it).
pub(super) fn first(b: &[u8]) -> Result<First, String> {
    let (header, ty, uncompressed, compressed) = page_header(b)?;
    match (u64::try_from(uncompressed), u64::try_from(compressed)) {
        // PageType DICTIONARY_PAGE is 2.
        (Ok(_), Ok(compressed)) => Ok(First { header, dictionary: ty == 2, compressed }),
        _ => Err("the first page header of a column chunk claims a negative size".into()),
    }
}

/// The length of the page header at the start of `b`, the page type and the uncompressed
/// and compressed sizes it claims (PageHeader fields 1, 2 and 3).
fn page_header(b: &[u8]) -> Result<(usize, i64, i64, i64), String> {
    let mut r = Reader { b, at: 0 };
    let (mut page_type, mut uncompressed, mut compressed) = (-1, None, None);
    let mut last = 0i64;
    loop {
        let byte = r.byte()?;
        if byte == 0 {
            break;
        }
        let (delta, ty) = (byte >> 4, byte & 0x0f);
        // Saturating: a lying id (a huge one, then deltas) only fails to match a field.
        let id = if delta == 0 { zigzag(r.varint()?) } else { last.saturating_add(i64::from(delta)) };
        last = id;
        match (id, ty) {
            (1, 5) => page_type = zigzag(r.varint()?),
            (2, 5) => uncompressed = Some(zigzag(r.varint()?)),
            (3, 5) => compressed = Some(zigzag(r.varint()?)),
            _ => r.skip(ty, 0)?,
        }
    }
    match (uncompressed, compressed) {
        (Some(u), Some(c)) => Ok((r.at, page_type, u, c)),
        _ => Err("a page header without its sizes (not a Parquet page)".into()),
    }
}

fn zigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A Thrift compact-protocol reader over a byte slice, bounded: every length is checked
/// against the bytes left, and nesting is limited.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

const MAX_DEPTH: u32 = 16;

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let v = *self.b.get(self.at).ok_or("a page header is cut short")?;
        self.at += 1;
        Ok(v)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = self.byte()?;
            v |= u64::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a page header holds an overlong number".into())
    }

    fn advance(&mut self, n: u64) -> Result<(), String> {
        let n = usize::try_from(n).map_err(|_| "a page header claims too long a field")?;
        self.at =
            self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or("a page header field runs past its end")?;
        Ok(())
    }

    /// Skip one value of compact type `ty`.
    fn skip(&mut self, ty: u8, depth: u32) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("a page header nests too deep".into());
        }
        match ty {
            1 | 2 => Ok(()),
            3 => self.advance(1),
            4..=6 => self.varint().map(|_| ()),
            7 => self.advance(8),
            8 => {
                let n = self.varint()?;
                self.advance(n)
            }
            9 | 10 => {
                let h = self.byte()?;
                let n = if h >> 4 == 15 { self.varint()? } else { u64::from(h >> 4) };
                self.skip_many(n, h & 0x0f, depth)
            }
            11 => {
                let n = self.varint()?;
                if n == 0 {
                    return Ok(());
                }
                let kv = self.byte()?;
                if n.saturating_mul(2) > (self.b.len() - self.at) as u64 {
                    return Err("a page header claims more entries than it has bytes".into());
                }
                for _ in 0..n {
                    self.skip(kv >> 4, depth + 1)?;
                    self.skip(kv & 0x0f, depth + 1)?;
                }
                Ok(())
            }
            12 => {
                let mut last = 0i64;
                loop {
                    let byte = self.byte()?;
                    if byte == 0 {
                        return Ok(());
                    }
                    let (delta, t) = (byte >> 4, byte & 0x0f);
                    last = if delta == 0 { zigzag(self.varint()?) } else { last.saturating_add(i64::from(delta)) };
                    self.skip(t, depth + 1)?;
                }
            }
            _ => Err(format!("a page header holds an unknown Thrift type {ty}")),
        }
    }

    /// Skip `n` elements of type `ty` (a list's): at least one byte each, so a count past
    /// the bytes left is refused before the loop.
    fn skip_many(&mut self, n: u64, ty: u8, depth: u32) -> Result<(), String> {
        if n > (self.b.len() - self.at) as u64 {
            return Err("a page header claims more elements than it has bytes".into());
        }
        for _ in 0..n {
            match ty {
                // A list's booleans are one byte each.
                1 | 2 => self.advance(1)?,
                t => self.skip(t, depth + 1)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

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
        h.push(0x19); // a list of 2 i32 (a field this walk does not know)
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
        assert_eq!(check(&data, 150, 1 << 20), Ok(()));
        assert!(matches!(check(&data, 120, 1 << 20), Err(BadPage::Lie(w)) if w.contains("more than its whole")));
        assert!(matches!(check(&page(200, 0), 150, 1 << 20), Err(BadPage::Lie(_))), "one page over the chunk");
        assert_eq!(check(&data, 150, 60), Err(BadPage::OverBudget { claimed: 100, limit: 60 }));
        // A page whose payload runs past the range, a negative size, a header cut short.
        let long = page(10, 1000);
        assert!(matches!(check(&long[..200], 10, 100), Err(BadPage::Lie(_))));
        assert!(matches!(check(&page(-5, 0), 10, 100), Err(BadPage::Lie(_))));
        let p = page(10, 0);
        for cut in 1..p.len() {
            assert!(check(&p[..cut], 10, 100).is_err(), "cut at {cut}");
        }
        // The 2 GiB a few bytes can claim.
        assert!(matches!(check(&page(i64::from(i32::MAX), 4), u64::MAX, 1 << 30), Err(BadPage::OverBudget { .. })));
        assert!(check(b"\x19\xff\xff\xff\xff\x0f", 10, 10).is_err(), "a huge list count");
        // A field id near i64::MAX (a long zigzag varint) then a delta: an error, not an
        // overflow (found by the `parquet_pages` fuzz target).
        let mut huge = vec![0x05];
        varint(u64::MAX - 1, &mut huge); // zigzag: i64::MAX
        huge.extend([0x00, 0x15, 0x02, 0x00]); // its value, then field +1: past i64::MAX
        assert!(check(&huge, 10, 10).is_err());
    }
}
