//! Arrow values to field bytes (the conventions in the module docs of `parquet`), and which
//! columns a source reads.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, Schema};

use crate::error::{Error, Result};
use crate::sample::Field;

/// One column a source delivers, and how.
#[derive(Debug)]
pub(crate) struct Column {
    pub(crate) name: String,
    /// Root column index in the file schema (for the projection).
    pub(super) index: usize,
    field: Arc<str>,
    path_field: Arc<str>,
    kind: Kind,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Bytes,
    Text,
    Int,
    Float,
    /// A list of numbers: `.npy` with this descr.
    Array(&'static str),
    /// `{bytes, path}` (Hugging Face Image/Audio): the bytes, and the path beside.
    Encoded,
}

/// The `.npy` descr of a numeric element type, if it is one.
fn descr(t: &DataType) -> Option<&'static str> {
    Some(match t {
        DataType::Int8 => "|i1",
        DataType::Int16 => "<i2",
        DataType::Int32 => "<i4",
        DataType::Int64 => "<i8",
        DataType::UInt8 => "|u1",
        DataType::UInt16 => "<u2",
        DataType::UInt32 => "<u4",
        DataType::UInt64 => "<u8",
        DataType::Float16 => "<f2",
        DataType::Float32 => "<f4",
        DataType::Float64 => "<f8",
        DataType::Boolean => "|b1",
        _ => return None,
    })
}

fn kind_of(t: &DataType) -> Option<Kind> {
    Some(match t {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => Kind::Bytes,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Kind::Text,
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Boolean => Kind::Int,
        DataType::Float16 | DataType::Float32 | DataType::Float64 => Kind::Float,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            Kind::Array(descr(f.data_type())?)
        }
        // A dictionary column (pandas categoricals, Arrow dictionaries kept in the file's
        // schema) reads as its values do, each row its entry, shared and not copied.
        DataType::Dictionary(_, values) => kind_of(values)?,
        DataType::Struct(fields) => {
            let bytes = fields.iter().find(|f| f.name() == "bytes")?;
            matches!(bytes.data_type(), DataType::Binary | DataType::LargeBinary | DataType::BinaryView)
                .then_some(Kind::Encoded)?
        }
        _ => return None,
    })
}

/// The columns to read (all but `__key__`, or those `wanted` names) and the root index of
/// `__key__` if the files have a string one. `shown` names the file for errors.
pub(crate) fn plan(schema: &Schema, wanted: Option<&[&str]>, shown: &str) -> Result<(Vec<Column>, Option<usize>)> {
    let fields = schema.fields();
    let key_column = fields.iter().position(|f| {
        f.name() == super::KEY_COLUMN
            && matches!(text_type(f.data_type()), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
    });
    let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
    if let Some(wanted) = wanted {
        if let Some(unknown) = wanted.iter().find(|w| !names.contains(w)) {
            return Err(Error::InvalidOption {
                message: format!("columns: {shown} has no column `{unknown}`; its columns are {}", names.join(", ")),
            });
        }
    }
    let mut out: Vec<Column> = Vec::new();
    let mut taken = std::collections::HashSet::new();
    for (index, f) in fields.iter().enumerate() {
        if Some(index) == key_column || wanted.is_some_and(|w| !w.iter().any(|n| *n == f.name())) {
            continue;
        }
        if f.name() == super::KEY_COLUMN {
            // Keys are text: a number column of that name would become a field named as the
            // batch's keys are.
            return Err(Error::NotSupported {
                what: format!(
                    "{shown}: column `{}` is of type {}, but keys are text; cast it to strings, or rename it",
                    f.name(),
                    f.data_type()
                ),
            });
        }
        let kind = kind_of(f.data_type()).ok_or_else(|| Error::NotSupported {
            what: format!(
                "{shown}: column `{}` is of type {}, which has no field form (binary, strings, numbers, lists of \
                 numbers and {{bytes, path}} structs do); leave it out with columns= naming the others",
                f.name(),
                f.data_type()
            ),
        })?;
        let column = Column {
            name: f.name().clone(),
            index,
            field: Arc::from(f.name().as_str()),
            path_field: Arc::from(format!("{}.path", f.name())),
            kind,
        };
        // Two columns giving one field name (a name written twice, or `a.path` beside a
        // `{bytes, path}` column `a`): one would take the other's place in every sample.
        let mut names = vec![column.field.clone()];
        if matches!(column.kind, Kind::Encoded) {
            names.push(column.path_field.clone());
        }
        if let Some(twice) = names.into_iter().find(|n| !taken.insert(n.clone())) {
            return Err(Error::BadIndex {
                path: shown.to_string(),
                reason: format!(
                    "two of its columns give samples the field `{twice}`, so one would hide the other; rename one, \
                     or leave one out with columns="
                ),
            });
        }
        out.push(column);
    }
    Ok((out, key_column))
}

/// For a dictionary array, its values and the entry row `r` refers to (checked: a key out
/// of range is damage); `None` for any other array.
fn entry(a: &dyn Array, r: usize) -> std::result::Result<Option<(&ArrayRef, usize)>, String> {
    let Some(d) = a.as_any_dictionary_opt() else { return Ok(None) };
    let keys = d.keys();
    let key = match keys.data_type() {
        DataType::Int8 => i64::from(keys.as_primitive::<Int8Type>().value(r)),
        DataType::Int16 => i64::from(keys.as_primitive::<Int16Type>().value(r)),
        DataType::Int32 => i64::from(keys.as_primitive::<Int32Type>().value(r)),
        DataType::Int64 => keys.as_primitive::<Int64Type>().value(r),
        DataType::UInt8 => i64::from(keys.as_primitive::<UInt8Type>().value(r)),
        DataType::UInt16 => i64::from(keys.as_primitive::<UInt16Type>().value(r)),
        DataType::UInt32 => i64::from(keys.as_primitive::<UInt32Type>().value(r)),
        DataType::UInt64 => i64::try_from(keys.as_primitive::<UInt64Type>().value(r)).unwrap_or(-1),
        other => return Err(format!("a dictionary with keys of type {other}")),
    };
    match usize::try_from(key) {
        Ok(k) if k < d.values().len() => Ok(Some((d.values(), k))),
        _ => Err(format!("a dictionary key {key} outside its {} entries", d.values().len())),
    }
}

/// The key in row `r` of a `__key__` column, unless null.
pub(crate) fn key_of(a: &ArrayRef, r: usize) -> Option<String> {
    if a.is_null(r) {
        return None;
    }
    if let Ok(Some((values, entry))) = entry(a.as_ref(), r) {
        return key_of(values, entry);
    }
    text(a.as_ref(), r).map(|b| String::from_utf8_lossy(b).into_owned())
}

/// A column's type, or its values' for a dictionary.
fn text_type(t: &DataType) -> &DataType {
    match t {
        DataType::Dictionary(_, v) => v,
        t => t,
    }
}

fn text(a: &dyn Array, r: usize) -> Option<&[u8]> {
    Some(match a.data_type() {
        DataType::Utf8 => a.as_string::<i32>().value(r).as_bytes(),
        DataType::LargeUtf8 => a.as_string::<i64>().value(r).as_bytes(),
        DataType::Utf8View => a.as_string_view().value(r).as_bytes(),
        _ => return None,
    })
}

/// `value`, a value of `a`, as bytes sharing `a`'s buffer when it is large (no copy: a
/// sample of a decoded row group is a view of it, as a tar sample is of its read).
fn shared(a: &dyn Array, value: &[u8]) -> bytes::Bytes {
    /// An Arrow buffer as the owner of `Bytes`.
    struct Owner(arrow_buffer::Buffer);
    impl AsRef<[u8]> for Owner {
        fn as_ref(&self) -> &[u8] {
            self.0.as_slice()
        }
    }
    if value.len() >= SHARE_FROM {
        let data = a.to_data();
        let (from, to) = (value.as_ptr() as usize, value.as_ptr() as usize + value.len());
        for b in data.buffers() {
            let start = b.as_ptr() as usize;
            if start <= from && to <= start + b.len() {
                return bytes::Bytes::from_owner(Owner(b.clone())).slice(from - start..to - start);
            }
        }
    }
    bytes::Bytes::copy_from_slice(value)
}

/// Values at least this large are shared with their Arrow buffer, smaller ones copied.
const SHARE_FROM: usize = 4096;

fn binary(a: &dyn Array, r: usize) -> Option<&[u8]> {
    Some(match a.data_type() {
        DataType::Binary => a.as_binary::<i32>().value(r),
        DataType::LargeBinary => a.as_binary::<i64>().value(r),
        DataType::BinaryView => a.as_binary_view().value(r),
        DataType::FixedSizeBinary(_) => a.as_fixed_size_binary().value(r),
        _ => return None,
    })
}

fn int_text(a: &dyn Array, r: usize) -> Option<String> {
    Some(match a.data_type() {
        DataType::Int8 => a.as_primitive::<Int8Type>().value(r).to_string(),
        DataType::Int16 => a.as_primitive::<Int16Type>().value(r).to_string(),
        DataType::Int32 => a.as_primitive::<Int32Type>().value(r).to_string(),
        DataType::Int64 => a.as_primitive::<Int64Type>().value(r).to_string(),
        DataType::UInt8 => a.as_primitive::<UInt8Type>().value(r).to_string(),
        DataType::UInt16 => a.as_primitive::<UInt16Type>().value(r).to_string(),
        DataType::UInt32 => a.as_primitive::<UInt32Type>().value(r).to_string(),
        DataType::UInt64 => a.as_primitive::<UInt64Type>().value(r).to_string(),
        DataType::Boolean => u8::from(a.as_boolean().value(r)).to_string(),
        _ => return None,
    })
}

/// Shortest round-trip text: Rust's `Display` of the value at its own width.
pub(crate) fn float_text(a: &dyn Array, r: usize) -> Option<String> {
    Some(match a.data_type() {
        DataType::Float16 => a.as_primitive::<Float16Type>().value(r).to_f32().to_string(),
        DataType::Float32 => a.as_primitive::<Float32Type>().value(r).to_string(),
        DataType::Float64 => a.as_primitive::<Float64Type>().value(r).to_string(),
        _ => return None,
    })
}

/// The elements of a list value as little-endian bytes, with their count.
fn list_bytes(values: &dyn Array) -> Option<(usize, Vec<u8>)> {
    fn le<T: ArrowPrimitiveType>(a: &dyn Array, width: usize, put: impl Fn(T::Native, &mut Vec<u8>)) -> Vec<u8> {
        let p = a.as_primitive::<T>();
        let mut out = Vec::with_capacity(p.len() * width);
        for v in p.values().iter() {
            put(*v, &mut out);
        }
        out
    }
    let n = values.len();
    if values.null_count() > 0 {
        return None;
    }
    let bytes = match values.data_type() {
        DataType::Int8 => le::<Int8Type>(values, 1, |v, o| o.extend_from_slice(&v.to_le_bytes())),
        DataType::Int16 => le::<Int16Type>(values, 2, |v, o| o.extend_from_slice(&v.to_le_bytes())),
        DataType::Int32 => le::<Int32Type>(values, 4, |v, o| o.extend_from_slice(&v.to_le_bytes())),
        DataType::Int64 => le::<Int64Type>(values, 8, |v, o| o.extend_from_slice(&v.to_le_bytes())),
        DataType::UInt8 => le::<UInt8Type>(values, 1, |v, o| o.push(v)),
        DataType::UInt16 => le::<UInt16Type>(values, 2, |v, o| o.extend_from_slice(&v.to_le_bytes())),
        DataType::UInt32 => le::<UInt32Type>(values, 4, |v, o| o.extend_from_slice(&v.to_le_bytes())),
        DataType::UInt64 => le::<UInt64Type>(values, 8, |v, o| o.extend_from_slice(&v.to_le_bytes())),
        DataType::Float16 => le::<Float16Type>(values, 2, |v, o| o.extend_from_slice(&v.to_le_bytes())),
        DataType::Float32 => le::<Float32Type>(values, 4, |v, o| o.extend_from_slice(&v.to_le_bytes())),
        DataType::Float64 => le::<Float64Type>(values, 8, |v, o| o.extend_from_slice(&v.to_le_bytes())),
        DataType::Boolean => (0..n).map(|i| u8::from(values.as_boolean().value(i))).collect(),
        _ => return None,
    };
    Some((n, bytes))
}

impl Column {
    /// Append this column's field(s) of row `r` of `a` to `out` (none for a null).
    pub(crate) fn push_fields(&self, a: &ArrayRef, r: usize, out: &mut Vec<Field>) -> std::result::Result<(), String> {
        if a.is_null(r) {
            return Ok(());
        }
        if let Some((values, entry)) = entry(a.as_ref(), r)? {
            return self.push_fields(values, entry, out);
        }
        let unexpected = || format!("its values are not of the column's declared type {}", a.data_type());
        let data: Vec<u8> = match self.kind {
            // Shared, not copied: a dictionary's entry is the value of every row that names
            // it, and a group's rows copied out (to the spill) were each a copy of it.
            Kind::Bytes | Kind::Text => {
                let value = match self.kind {
                    Kind::Bytes => binary(a.as_ref(), r),
                    _ => text(a.as_ref(), r),
                };
                out.push(Field { name: self.field.clone(), data: shared(a.as_ref(), value.ok_or_else(unexpected)?) });
                return Ok(());
            }
            Kind::Int => int_text(a.as_ref(), r).ok_or_else(unexpected)?.into_bytes(),
            Kind::Float => float_text(a.as_ref(), r).ok_or_else(unexpected)?.into_bytes(),
            Kind::Array(descr) => {
                let value = match a.data_type() {
                    DataType::List(_) => a.as_list::<i32>().value(r),
                    DataType::LargeList(_) => a.as_list::<i64>().value(r),
                    DataType::FixedSizeList(_, _) => a.as_fixed_size_list().value(r),
                    _ => return Err(unexpected()),
                };
                let (n, bytes) = list_bytes(value.as_ref())
                    .ok_or_else(|| "a list with null elements has no .npy form".to_string())?;
                super::super::npy::npy(descr, &[n], &bytes)
            }
            Kind::Encoded => {
                let s = a.as_struct();
                let bytes = s.column_by_name("bytes").ok_or_else(unexpected)?;
                if let Some(path) = s.column_by_name("path") {
                    if !path.is_null(r) {
                        if let Some(p) = text(path.as_ref(), r) {
                            out.push(Field { name: self.path_field.clone(), data: bytes::Bytes::copy_from_slice(p) });
                        }
                    }
                }
                if bytes.is_null(r) {
                    // An image given by path only: the path is all there is.
                    return Ok(());
                }
                let data = shared(bytes.as_ref(), binary(bytes.as_ref(), r).ok_or_else(unexpected)?);
                // The bytes first, then the path: insert before the path pushed above.
                let at = out.len() - usize::from(out.last().is_some_and(|f| f.name == self.path_field));
                out.insert(at, Field { name: self.field.clone(), data });
                return Ok(());
            }
        };
        out.push(Field { name: self.field.clone(), data: data.into() });
        Ok(())
    }
}
