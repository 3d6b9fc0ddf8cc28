//! `tf.train.Example` records as sample fields, read with a protobuf decoder of our own (the
//! four messages involved, bounded by the record's length; no generated code):
//!
//! ```text
//! Example   { Features features = 1; }
//! Features  { map<string, Feature> feature = 1; }      // entries: { key = 1; value = 2; }
//! Feature   { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
//! BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1; }  Int64List { repeated int64 value = 1; }
//! ```
//!
//! A feature becomes fields by the convention Parquet lists follow: one `bytes_list` value is
//! the field's bytes, several are `NAME.0`, `NAME.1`, ...; one `int64_list` or `float_list`
//! value is its decimal (shortest round-trip) text, several are a `.npy` (`<i8`, `<f4`); an
//! empty list is no field. Fields come in name order.

use std::sync::Arc;

use bytes::Bytes;

use crate::sample::Field;

/// One feature's values.
#[derive(Debug, PartialEq)]
pub(crate) enum Values {
    Bytes(Vec<Bytes>),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
}

/// A protobuf wire reader over one message's bytes.
struct Wire<'a> {
    b: &'a [u8],
}

impl<'a> Wire<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&byte, rest) = self.b.split_first()?;
            self.b = rest;
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn take(&mut self, n: u64) -> Option<&'a [u8]> {
        let n = usize::try_from(n).ok()?;
        if n > self.b.len() {
            return None;
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Some(head)
    }

    /// The next field's number, wire type, and (for length-delimited fields) its bytes.
    fn field(&mut self) -> Option<Option<(u64, Value<'a>)>> {
        if self.b.is_empty() {
            return Some(None);
        }
        let key = self.varint()?;
        let (num, wire) = (key >> 3, key & 7);
        let value = match wire {
            0 => Value::Varint(self.varint()?),
            1 => Value::Fixed64(self.take(8)?),
            2 => {
                let n = self.varint()?;
                Value::Bytes(self.take(n)?)
            }
            5 => Value::Fixed32(self.take(4)?),
            _ => return None, // groups (3, 4) are not in these messages; 6, 7 do not exist
        };
        (num > 0).then_some(Some((num, value)))
    }
}

enum Value<'a> {
    Varint(u64),
    Fixed64(#[allow(dead_code)] &'a [u8]),
    Bytes(&'a [u8]),
    Fixed32(&'a [u8]),
}

/// Every field of message `b`, or `None` when it is not a well-formed message.
fn fields(b: &[u8]) -> Option<Vec<(u64, Value<'_>)>> {
    let mut w = Wire { b };
    let mut out = Vec::new();
    while let Some(f) = w.field()? {
        out.push(f);
    }
    Some(out)
}

/// The features of `record` if it is a `tf.train.Example` with at least one feature, in name
/// order; `None` for anything else (a `SequenceExample`, an empty message, other bytes).
pub(crate) fn parse(record: &Bytes) -> Option<Vec<(String, Values)>> {
    let mut out = Vec::new();
    for (num, v) in fields(record)? {
        let (1, Value::Bytes(features)) = (num, v) else { return None };
        for (num, v) in fields(features)? {
            let (1, Value::Bytes(entry)) = (num, v) else { return None };
            let (mut name, mut values) = (None, None);
            for (num, v) in fields(entry)? {
                match (num, v) {
                    (1, Value::Bytes(k)) => name = Some(std::str::from_utf8(k).ok()?.to_string()),
                    // A `value` given again is merged into the first, as protobuf does.
                    (2, Value::Bytes(f)) => feature_into(record, f, &mut values)?,
                    _ => return None,
                }
            }
            out.push((name?, values.unwrap_or(Values::Bytes(Vec::new()))));
        }
    }
    if out.is_empty() {
        return None;
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    // A repeated key: protobuf keeps the last; a dataset with one is not what its writer meant.
    (!out.windows(2).any(|w| w[0].0 == w[1].0)).then_some(out)
}

/// Parse one `Feature` message's bytes into `acc`, as protobuf merges a message given in
/// several pieces: a list of the kind `acc` holds extends it (a `bytes_list` given twice is
/// both lists' values, as TensorFlow reads it), a list of another kind replaces it (`kind` is
/// a oneof). Bytes are slices of `record` (no copy).
fn feature_into(record: &Bytes, b: &[u8], acc: &mut Option<Values>) -> Option<()> {
    for (num, v) in fields(b)? {
        let Value::Bytes(list) = v else { return None };
        let values = match num {
            1 => Values::Bytes(
                fields(list)?
                    .into_iter()
                    .map(|(n, v)| match (n, v) {
                        (1, Value::Bytes(x)) => Some(record.slice_ref(x)),
                        _ => None,
                    })
                    .collect::<Option<_>>()?,
            ),
            2 => Values::Floats(floats(list)?),
            3 => Values::Ints(ints(list)?),
            _ => return None,
        };
        match (acc.as_mut(), values) {
            (Some(Values::Bytes(a)), Values::Bytes(v)) => a.extend(v),
            (Some(Values::Floats(a)), Values::Floats(v)) => a.extend(v),
            (Some(Values::Ints(a)), Values::Ints(v)) => a.extend(v),
            (_, v) => *acc = Some(v),
        }
    }
    Some(())
}

/// A `FloatList`: packed (one length-delimited run) or not (a fixed32 per value).
fn floats(b: &[u8]) -> Option<Vec<f32>> {
    let mut out = Vec::new();
    for (num, v) in fields(b)? {
        match (num, v) {
            (1, Value::Bytes(run)) if run.len() % 4 == 0 => {
                out.extend(run.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            }
            (1, Value::Fixed32(c)) => out.push(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            _ => return None,
        }
    }
    Some(out)
}

/// An `Int64List`: packed varints or one varint per value.
fn ints(b: &[u8]) -> Option<Vec<i64>> {
    let mut out = Vec::new();
    for (num, v) in fields(b)? {
        match (num, v) {
            (1, Value::Bytes(run)) => {
                let mut w = Wire { b: run };
                while !w.b.is_empty() {
                    out.push(w.varint()? as i64);
                }
            }
            (1, Value::Varint(x)) => out.push(x as i64),
            _ => return None,
        }
    }
    Some(out)
}

/// The fields of a parsed Example, by the module's convention.
pub(crate) fn to_fields(features: Vec<(String, Values)>, names: &mut NameCache) -> Result<Vec<Field>, String> {
    let mut out = Vec::with_capacity(features.len());
    for (name, values) in features {
        match values {
            Values::Bytes(v) if v.len() == 1 => out.push(Field { name: names.get(&name), data: v[0].clone() }),
            Values::Bytes(v) => out.extend(
                v.into_iter().enumerate().map(|(i, data)| Field { name: names.get(&format!("{name}.{i}")), data }),
            ),
            Values::Ints(v) if v.len() == 1 => {
                out.push(Field { name: names.get(&name), data: v[0].to_string().into() })
            }
            Values::Floats(v) if v.len() == 1 => {
                out.push(Field { name: names.get(&name), data: v[0].to_string().into() })
            }
            Values::Ints(v) if !v.is_empty() => {
                let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                out.push(Field { name: names.get(&name), data: super::super::npy::npy("<i8", &[v.len()], &raw).into() })
            }
            Values::Floats(v) if !v.is_empty() => {
                let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                out.push(Field { name: names.get(&name), data: super::super::npy::npy("<f4", &[v.len()], &raw).into() })
            }
            Values::Ints(_) | Values::Floats(_) => {}
        }
    }
    // A list's `NAME.i` may be another feature's own name: two values under one field name,
    // of which a reader would see either.
    let mut seen: Vec<&str> = out.iter().map(|f| &*f.name).collect();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!(
            "two of its features make the field `{}` (a list's values are named `NAME.0`, `NAME.1`...); rename one",
            crate::escape::display_key(w[0])
        ));
    }
    Ok(out)
}

/// Field names shared across samples (one allocation per distinct name, bounded).
#[derive(Default)]
pub(crate) struct NameCache(std::collections::HashMap<String, Arc<str>>);

impl NameCache {
    fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.0.get(name) {
            return n.clone();
        }
        let n: Arc<str> = name.into();
        // A hostile file may name every feature differently: the cache stops growing.
        if self.0.len() < 4096 {
            self.0.insert(name.to_string(), n.clone());
        }
        n
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

    fn delimited(num: u64, body: &[u8], out: &mut Vec<u8>) {
        varint(num << 3 | 2, out);
        varint(body.len() as u64, out);
        out.extend_from_slice(body);
    }

    fn example(features: &[(&str, u64, Vec<u8>)]) -> Bytes {
        let mut feats = Vec::new();
        for (name, kind, list) in features {
            let (mut feature, mut entry) = (Vec::new(), Vec::new());
            delimited(*kind, list, &mut feature);
            delimited(1, name.as_bytes(), &mut entry);
            delimited(2, &feature, &mut entry);
            delimited(1, &entry, &mut feats);
        }
        let mut ex = Vec::new();
        delimited(1, &feats, &mut ex);
        ex.into()
    }

    #[test]
    fn examples_parse_into_fields_by_the_convention() {
        let (mut bytes, mut two) = (Vec::new(), Vec::new());
        delimited(1, b"jpeg", &mut bytes);
        delimited(1, b"a", &mut two);
        delimited(1, b"b", &mut two);
        let mut packed_ints = Vec::new();
        let mut run = Vec::new();
        for v in [3u64, 300, u64::MAX] {
            varint(v, &mut run);
        }
        delimited(1, &run, &mut packed_ints);
        let mut one_int = Vec::new();
        varint(1 << 3, &mut one_int);
        varint(7, &mut one_int);
        let mut floats = Vec::new();
        delimited(1, &[0.5f32.to_le_bytes(), 2.25f32.to_le_bytes()].concat(), &mut floats);
        let rec = example(&[
            ("image", 1, bytes),
            ("label", 3, one_int),
            ("ids", 3, packed_ints),
            ("box", 2, floats),
            ("tags", 1, two),
            ("none", 3, Vec::new()),
        ]);
        let parsed = parse(&rec).unwrap();
        let names: Vec<&str> = parsed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["box", "ids", "image", "label", "none", "tags"]);
        assert_eq!(parsed[1].1, Values::Ints(vec![3, 300, -1]));
        let fields = to_fields(parsed, &mut NameCache::default()).unwrap();
        let got: Vec<(&str, &[u8])> = fields.iter().map(|f| (&*f.name, &f.data[..])).collect();
        assert_eq!(got[2], ("image", &b"jpeg"[..]));
        assert_eq!(got[3], ("label", &b"7"[..]));
        assert_eq!((got[4], got[5]), (("tags.0", &b"a"[..]), ("tags.1", &b"b"[..])));
        assert!(got[0].1.starts_with(b"\x93NUMPY") && got[0].1.ends_with(&2.25f32.to_le_bytes()));
        assert_eq!(got.len(), 6, "the empty list is no field");
        // A list's `tags.0` and a feature of that name: two values under one field name.
        let (mut two, mut one) = (Vec::new(), Vec::new());
        delimited(1, b"a", &mut two);
        delimited(1, b"b", &mut two);
        delimited(1, b"c", &mut one);
        let rec = example(&[("tags", 1, two), ("tags.0", 1, one)]);
        let e = to_fields(parse(&rec).unwrap(), &mut NameCache::default()).unwrap_err();
        assert!(e.contains("`tags.0`"), "{e}");
    }

    /// A message given in pieces is merged as protobuf (and TensorFlow) merge it: a list given
    /// twice in a `Feature`, or a `Feature` given twice in its map entry, holds both lists'
    /// values; a list of another kind replaces what came before (the kind is a oneof).
    #[test]
    fn repeated_lists_and_features_merge_as_protobuf_does() {
        let list = |items: &[&[u8]]| {
            let mut l = Vec::new();
            for i in items {
                delimited(1, i, &mut l);
            }
            l
        };
        let entry_of = |name: &str, features: &[Vec<u8>]| {
            let mut entry = Vec::new();
            delimited(1, name.as_bytes(), &mut entry);
            for f in features {
                delimited(2, f, &mut entry);
            }
            let (mut feats, mut ex) = (Vec::new(), Vec::new());
            delimited(1, &entry, &mut feats);
            delimited(1, &feats, &mut ex);
            Bytes::from(ex)
        };
        let mut twice = Vec::new();
        delimited(1, &list(&[b"first"]), &mut twice);
        delimited(1, &list(&[b"second"]), &mut twice);
        let mut second = Vec::new();
        delimited(1, &list(&[b"third"]), &mut second);
        let bytes = |v: &[&[u8]]| Values::Bytes(v.iter().map(|b| Bytes::copy_from_slice(b)).collect());
        let rec = entry_of("a", &[twice.clone()]);
        assert_eq!(parse(&rec).unwrap()[0].1, bytes(&[b"first", b"second"]));
        let rec = entry_of("a", &[twice.clone(), second]);
        assert_eq!(parse(&rec).unwrap()[0].1, bytes(&[b"first", b"second", b"third"]));
        // bytes, then an int64 list: the ints; then bytes again: those bytes alone.
        let mut ints = Vec::new();
        delimited(3, &[8, 5], &mut ints);
        let mut again = Vec::new();
        delimited(1, &list(&[b"last"]), &mut again);
        assert_eq!(parse(&entry_of("a", &[twice.clone(), ints.clone()])).unwrap()[0].1, Values::Ints(vec![5]));
        assert_eq!(parse(&entry_of("a", &[twice, ints, again])).unwrap()[0].1, bytes(&[b"last"]));
    }

    #[test]
    fn other_payloads_are_not_examples() {
        assert!(parse(&Bytes::from_static(b"")).is_none(), "no features");
        assert!(parse(&Bytes::from_static(b"\xff\xff\xff")).is_none());
        assert!(parse(&Bytes::from_static(b"plain text payload")).is_none());
        let mut truncated = example(&[("x", 1, vec![10, 1, b'a'])]).to_vec();
        truncated.pop();
        assert!(parse(&truncated.into()).is_none());
        let dup = example(&[("x", 1, vec![10, 1, b'a']), ("x", 1, vec![10, 1, b'b'])]);
        assert!(parse(&dup).is_none(), "a repeated feature name");
    }
}
