//! MosaicML Streaming's MDS: the shards an `index.json` lists, and a sample's columns as fields.
//!
//! A sample is `u32` sizes of its variable-size columns, then every column's bytes in column
//! order. Encodings become fields by the reader's convention: `bytes`, `str`, `json`,
//! `str_int`/`str_float`/`str_decimal`, `jpeg`, `png`, `pil`, `jpeg_array` and the `list[...]`
//! encodings as stored; `int` and the `int*`/`uint*` scalars as decimal text; `float*` as
//! shortest round-trip text; `ndarray` (fixed or not) as `.npy`. `pkl` is refused.

use std::sync::Arc;

use serde_json::Value;

use super::codec::Codec;
use super::index::IndexError;
use super::{Decode, ShardSpec, Storage};
use crate::sample::Field;

/// One column of an MDS dataset.
#[derive(Debug)]
struct Column {
    name: Arc<str>,
    enc: Enc,
    /// Fixed size in bytes, or `None` when each sample says.
    size: Option<usize>,
}

#[derive(Debug, Clone)]
enum Enc {
    Raw,
    Int(&'static str),
    Float(&'static str),
    /// `ndarray[:dtype[:shape]]`.
    NdArray(Option<&'static str>, Option<Vec<usize>>),
}

/// The sample decoder of the shards of an MDS `index.json` that have the same columns.
#[derive(Debug)]
pub(super) struct Mds {
    columns: Vec<Column>,
    key: Option<usize>,
}

fn dtype_descr(name: &str) -> Option<&'static str> {
    Some(match name {
        "uint8" => "|u1",
        "int8" => "|i1",
        "uint16" => "<u2",
        "int16" => "<i2",
        "float16" => "<f2",
        "uint32" => "<u4",
        "int32" => "<i4",
        "float32" => "<f4",
        "uint64" => "<u8",
        "int64" => "<i8",
        "float64" => "<f8",
        _ => return None,
    })
}

/// MDS's own code for a value dtype in a dynamic `ndarray` (its `_int2value_dtype`).
fn dtype_of_code(code: u8) -> Option<&'static str> {
    Some(match code {
        8 => "|u1",
        9 => "|i1",
        16 => "<u2",
        17 => "<i2",
        18 => "<f2",
        32 => "<u4",
        33 => "<i4",
        34 => "<f4",
        64 => "<u8",
        65 => "<i8",
        66 => "<f8",
        _ => return None,
    })
}

fn encoding(text: &str) -> Result<Enc, String> {
    let (head, rest) = text.split_once(':').map_or((text, None), |(h, r)| (h, Some(r)));
    Ok(match head {
        "bytes" | "str" | "json" | "str_int" | "str_float" | "str_decimal" | "jpeg" | "png" | "pil" | "jpeg_array"
        | "jpegarray" | "list[pil]" | "list[jpeg]" | "list[png]" => Enc::Raw,
        "int" => Enc::Int("<i8"),
        "pkl" => {
            return Err("pickle columns run arbitrary code when loaded: write the column with another encoding, or \
                        leave it out with columns="
                .into())
        }
        "ndarray" => {
            let mut parts = rest.unwrap_or("").split(':').filter(|p| !p.is_empty());
            let dtype = match parts.next() {
                Some(d) => Some(dtype_descr(d).ok_or_else(|| format!("ndarray dtype `{d}` is not one MDS writes"))?),
                None => None,
            };
            let shape = match parts.next() {
                Some(s) => Some(
                    s.split(',')
                        .map(|d| d.trim().parse::<usize>())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|_| format!("ndarray shape `{s}` is not a list of sizes"))?,
                ),
                None => None,
            };
            Enc::NdArray(dtype, shape)
        }
        other => {
            let descr = dtype_descr(other).ok_or_else(|| format!("the encoding `{text}` is not one MDS writes"))?;
            if other.starts_with("float") {
                Enc::Float(descr)
            } else {
                Enc::Int(descr)
            }
        }
    })
}

/// The shards of the MDS index `bytes` (an `index.json`, read one shard entry at a time) in
/// directory `dir` (`""` or ending in `/`), keeping the columns in `wanted` (all when `None`).
pub(super) fn shards(bytes: &[u8], dir: &str, wanted: Option<&[&str]>) -> Result<Vec<ShardSpec>, IndexError> {
    let mut decoder: Option<(Columns, Arc<Mds>)> = None;
    let (shards, top) = super::index::collect(bytes, "shards", |n, s| shard(n, &s, dir, wanted, &mut decoder))?;
    // MosaicML Streaming writes and reads version 2 alone, and refuses any other; another
    // layout read as this one would give other data.
    version(top.get("version")).map_err(IndexError::Layout)?;
    Ok(shards)
}

/// An index's or a shard's `version`: 2, or absent.
fn version(v: Option<&Value>) -> Result<(), String> {
    match v {
        None => Ok(()),
        Some(v) if v.as_u64() == Some(2) => Ok(()),
        Some(v) => Err(format!("version {v}: this reader knows MDS version 2 (MosaicML Streaming's) only")),
    }
}

/// A shard entry's `column_names`, `column_encodings` and `column_sizes`, as the index gives
/// them: what tells whether two shards decode alike.
type Columns = (Vec<Value>, Vec<Value>, Vec<Value>);

/// Shard entry `n` of an MDS index. Each shard is decoded by its own entry's columns (a merged
/// index joins datasets of other columns, as MosaicML Streaming reads them); a decoder is
/// shared by the shards in a row that have the same columns.
fn shard(
    n: usize,
    s: &Value,
    dir: &str,
    wanted: Option<&[&str]>,
    decoder: &mut Option<(Columns, Arc<Mds>)>,
) -> Result<ShardSpec, String> {
    {
        let at = |what: &str| format!("shard {n}: {what}");
        version(s.get("version")).map_err(|why| at(&why))?;
        if s["format"].as_str() != Some("mds") {
            return Err(at(&format!("format {} is not mds (only MDS shards are read)", s["format"])));
        }
        let names = s["column_names"].as_array().ok_or_else(|| at("no column_names"))?;
        let encs = s["column_encodings"].as_array().ok_or_else(|| at("no column_encodings"))?;
        let sizes = s["column_sizes"].as_array().ok_or_else(|| at("no column_sizes"))?;
        if names.len() != encs.len() || names.len() != sizes.len() {
            return Err(at("column_names, column_encodings and column_sizes differ in length"));
        }
        let d = match &*decoder {
            Some(((n, e, z), d)) if n == names && e == encs && z == sizes => d.clone(),
            _ => {
                let mut columns = Vec::with_capacity(names.len());
                let mut key = None;
                for ((name, enc), size) in names.iter().zip(encs).zip(sizes) {
                    let name = name.as_str().ok_or_else(|| at("a column name is not a string"))?;
                    // Two columns of one name: the second would shadow the first's field.
                    if columns.iter().any(|c: &Column| &*c.name == name) {
                        return Err(at(&format!("column `{name}` is named twice")));
                    }
                    let enc_text = enc.as_str().ok_or_else(|| at("a column encoding is not a string"))?;
                    let keep = name == super::KEY || wanted.is_none_or(|w| w.contains(&name));
                    let enc = match encoding(enc_text) {
                        Ok(e) => e,
                        // A refused column the projection leaves out is never decoded.
                        Err(_) if !keep => Enc::Raw,
                        Err(why) => return Err(format!("column `{name}` ({enc_text}): {why}")),
                    };
                    if name == super::KEY && enc_text == "str" {
                        key = Some(columns.len());
                    }
                    let size = match size {
                        Value::Null => None,
                        v => Some(v.as_u64().ok_or_else(|| at("a column size is not a number"))? as usize),
                    };
                    columns.push(Column { name: Arc::from(name), enc, size });
                }
                if let Some(w) = wanted {
                    let have: Vec<&str> = columns.iter().map(|c| &*c.name).collect();
                    if let Some(unknown) = w.iter().find(|n| !have.contains(n)) {
                        return Err(format!(
                            "columns: there is no column `{unknown}`; the columns are {}",
                            have.join(", ")
                        ));
                    }
                }
                let d = Arc::new(Mds { columns, key });
                *decoder = Some(((names.clone(), encs.clone(), sizes.clone()), d.clone()));
                d
            }
        };
        let samples = s["samples"].as_u64().ok_or_else(|| at("no sample count"))? as usize;
        let raw = &s["raw_data"];
        let raw_name = raw["basename"].as_str().ok_or_else(|| at("raw_data has no basename"))?;
        super::inside(raw_name).map_err(|why| at(&why))?;
        let storage = match (&s["zip_data"], s["compression"].as_str()) {
            (Value::Object(z), Some(c)) => {
                let codec =
                    Codec::parse(c).ok_or_else(|| at(&format!("compression `{c}` is not one this reader knows")))?;
                let zip_name =
                    z.get("basename").and_then(Value::as_str).ok_or_else(|| at("zip_data has no basename"))?;
                super::inside(zip_name).map_err(|why| at(&why))?;
                Storage::Whole { path: format!("{dir}{zip_name}"), codec, hashes: hashes(z.get("hashes")) }
            }
            _ => Storage::Raw,
        };
        Ok(ShardSpec {
            path: format!("{dir}{raw_name}"),
            stem: format!("{dir}{}", raw_name.strip_suffix(".mds").unwrap_or(raw_name)),
            samples,
            size: raw["bytes"].as_u64(),
            storage,
            decode: Decode::Mds(d),
        })
    }
}

fn hashes(v: Option<&Value>) -> Vec<(String, String)> {
    v.and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_ascii_lowercase()))).collect())
        .unwrap_or_default()
}

impl Mds {
    /// The key (if the sample has a `__key__` column) and fields of one sample's bytes.
    pub(super) fn decode(&self, data: &[u8], wanted: Option<&[&str]>) -> Result<(Option<String>, Vec<Field>), String> {
        let mut at = 0usize;
        let mut sizes = Vec::with_capacity(self.columns.len());
        for c in &self.columns {
            match c.size {
                Some(s) => sizes.push(s),
                None => {
                    let b = data.get(at..at + 4).ok_or("the sample is shorter than its column sizes")?;
                    sizes.push(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
                    at += 4;
                }
            }
        }
        let mut key = None;
        let mut fields = Vec::with_capacity(self.columns.len());
        for (i, (c, &size)) in self.columns.iter().zip(&sizes).enumerate() {
            let value = data.get(at..at.saturating_add(size)).ok_or_else(|| {
                format!("column `{}` runs past the sample's end ({} bytes at {at} of {})", c.name, size, data.len())
            })?;
            at += size;
            if Some(i) == self.key {
                key = Some(String::from_utf8_lossy(value).into_owned());
                continue;
            }
            if wanted.is_some_and(|w| !w.contains(&&*c.name)) {
                continue;
            }
            let bytes = match &c.enc {
                Enc::Raw => value.to_vec(),
                Enc::Int(d) => super::int_text(d, value).ok_or_else(|| bad(&c.name, value))?.into_bytes(),
                Enc::Float(d) => super::float_text(d, value).ok_or_else(|| bad(&c.name, value))?.into_bytes(),
                Enc::NdArray(dtype, shape) => {
                    ndarray(*dtype, shape.as_deref(), value).map_err(|e| format!("column `{}`: {e}", c.name))?
                }
            };
            fields.push(Field { name: c.name.clone(), data: bytes.into() });
        }
        Ok((key, fields))
    }
}

fn bad(name: &str, value: &[u8]) -> String {
    format!("column `{name}` holds {} bytes, not a value of its encoding", value.len())
}

/// An MDS `ndarray` value as `.npy`: dtype and shape from the encoding, or from the value's
/// own header (`[dtype code] [ndim << 2 | shape width] [shape] [values]`).
fn ndarray(dtype: Option<&'static str>, shape: Option<&[usize]>, v: &[u8]) -> Result<Vec<u8>, String> {
    let mut at = 0usize;
    let dtype = match dtype {
        Some(d) => d,
        None => {
            let code = *v.first().ok_or("an empty ndarray value")?;
            at = 1;
            dtype_of_code(code).ok_or_else(|| format!("dtype code {code} is not one MDS writes"))?
        }
    };
    let shape: Vec<usize> = match shape {
        Some(s) => s.to_vec(),
        None => {
            let b = *v.get(at).ok_or("the ndarray value ends before its shape")?;
            at += 1;
            let (ndim, width) = ((b >> 2) as usize, 1usize << (b & 3));
            let dims = v.get(at..at + ndim * width).ok_or("the ndarray value ends inside its shape")?;
            at += ndim * width;
            dims.chunks(width)
                .map(|c| {
                    let mut w = [0u8; 8];
                    w[..width].copy_from_slice(c);
                    u64::from_le_bytes(w) as usize
                })
                .collect()
        }
    };
    let item = match dtype.as_bytes().last() {
        Some(b'1') => 1,
        Some(b'2') => 2,
        Some(b'4') => 4,
        _ => 8,
    };
    let values = &v[at..];
    let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or("the ndarray shape overflows")?;
    if count.checked_mul(item) != Some(values.len()) {
        return Err(format!("shape {shape:?} of {dtype} needs {count} values, the value holds {} bytes", values.len()));
    }
    Ok(crate::source::npy::npy(dtype, &shape, values))
}

#[cfg(test)]
mod tests {
    use super::super::Decode;

    /// A merged index's shards keep their own columns (MosaicML Streaming decodes each shard by
    /// its entry): the second shard's float `score` and `title` are not read as the first's
    /// int `score` and `text`; shards of the same columns share one decoder.
    #[test]
    fn each_shard_is_decoded_by_its_own_columns() {
        let entry = |names: &str, encs: &str, name: &str| {
            format!(
                r#"{{"column_encodings": [{encs}], "column_names": [{names}], "column_sizes": [8, null],
                "compression": null, "format": "mds", "hashes": [], "raw_data": {{"basename": "{name}",
                "bytes": 100, "hashes": {{}}}}, "samples": 1, "size_limit": 67108864, "version": 2,
                "zip_data": null}}"#
            )
        };
        let a = entry(r#""score", "text""#, r#""int64", "str""#, "a/shard.00000.mds");
        let b = entry(r#""score", "title""#, r#""float64", "str""#, "b/shard.00000.mds");
        let c = entry(r#""score", "title""#, r#""float64", "str""#, "b/shard.00001.mds");
        let index = format!(r#"{{"shards": [{a}, {b}, {c}], "version": 2}}"#);
        let specs = super::shards(index.as_bytes(), "", None).unwrap();
        let cols = |i: usize| match &specs[i].decode {
            Decode::Mds(d) => {
                d.columns.iter().map(|c| (c.name.to_string(), format!("{:?}", c.enc))).collect::<Vec<_>>()
            }
            Decode::Litdata(_) => panic!("an MDS shard"),
        };
        assert_eq!(cols(0).iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["score", "text"]);
        assert_eq!(cols(1).iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["score", "title"]);
        assert_ne!(cols(0)[0].1, cols(1)[0].1, "int64 and float64 scores");
        let (Decode::Mds(x), Decode::Mds(y)) = (&specs[1].decode, &specs[2].decode) else { panic!() };
        assert!(std::sync::Arc::ptr_eq(x, y), "one decoder for shards of the same columns");
    }
}
