//! One HDF5 dataset as a field: what its rows become ([`Kind`], decided from its datatype at
//! open), and how a run of rows is read and cut into per-row bytes.

use std::sync::Arc;

use bytes::Bytes;
use hdf5_reader::{
    ByteOrder, Dataset, Datatype, H5Type, SliceInfo, SliceInfoElem, StringPadding, StringSize, VarLenKind,
};

use crate::source::npy::npy;
use crate::source::records::numbers::{float_text, int_text};

/// What the rows of a dataset become, by the convention Parquet, MDS and TFRecord share: one
/// number as text, an array of numbers as `.npy`, bytes and strings as they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Fixed-size integers or floats (enums and booleans over integers too), stored in
    /// `order`: one per row as text, an array per row as `.npy` of `descr` (little-endian).
    Number { descr: &'static str, size: usize, order: ByteOrder },
    /// Fixed-length strings of `size` bytes: the bytes before the padding.
    FixedString { size: usize, space: bool },
    /// Opaque values of `size` bytes (numpy's `void`): as stored.
    Opaque { size: usize },
    /// Variable-length strings, and sequences of one-byte integers (encoded images): the bytes.
    VarBytes,
    /// Variable-length sequences of numbers: a one-dimensional `.npy` per row.
    VarNumbers { descr: &'static str, size: usize, order: ByteOrder },
}

/// A dataset that becomes a field.
#[derive(Clone, Debug)]
pub(super) struct Column {
    /// The field's name: the dataset's path below the root, groups joined by `.`.
    pub(super) name: Arc<str>,
    /// The dataset's path in the file, `/`-joined.
    pub(super) path: String,
    pub(super) kind: Kind,
    /// The shape of one row (the dataset's shape past its first dimension).
    pub(super) item: Vec<usize>,
}

impl Column {
    /// Bytes one row of this dataset takes as stored, whatever its kind (a variable-length
    /// value: its 16-byte reference). Saturating.
    pub(super) fn stored_row_bytes(&self) -> u64 {
        let elements = self.item.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
        elements.saturating_mul(self.kind.stored_size(16) as u64)
    }
}

/// The `.npy` descr of a number type, if Stoker hands it over.
fn number(dt: &Datatype) -> Option<(&'static str, usize, ByteOrder)> {
    Some(match dt {
        Datatype::FixedPoint { size, signed, byte_order } => {
            let d = match (size, signed) {
                (1, true) => "|i1",
                (1, false) => "|u1",
                (2, true) => "<i2",
                (2, false) => "<u2",
                (4, true) => "<i4",
                (4, false) => "<u4",
                (8, true) => "<i8",
                (8, false) => "<u8",
                _ => return None,
            };
            (d, usize::from(*size), *byte_order)
        }
        Datatype::FloatingPoint { size, byte_order } => {
            let d = match size {
                2 => "<f2",
                4 => "<f4",
                8 => "<f8",
                _ => return None,
            };
            (d, usize::from(*size), *byte_order)
        }
        // h5py writes numpy's bool as an enum over int8 (FALSE = 0, TRUE = 1).
        Datatype::Enum { base, .. } => number(base)?,
        _ => return None,
    })
}

impl Kind {
    /// What a dataset of `dt` with rows of `item` becomes; why not, when Stoker does not read it.
    pub(super) fn of(dt: &Datatype, item: &[usize]) -> Result<Kind, String> {
        let kind = if let Some((descr, size, order)) = number(dt) {
            Kind::Number { descr, size, order }
        } else {
            match dt {
                Datatype::String { size: StringSize::Fixed(n), padding, .. } => {
                    Kind::FixedString { size: *n as usize, space: *padding == StringPadding::SpacePad }
                }
                Datatype::String { size: StringSize::Variable, .. } => Kind::VarBytes,
                Datatype::Opaque { size, .. } => Kind::Opaque { size: *size as usize },
                Datatype::VarLen { kind: VarLenKind::String, .. } => Kind::VarBytes,
                Datatype::VarLen { base, .. } => match number(base) {
                    Some((_, 1, _)) => Kind::VarBytes,
                    Some((descr, size, order)) => Kind::VarNumbers { descr, size, order },
                    None => return Err(format!("variable-length sequences of {}", name_of(base))),
                },
                other => return Err(name_of(other)),
            }
        };
        if !matches!(kind, Kind::Number { .. }) && !item.is_empty() {
            return Err(format!("{} in arrays of {:?} per row (only numbers come as arrays)", name_of(dt), item));
        }
        Ok(kind)
    }

    /// Bytes of one stored element.
    fn stored_size(&self, vlen_ref: usize) -> usize {
        match self {
            Kind::Number { size, .. } | Kind::FixedString { size, .. } | Kind::Opaque { size } => *size,
            Kind::VarBytes | Kind::VarNumbers { .. } => vlen_ref,
        }
    }
}

/// A datatype's name for messages.
pub(super) fn name_of(dt: &Datatype) -> String {
    match dt {
        Datatype::Compound { .. } => "compound (structured) values".into(),
        Datatype::Reference { .. } => "object or region references".into(),
        Datatype::Array { .. } => "HDF5 array-typed values".into(),
        Datatype::Bitfield { .. } => "bitfields".into(),
        Datatype::FixedPoint { size, .. } => format!("{}-byte integers", size),
        Datatype::FloatingPoint { size, .. } => format!("{}-byte floats", size),
        other => format!("{other:?}"),
    }
}

/// `N` bytes of one stored element, turned little-endian. `repr(transparent)` so that the
/// reader copies native-order elements straight into a `Vec<Le<N>>`.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Le<const N: usize>([u8; N]);

impl<const N: usize> H5Type for Le<N> {
    fn hdf5_type() -> Datatype {
        Datatype::Opaque { size: N as u32, tag: String::new() }
    }

    fn from_bytes(bytes: &[u8], dtype: &Datatype) -> hdf5_reader::error::Result<Self> {
        let mut out: [u8; N] = bytes
            .get(..N)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| hdf5_reader::error::Error::InvalidData(format!("an element shorter than {N} bytes")))?;
        if number(dtype).is_some_and(|(_, _, o)| o == ByteOrder::BigEndian) {
            out.reverse();
        }
        Ok(Le(out))
    }

    fn element_size(_dtype: &Datatype) -> usize {
        N
    }

    // The reader's per-element fallback costs ~20 ns an element; a row of an image is 10^5.
    fn decode_vec(raw: &[u8], dtype: &Datatype, count: usize) -> Option<hdf5_reader::error::Result<Vec<Self>>> {
        let bytes = raw.get(..count.checked_mul(N)?)?;
        let swap = N > 1 && number(dtype).is_some_and(|(_, _, o)| o == ByteOrder::BigEndian);
        let mut out: Vec<Self> = bytes.chunks_exact(N).map(|c| Le(c.try_into().unwrap_or([0; N]))).collect();
        if swap {
            out.iter_mut().for_each(|e| e.0.reverse());
        }
        Some(Ok(out))
    }

    fn native_copy_compatible(dtype: &Datatype) -> bool {
        number(dtype).is_some_and(|(_, size, o)| size == N && (o == ByteOrder::LittleEndian || N == 1))
            && cfg!(target_endian = "little")
    }
}

/// One stored element of any size, as stored (a fixed string, an opaque value, a
/// variable-length reference).
#[derive(Clone)]
struct Blob(Vec<u8>);

impl H5Type for Blob {
    fn hdf5_type() -> Datatype {
        Datatype::Opaque { size: 0, tag: String::new() }
    }

    fn from_bytes(bytes: &[u8], _dtype: &Datatype) -> hdf5_reader::error::Result<Self> {
        Ok(Blob(bytes.to_vec()))
    }

    fn element_size(dtype: &Datatype) -> usize {
        hdf5_reader::dtype_element_size(dtype).unwrap_or(0)
    }
}

/// The rows `first..first + count` of `set`.
fn rows(set: &Dataset, first: u64, count: u64) -> SliceInfo {
    let mut selections = vec![SliceInfoElem::Slice { start: first, end: first.saturating_add(count), step: 1 }];
    selections.extend(set.shape().get(1..).unwrap_or_default().iter().map(|&d| SliceInfoElem::Slice {
        start: 0,
        end: d,
        step: 1,
    }));
    SliceInfo { selections }
}

/// The stored elements of rows `first..first + count`, little-endian, row after row.
fn numbers(set: &Dataset, first: u64, count: u64, size: usize) -> hdf5_reader::error::Result<Vec<u8>> {
    fn read<const N: usize>(set: &Dataset, sel: &SliceInfo) -> hdf5_reader::error::Result<Vec<u8>> {
        let a = set.read_slice::<Le<N>>(sel)?;
        let (v, _) = a.into_raw_vec_and_offset();
        Ok(v.into_iter().map(|e| e.0).collect::<Vec<[u8; N]>>().into_flattened())
    }
    let sel = rows(set, first, count);
    match size {
        1 => read::<1>(set, &sel),
        2 => read::<2>(set, &sel),
        4 => read::<4>(set, &sel),
        8 => read::<8>(set, &sel),
        _ => Err(hdf5_reader::error::Error::InvalidData(format!("{size}-byte numbers"))),
    }
}

impl Column {
    /// Bytes of one row of numbers as stored; `None` when a header claims a shape past
    /// counting (what may be read is held to the reader's read limit besides).
    pub(super) fn row_bytes(&self) -> Option<usize> {
        let Kind::Number { size, .. } = self.kind else { return None };
        self.item.iter().try_fold(size, |a, &d| a.checked_mul(d))
    }

    /// The field of one row of numbers, `v` little-endian: text for one, `.npy` for an array.
    pub(super) fn number(&self, v: &[u8]) -> Bytes {
        let Kind::Number { descr, .. } = self.kind else { return Bytes::new() };
        if self.item.is_empty() {
            let text = if descr.starts_with("<f") { float_text(descr, v) } else { int_text(descr, v) };
            return Bytes::from(text.unwrap_or_default());
        }
        Bytes::from(npy(descr, &self.item, v))
    }

    /// The field bytes of rows `first..first + count` of `set` (this column's dataset in one
    /// file), one per row; `None` for a row without a value (never, today).
    pub(super) fn read(&self, set: &Dataset, first: u64, count: u64) -> hdf5_reader::error::Result<Vec<Bytes>> {
        let got = self.read_values(set, first, count)?;
        // One value per row, or nothing: a file whose headers disagree with each other (a
        // shape that is not the one the column was planned from) must not shift values
        // between samples.
        if got.len() as u64 != count {
            return Err(hdf5_reader::error::Error::InvalidData(format!(
                "{} values read for {count} rows: the dataset's headers disagree",
                got.len()
            )));
        }
        Ok(got)
    }

    fn read_values(&self, set: &Dataset, first: u64, count: u64) -> hdf5_reader::error::Result<Vec<Bytes>> {
        let n = count as usize;
        match &self.kind {
            Kind::Number { size, .. } => {
                let per = self.row_bytes().ok_or_else(|| {
                    hdf5_reader::error::Error::InvalidData(format!("rows of {:?} values overflow", self.item))
                })?;
                let all = numbers(set, first, count, *size)?;
                let mut each = all.chunks(per.max(1));
                Ok((0..n).map(|_| self.number(if per == 0 { &[] } else { each.next().unwrap_or_default() })).collect())
            }
            kind => {
                let stored = kind.stored_size(set.vlen_reference_size());
                let a = set.read_slice::<Blob>(&rows(set, first, count))?;
                let mut out = Vec::with_capacity(n);
                for Blob(b) in a.into_iter() {
                    let b = b.get(..stored).unwrap_or(&b);
                    out.push(match kind {
                        Kind::FixedString { space, .. } => Bytes::copy_from_slice(unpadded(b, *space)),
                        Kind::Opaque { .. } => Bytes::copy_from_slice(b),
                        Kind::VarBytes => Bytes::from(set.resolve_vlen_reference_bytes(b, 1)?),
                        Kind::VarNumbers { descr, size, order } => {
                            let mut v = set.resolve_vlen_reference_bytes(b, *size)?;
                            if *order == ByteOrder::BigEndian {
                                v.chunks_exact_mut(*size).for_each(<[u8]>::reverse);
                            }
                            Bytes::from(npy(descr, &[v.len() / size], &v))
                        }
                        Kind::Number { .. } => {
                            return Err(hdf5_reader::error::Error::InvalidData("numbers read as blobs".into()))
                        }
                    });
                }
                Ok(out)
            }
        }
    }
}

/// A fixed-length string's bytes before its padding (NULs, or spaces for space-padded ones).
fn unpadded(b: &[u8], space: bool) -> &[u8] {
    if space {
        let end = b.iter().rposition(|&c| c != b' ').map_or(0, |i| i + 1);
        return &b[..end];
    }
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_field_convention() {
        let le = ByteOrder::LittleEndian;
        let i8 = Datatype::FixedPoint { size: 8, signed: true, byte_order: ByteOrder::BigEndian };
        assert_eq!(Kind::of(&i8, &[]), Ok(Kind::Number { descr: "<i8", size: 8, order: ByteOrder::BigEndian }));
        let f16 = Datatype::FloatingPoint { size: 2, byte_order: le };
        assert_eq!(Kind::of(&f16, &[3, 4]), Ok(Kind::Number { descr: "<f2", size: 2, order: le }));
        let u8 = Datatype::FixedPoint { size: 1, signed: false, byte_order: le };
        let vlen = |base: Datatype| Datatype::VarLen {
            base: Box::new(base),
            kind: VarLenKind::Sequence,
            encoding: hdf5_reader::StringEncoding::Ascii,
            padding: StringPadding::NullTerminate,
        };
        assert_eq!(Kind::of(&vlen(u8.clone()), &[]), Ok(Kind::VarBytes));
        assert_eq!(Kind::of(&vlen(f16.clone()), &[]), Ok(Kind::VarNumbers { descr: "<f2", size: 2, order: le }));
        let s = Datatype::String {
            size: StringSize::Fixed(8),
            encoding: hdf5_reader::StringEncoding::Ascii,
            padding: StringPadding::NullPad,
        };
        assert_eq!(Kind::of(&s, &[]), Ok(Kind::FixedString { size: 8, space: false }));
        let e = Kind::of(&s, &[2]).unwrap_err();
        assert!(e.contains("only numbers"), "{e}");
        let c = Datatype::Compound { size: 8, fields: vec![] };
        assert!(Kind::of(&c, &[]).unwrap_err().contains("compound"));
        let odd = Datatype::FixedPoint { size: 3, signed: true, byte_order: le };
        assert!(Kind::of(&odd, &[]).unwrap_err().contains("3-byte"));
    }

    #[test]
    fn padding_is_cut() {
        assert_eq!(unpadded(b"ab\0\0", false), b"ab");
        assert_eq!(unpadded(b"abcd", false), b"abcd");
        assert_eq!(unpadded(b"a b  ", true), b"a b");
        assert_eq!(unpadded(b"   ", true), b"");
    }
}
