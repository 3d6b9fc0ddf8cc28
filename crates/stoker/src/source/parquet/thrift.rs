//! A bounded reader of Thrift's compact protocol, the encoding of Parquet's page headers and
//! footer: enough of it to check what a file claims before the parquet crate follows it.

/// A field's value as a zigzag-encoded varint gives it.
pub(super) fn zigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// `v` as a varint onto `out`: the tests' writer of Thrift bytes.
#[cfg(test)]
pub(super) fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
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
    /// compact type, or `None` at the struct's end. As the parquet crate reads one (so both
    /// see the same fields): a type of 0 ends the struct, whatever the delta; an id is 16
    /// bits, a full one cut to them, a delta past them an error.
    pub(super) fn field(&mut self, last: i16) -> Result<Option<(i16, u8)>, String> {
        let byte = self.byte()?;
        let (delta, ty) = (byte >> 4, byte & 0x0f);
        if ty == 0 {
            return Ok(None);
        }
        let id = match delta {
            0 => zigzag(self.varint()?) as i16,
            d => last.checked_add(i16::from(d)).ok_or_else(|| format!("{}: a field id overflows", self.what))?,
        };
        Ok(Some((id, ty)))
    }

    /// Skip the value of field `id` (compact type `ty`) of a struct `kind`, or refuse it when
    /// the parquet crate knows the field as another type: it reads a known field by its own
    /// type whatever the file declares, so a walk that skipped by the declared type would part
    /// from the crate's reading, and check other bytes than those the crate then decodes.
    pub(super) fn skip_field(&mut self, kind: Kind, id: i16, ty: u8, depth: u32) -> Result<(), String> {
        match kind.field(id) {
            None => self.skip(ty, depth),
            Some(Want::Struct(inner)) if ty == 12 => self.skip_struct_as(inner, depth + 1),
            Some(w) if w.declared(ty) => self.skip(ty, depth),
            Some(_) => Err(format!("{}: field {id} of a {kind:?} has Thrift type {ty}, not Parquet's", self.what)),
        }
    }

    /// Skip the rest of a struct `kind`, each field as [`skip_field`](Self::skip_field) does.
    pub(super) fn skip_struct_as(&mut self, kind: Kind, depth: u32) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("{} nests too deep", self.what));
        }
        let mut last = 0i16;
        while let Some((id, t)) = self.field(last)? {
            last = id;
            self.skip_field(kind, id, t, depth + 1)?;
        }
        Ok(())
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
            12 => self.skip_struct_as(Kind::Other, depth),
            13 => self.advance(16),
            _ => Err(format!("{} holds an unknown Thrift type {ty}", self.what)),
        }
    }
}

/// The structs of Parquet's Thrift whose fields a walk must read as the parquet crate does
/// (see [`Reader::skip_field`]); `Other` is any struct it skips whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Other,
    SchemaElement,
    LogicalType,
    Decimal,
    Time,
    TimeUnit,
    Int,
    Variant,
    Geometry,
    Geography,
    Empty,
    PageHeader,
    DataPage,
    DataPageV2,
    Dictionary,
    Statistics,
}

/// What the parquet crate reads a known field as.
#[derive(Clone, Copy)]
pub(super) enum Want {
    I32,
    I64,
    Byte,
    Bool,
    Binary,
    Struct(Kind),
}

impl Want {
    /// Whether compact type `ty` declares this.
    fn declared(self, ty: u8) -> bool {
        matches!(
            (self, ty),
            (Want::I32, 5) | (Want::I64, 6) | (Want::Byte, 3) | (Want::Bool, 1 | 2) | (Want::Binary, 8)
        )
    }
}

impl Kind {
    /// What field `id` of this struct is to the parquet crate (parquet.thrift), if known.
    pub(super) fn field(self, id: i16) -> Option<Want> {
        use Want::*;
        Some(match (self, id) {
            (Kind::SchemaElement, 1..=3 | 5..=9) => I32,
            (Kind::SchemaElement, 4) => Binary,
            (Kind::SchemaElement, 10) => Struct(Kind::LogicalType),
            (Kind::LogicalType, 5) => Struct(Kind::Decimal),
            (Kind::LogicalType, 7 | 8) => Struct(Kind::Time),
            (Kind::LogicalType, 10) => Struct(Kind::Int),
            (Kind::LogicalType, 16) => Struct(Kind::Variant),
            (Kind::LogicalType, 17) => Struct(Kind::Geometry),
            (Kind::LogicalType, 18) => Struct(Kind::Geography),
            (Kind::LogicalType, 1..=4 | 6 | 11..=15) => Struct(Kind::Empty),
            (Kind::Decimal, 1 | 2) => I32,
            (Kind::Time, 1) => Bool,
            (Kind::Time, 2) => Struct(Kind::TimeUnit),
            (Kind::TimeUnit, 1..=3) => Struct(Kind::Empty),
            (Kind::Int, 1) | (Kind::Variant, 1) => Byte,
            (Kind::Int, 2) => Bool,
            (Kind::Geometry, 1) | (Kind::Geography, 1) => Binary,
            (Kind::Geography, 2) => I32,
            (Kind::PageHeader, 1..=4) => I32,
            (Kind::PageHeader, 5) => Struct(Kind::DataPage),
            (Kind::PageHeader, 6) => Struct(Kind::Empty),
            (Kind::PageHeader, 7) => Struct(Kind::Dictionary),
            (Kind::PageHeader, 8) => Struct(Kind::DataPageV2),
            (Kind::DataPage, 1..=4) | (Kind::DataPageV2, 1..=6) | (Kind::Dictionary, 1 | 2) => I32,
            (Kind::DataPage, 5) | (Kind::DataPageV2, 8) => Struct(Kind::Statistics),
            (Kind::DataPageV2, 7) | (Kind::Dictionary, 3) | (Kind::Statistics, 7 | 8) => Bool,
            (Kind::Statistics, 1 | 2 | 5 | 6) => Binary,
            (Kind::Statistics, 3 | 4) => I64,
            _ => return None,
        })
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
    let mut last = 0i16;
    while let Some((id, ty)) = r.field(last)? {
        last = id;
        match (id, ty) {
            // The version and the row count: numbers, as the crate reads them.
            (1, 5) | (3, 6) => {
                r.varint()?;
            }
            // The crate builds its schema from the first field 2 (a later one it skips): that
            // list is the one walked. The rest of the footer is walked too, bounded: the
            // crate's own skip of a field it does not know spins on a list or map claiming
            // billions of booleans (no bytes each), and this walk refuses any count past the
            // bytes left (found by the `parquet_footer` fuzz target: a footer of 1,339 bytes
            // that kept the crate busy past the 10 s limit).
            (2, 9) => {
                let depth = schema_list(&mut r)?;
                if depth <= MAX_NESTING {
                    while let Some((id, ty)) = r.field(last)? {
                        last = id;
                        r.skip(ty, 0)?;
                    }
                }
                return Ok(depth);
            }
            // Every writer writes the version, then the schema: a footer that puts anything
            // else first (whose reading this walk would have to follow as the crate does) is
            // refused.
            _ => return Err(format!("the footer has field {id} (Thrift type {ty}) before its schema")),
        }
    }
    Err("the footer has no schema".into())
}

/// The depth of the schema list `r` is at (see [`schema_depth`]).
fn schema_list(r: &mut Reader) -> Result<usize, String> {
    let (n, et) = r.list()?;
    if et != 12 {
        return Err("the footer's schema is not a list of elements".into());
    }
    // The children each open group has left to see, innermost last.
    let mut open: Vec<i64> = Vec::new();
    let mut deepest = 0;
    for _ in 0..n {
        let mut children = 0i64;
        let mut last = 0i16;
        while let Some((id, ty)) = r.field(last)? {
            last = id;
            match (id, ty) {
                // num_children, an i32 as the crate reads it (cut to 32 bits).
                (5, 5) => children = i64::from(zigzag(r.varint()?) as i32),
                _ => r.skip_field(Kind::SchemaElement, id, ty, 1)?,
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
    Ok(deepest)
}

/// Whether an open would hand the footer of the whole Parquet file `file` to the parquet
/// crate: its walk ([`schema_depth`]) passes and its schema is at most [`MAX_NESTING`] deep
/// (the fuzz target then parses it the crate's way, as an open does).
#[cfg(feature = "fuzzing")]
pub(super) fn not_too_deep(file: &[u8]) -> bool {
    let Some((rest, [a, b, c, d, b'P', b'A', b'R', b'1'])) = file.split_last_chunk::<8>() else { return true };
    let len = u32::from_le_bytes([*a, *b, *c, *d]) as usize;
    let footer = rest.len().checked_sub(len).map(|start| &rest[start..]);
    footer.is_none_or(|f| schema_depth(f).is_ok_and(|d| d <= MAX_NESTING))
}

#[cfg(test)]
mod tests {
    use super::put_varint as varint;
    use super::*;

    /// A footer whose schema is a root, `depth` groups each holding the next, and a leaf;
    /// with `siblings` leaves beside the chain at the root (a wide schema is not a deep one).
    fn footer(depth: usize, siblings: usize) -> Vec<u8> {
        footer_with(depth, siblings, 0x15, -1)
    }

    /// [`footer`] with the field header byte `children_field` before each num_children (0x15:
    /// field 5, i32), and `root_children` as the root's count (-1: the count of its children).
    fn footer_with(depth: usize, siblings: usize, children_field: u8, root_children: i64) -> Vec<u8> {
        let element = |children: Option<i64>, out: &mut Vec<u8>| {
            out.push(0x48); // field 4, binary: name
            varint(1, out);
            out.push(b'a');
            if let Some(c) = children {
                out.push(children_field);
                varint(((c << 1) ^ (c >> 63)) as u64, out);
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
        element(Some(if root_children < 0 { 1 + siblings as i64 } else { root_children }), &mut f);
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
        // Read as the parquet crate reads it. A full field id is cut to 16 bits: 65538 is
        // the schema's field 2.
        let mut far = footer(100, 0);
        let mut id = vec![0x09];
        varint(65538 * 2, &mut id);
        far.splice(2..3, id);
        assert_eq!(schema_depth(&far), Ok(MAX_NESTING + 1));
        // The schema declared a set, num_children declared an i64, a field before the schema:
        // refused, not skipped (the crate reads them all the same).
        let mut set = footer(100, 0);
        set[2] = 0x1a;
        assert!(schema_depth(&set).unwrap_err().contains("before its schema"));
        assert!(schema_depth(&footer_with(100, 0, 0x16, -1)).unwrap_err().contains("not Parquet's"));
        let mut late = footer(3, 0);
        late.splice(0..2, [0x66, 0x00]); // field 6 (i64) first
        assert!(schema_depth(&late).is_err());
        // num_children is an i32: -(2^32) + 1 is 1.
        assert_eq!(schema_depth(&footer_with(0, 0, 0x15, -(1 << 32) + 1)), Ok(1));
        // After the schema, a field of a map claiming 2^31 - 1 entries of booleans (no bytes
        // each to the parquet crate's skip, which then spins): refused.
        let mut spin = footer(3, 0);
        spin.truncate(spin.len() - 1); // the footer's end
        spin.extend([0xbb]); // field 3 + 11 = 14, a map
        put_varint(i32::MAX as u64, &mut spin);
        spin.extend([0x11, 0x00]); // bool -> bool, then the footer's end
        assert!(schema_depth(&spin).unwrap_err().contains("more entries than it has bytes"));
        // Cut anywhere: in the schema list, or in what follows it.
        for cut in 1..f.len() {
            assert!(schema_depth(&f[..cut]).is_err(), "cut at {cut}");
        }
    }
}
