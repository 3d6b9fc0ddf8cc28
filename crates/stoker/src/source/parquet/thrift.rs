//! A bounded reader of Thrift's compact protocol, the encoding of Parquet's page headers and
//! footer: enough of it to check what a file claims before the parquet crate follows it.

/// A field's value as a zigzag-encoded varint gives it.
pub(super) fn zigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A Thrift compact-protocol reader over a byte slice, bounded: every length is checked
/// against the bytes left, and nesting is limited. `what` names the bytes in its errors.
pub(super) struct Reader<'a> {
    pub(super) b: &'a [u8],
    pub(super) at: usize,
    pub(super) what: &'static str,
}

/// The deepest a skipped value may nest (the parquet crate's own limit): no page header or
/// footer Parquet writers produce comes near it.
const MAX_DEPTH: u32 = 64;

impl<'a> Reader<'a> {
    pub(super) fn new(b: &'a [u8], what: &'static str) -> Self {
        Reader { b, at: 0, what }
    }

    pub(super) fn byte(&mut self) -> Result<u8, String> {
        let v = *self.b.get(self.at).ok_or_else(|| format!("{} is cut short", self.what))?;
        self.at += 1;
        Ok(v)
    }

    pub(super) fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = self.byte()?;
            v |= u64::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("{} holds an overlong number", self.what))
    }

    /// The header of the next field of a struct whose last field id was `last`: its id and
    /// compact type, or `None` at the struct's end.
    pub(super) fn field(&mut self, last: i64) -> Result<Option<(i64, u8)>, String> {
        let byte = self.byte()?;
        if byte == 0 {
            return Ok(None);
        }
        let (delta, ty) = (byte >> 4, byte & 0x0f);
        // Saturating: a lying id (a huge one, then deltas) only fails to match a field.
        let id = if delta == 0 { zigzag(self.varint()?) } else { last.saturating_add(i64::from(delta)) };
        Ok(Some((id, ty)))
    }

    /// The header of a list: its element count and element type. A count past the bytes
    /// left (each element takes at least one) is refused here, before any loop over it.
    pub(super) fn list(&mut self) -> Result<(u64, u8), String> {
        let h = self.byte()?;
        let n = if h >> 4 == 15 { self.varint()? } else { u64::from(h >> 4) };
        if n > (self.b.len() - self.at) as u64 {
            return Err(format!("{} claims more elements than it has bytes", self.what));
        }
        Ok((n, h & 0x0f))
    }

    fn advance(&mut self, n: u64) -> Result<(), String> {
        let n = usize::try_from(n).map_err(|_| format!("{} claims too long a field", self.what))?;
        self.at = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("{}: a field runs past its end", self.what))?;
        Ok(())
    }

    /// Skip one value of compact type `ty`.
    pub(super) fn skip(&mut self, ty: u8, depth: u32) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("{} nests too deep", self.what));
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
                let (n, t) = self.list()?;
                for _ in 0..n {
                    match t {
                        // A list's booleans are one byte each.
                        1 | 2 => self.advance(1)?,
                        t => self.skip(t, depth + 1)?,
                    }
                }
                Ok(())
            }
            11 => {
                let n = self.varint()?;
                if n == 0 {
                    return Ok(());
                }
                let kv = self.byte()?;
                if n.saturating_mul(2) > (self.b.len() - self.at) as u64 {
                    return Err(format!("{} claims more entries than it has bytes", self.what));
                }
                for _ in 0..n {
                    self.skip(kv >> 4, depth + 1)?;
                    self.skip(kv & 0x0f, depth + 1)?;
                }
                Ok(())
            }
            12 => self.skip_struct(depth),
            _ => Err(format!("{} holds an unknown Thrift type {ty}", self.what)),
        }
    }

    /// Skip the rest of a struct (its fields to its end).
    pub(super) fn skip_struct(&mut self, depth: u32) -> Result<(), String> {
        let mut last = 0i64;
        while let Some((id, t)) = self.field(last)? {
            last = id;
            self.skip(t, depth + 1)?;
        }
        Ok(())
    }
}

/// How deep a Parquet schema may nest (groups in groups), checked before the parquet crate
/// builds it: it builds the tree (and Arrow's schema from it) by recursion, one stack frame
/// per level, so a footer of a few KB nesting thousands of levels overflowed the stack and
/// killed the process. Real schemas nest a few levels (a list of structs is three); 64 is
/// Arrow's own limit for nested IPC messages.
pub(super) const MAX_NESTING: usize = 64;

/// How deep the schema of the Parquet footer `footer` (a Thrift `FileMetaData`) nests, up
/// to one level past [`MAX_NESTING`] (the walk stops there). The schema is a flat list of
/// elements in depth-first order, each group giving its number of children; what else is
/// wrong with the footer is left to the parquet crate's own checks.
pub(super) fn schema_depth(footer: &[u8]) -> Result<usize, String> {
    let mut r = Reader::new(footer, "the footer");
    let mut last = 0i64;
    while let Some((id, ty)) = r.field(last)? {
        last = id;
        // Field 2: list<SchemaElement>.
        if (id, ty) != (2, 9) {
            r.skip(ty, 0)?;
            continue;
        }
        let (n, et) = r.list()?;
        if et != 12 {
            return Err("the footer's schema is not a list of elements".into());
        }
        // The children each open group has left to see, innermost last.
        let mut open: Vec<i64> = Vec::new();
        let mut deepest = 0;
        for _ in 0..n {
            let mut children = 0i64;
            let mut last = 0i64;
            while let Some((id, ty)) = r.field(last)? {
                last = id;
                match (id, ty) {
                    // Field 5: num_children, an i32.
                    (5, 5) => children = zigzag(r.varint()?),
                    _ => r.skip(ty, 1)?,
                }
            }
            if let Some(left) = open.last_mut() {
                *left -= 1;
            }
            if children > 0 {
                open.push(children);
                deepest = deepest.max(open.len());
                if deepest > MAX_NESTING {
                    return Ok(deepest);
                }
            }
            while open.last() == Some(&0) {
                open.pop();
            }
        }
        return Ok(deepest);
    }
    Ok(0)
}

/// Whether the whole Parquet file `file` has no footer schema deeper than [`MAX_NESTING`]
/// (the fuzz target parses files the parquet crate's way, which a deeper one overflows).
#[cfg(feature = "fuzzing")]
pub(super) fn not_too_deep(file: &[u8]) -> bool {
    let Some((rest, [a, b, c, d, b'P', b'A', b'R', b'1'])) = file.split_last_chunk::<8>() else { return true };
    let len = u32::from_le_bytes([*a, *b, *c, *d]) as usize;
    let footer = rest.len().checked_sub(len).map(|start| &rest[start..]);
    footer.is_none_or(|f| schema_depth(f).map_or(true, |d| d <= MAX_NESTING))
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

    /// A footer whose schema is a root, `depth` groups each holding the next, and a leaf;
    /// with `siblings` leaves beside the chain at the root (a wide schema is not a deep one).
    fn footer(depth: usize, siblings: usize) -> Vec<u8> {
        let element = |children: Option<u64>, out: &mut Vec<u8>| {
            out.push(0x48); // field 4, binary: name
            varint(1, out);
            out.push(b'a');
            if let Some(c) = children {
                out.push(0x15); // field 5, i32
                varint(c * 2, out);
            }
            out.push(0);
        };
        let mut f = vec![0x15, 2]; // field 1: version 1
        let n = depth + 2 + siblings;
        f.push(0x19); // field 2, list
        if n < 15 {
            f.push(((n as u8) << 4) | 12);
        } else {
            f.push(0xfc);
            varint(n as u64, &mut f);
        }
        element(Some(1 + siblings as u64), &mut f);
        for _ in 0..depth {
            element(Some(1), &mut f);
        }
        element(None, &mut f);
        for _ in 0..siblings {
            element(None, &mut f);
        }
        f.push(0x16); // field 3, i64: num_rows
        varint(0, &mut f);
        f.push(0);
        f
    }

    #[test]
    fn schema_depth_counts_levels_not_width() {
        // The root is a level; each group in the chain another.
        assert_eq!(schema_depth(&footer(0, 0)), Ok(1));
        assert_eq!(schema_depth(&footer(MAX_NESTING - 1, 0)), Ok(MAX_NESTING));
        assert_eq!(schema_depth(&footer(3, 5000)), Ok(4));
        assert_eq!(schema_depth(&footer(MAX_NESTING, 0)), Ok(MAX_NESTING + 1));
        assert_eq!(schema_depth(&footer(100_000, 0)), Ok(MAX_NESTING + 1), "the walk stops past the limit");
        let f = footer(5, 2);
        // Cut anywhere in the schema list (the footer's last 3 bytes come after it).
        for cut in 1..f.len() - 3 {
            assert!(schema_depth(&f[..cut]).is_err(), "cut at {cut}");
        }
    }
}
