//! LitData's optimized chunks: the chunks an `index.json` lists, and an item's leaves as fields.
//!
//! An item is `u32` sizes of its leaves, then the leaves' bytes; the leaves are named by the
//! item's pytree (`data_spec`: dict keys, list indices, joined with `.`; a bare leaf is
//! `data`). Serializers become fields by the reader's convention: `str`, `text`, `bytes`,
//! `json`, images, `file`, video and audio as stored; `int`, `bool` as decimal text (`1`/`0`);
//! `float` as shortest round-trip text; `numpy`, `no_header_numpy`, `tensor`,
//! `no_header_tensor` as `.npy`. `pickle` is refused.

use std::sync::Arc;

use serde_json::Value;

use super::codec::Codec;
use super::index::IndexError;
use super::{Decode, ShardSpec, Storage};
use crate::sample::Field;

#[derive(Debug, Clone)]
enum Leaf {
    Raw,
    Int,
    Float,
    Bool,
    /// numpy's header: `u32` dtype index, `u32` ndim, `u32` dims.
    Numpy,
    /// torch's header: big-endian `u32` dtype index, rank, dims.
    Tensor,
    /// 1-D values of a fixed dtype.
    Flat(&'static str),
}

/// The item decoder of one LitData `index.json`.
#[derive(Debug)]
pub(super) struct Litdata {
    leaves: Vec<(Arc<str>, Leaf)>,
    key: Option<usize>,
}

/// LitData's numpy dtype index (`_NUMPY_DTYPES_MAPPING`) as an `.npy` descr.
fn numpy_dtype(i: u32) -> Option<&'static str> {
    ["|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16", "|b1"]
        .get(i as usize)
        .copied()
}

/// LitData's torch dtype index (`_TORCH_DTYPES_MAPPING`) as an `.npy` descr (bfloat16 has none).
fn torch_dtype(i: u32) -> Option<&'static str> {
    Some(match i {
        0 | 1 => "<f4",
        2 | 3 => "<f8",
        4 | 5 => "<c8",
        6 | 7 => "<c16",
        8 | 9 => "<f2",
        11 => "|u1",
        12 => "|i1",
        13 | 14 => "<i2",
        15 | 16 => "<i4",
        17 | 18 => "<i8",
        19 => "|b1",
        20 => "<u2",
        _ => return None,
    })
}

fn leaf(format: &str) -> Result<Leaf, String> {
    let (head, arg) = format.split_once(':').map_or((format, None), |(h, a)| (h, Some(a)));
    let index = || arg.and_then(|a| a.parse::<u32>().ok()).ok_or_else(|| format!("`{format}` names no dtype"));
    Ok(match head {
        "int" => Leaf::Int,
        "float" => Leaf::Float,
        "bool" => Leaf::Bool,
        "numpy" => Leaf::Numpy,
        "tensor" => Leaf::Tensor,
        "no_header_numpy" => Leaf::Flat(numpy_dtype(index()?).ok_or_else(|| format!("`{format}`: unknown dtype"))?),
        "no_header_tensor" => Leaf::Flat(torch_dtype(index()?).ok_or_else(|| format!("`{format}`: unknown dtype"))?),
        "pickle" => {
            return Err("pickled leaves run arbitrary code when loaded: write them with another serializer, or leave \
                        them out with columns="
                .into())
        }
        // The serializers LitData ships whose bytes are the value itself (text, encoded
        // media, files, JSON) are delivered as they are.
        "str" | "text" | "bytes" | "video" | "audio" | "image" | "nifti" | "mesh" | "pdf" | "graph" | "tifffile"
        | "file" | "pil" | "jpeg" | "jpeg_array" | "json" => Leaf::Raw,
        _ => {
            return Err(format!(
                "`{format}` is not a serializer LitData ships (a custom one, or a damaged index): its bytes cannot \
                 be read as it wrote them; leave the leaf out with columns="
            ))
        }
    })
}

/// The most leaves (fields) an item may have: a sample is a dict of a few tensors and values.
const MAX_LEAVES: usize = 1 << 16;
/// The most bytes of `data_spec` a leaf may take: its node and its key's name (LitData
/// writes about 60 bytes a leaf besides the key).
const SPEC_BYTES_PER_LEAF: usize = 256;

/// Leaf names of a pytree spec as LitData dumps it (`[protocol, {type, context,
/// children_spec}]`), in leaf order.
fn leaf_names(spec: &Value, prefix: &str, out: &mut Vec<String>) -> Result<(), String> {
    let children = spec["children_spec"].as_array().ok_or("a pytree node without children_spec")?;
    if spec["type"].is_null() && children.is_empty() {
        out.push(if prefix.is_empty() { "data".to_string() } else { prefix.to_string() });
        return Ok(());
    }
    let keys: Option<Vec<String>> = match &spec["context"] {
        Value::String(s) => serde_json::from_str::<Vec<Value>>(s)
            .ok()
            .map(|v| v.iter().map(|k| k.as_str().map_or_else(|| k.to_string(), str::to_string)).collect()),
        _ => None,
    };
    for (i, child) in children.iter().enumerate() {
        let name = keys.as_ref().and_then(|k| k.get(i).cloned()).unwrap_or_else(|| i.to_string());
        let path = if prefix.is_empty() { name } else { format!("{prefix}.{name}") };
        leaf_names(child, &path, out)?;
    }
    Ok(())
}

/// The chunks of LitData index `index` in directory `dir` (`""` or ending in `/`), keeping
/// the leaves in `wanted` (all when `None`).
pub(super) fn shards(bytes: &[u8], dir: &str, wanted: Option<&[&str]>) -> Result<Vec<ShardSpec>, IndexError> {
    // LitData writes its chunks before its config: a first walk skips them for the config.
    let (top, _) = super::index::stream(bytes, "chunks", None)?;
    let (decoder, codec, level) = layout(&top, wanted).map_err(IndexError::Layout)?;
    super::index::collect(bytes, "chunks", |n, c| chunk(n, &c, dir, &decoder, codec, &level)).map(|(chunks, _)| chunks)
}

/// How the items of every chunk are laid out, from the index's `config`: their decoder, the
/// compression and its level.
fn layout(
    index: &serde_json::Map<String, Value>,
    wanted: Option<&[&str]>,
) -> Result<(Arc<Litdata>, Option<Codec>, String), String> {
    let config = index.get("config").and_then(Value::as_object).ok_or("it has no `config` object")?;
    if !config.get("encryption").is_none_or(Value::is_null) {
        return Err("the chunks are encrypted, which this reader does not do: decrypt them with LitData first".into());
    }
    match config.get("item_loader").and_then(Value::as_str) {
        None | Some("PyTreeLoader") => {}
        Some(other) => {
            return Err(format!(
                "items are laid out by LitData's {other}, not the PyTreeLoader this reader reads: read them with \
                 LitData, or optimize the data with the default item loader"
            ))
        }
    }
    let formats = config.get("data_format").and_then(Value::as_array).ok_or("config has no data_format")?;
    if formats.len() > MAX_LEAVES {
        return Err(format!("its items claim {} leaves, more than the {MAX_LEAVES} this reader takes", formats.len()));
    }
    let spec_text = config.get("data_spec").and_then(Value::as_str).ok_or("config has no data_spec")?;
    // The spec is parsed whole (a tree some 14 times its text): its size is held to what
    // its leaves can need, so a lying one cannot take gigabytes.
    let most = SPEC_BYTES_PER_LEAF * (formats.len() + 1) + (64 << 10);
    if spec_text.len() > most {
        return Err(format!(
            "its data_spec is {} bytes, more than {most} for {} leaves: the index is damaged or not LitData's",
            spec_text.len(),
            formats.len()
        ));
    }
    let spec: Value = serde_json::from_str(spec_text).map_err(|e| format!("data_spec is not JSON: {e}"))?;
    let mut names = Vec::new();
    leaf_names(spec.get(1).ok_or("data_spec is not [protocol, spec]")?, "", &mut names)?;
    if names.len() != formats.len() {
        return Err(format!("data_spec names {} leaves and data_format {}", names.len(), formats.len()));
    }
    if let Some(w) = wanted {
        if let Some(unknown) = w.iter().find(|n| !names.iter().any(|m| m == *n)) {
            return Err(format!("columns: there is no leaf `{unknown}`; the leaves are {}", names.join(", ")));
        }
    }
    let mut leaves = Vec::with_capacity(names.len());
    let mut key = None;
    for (name, f) in names.iter().zip(formats) {
        let f = f.as_str().ok_or("a data_format entry is not a string")?;
        let keep = name == super::KEY || wanted.is_none_or(|w| w.contains(&name.as_str()));
        let l = match leaf(f) {
            Ok(l) => l,
            Err(_) if !keep => Leaf::Raw,
            Err(why) => return Err(format!("leaf `{name}` ({f}): {why}")),
        };
        if name == super::KEY && f == "str" {
            key = Some(leaves.len());
        }
        leaves.push((Arc::from(name.as_str()), l));
    }
    let decoder = Arc::new(Litdata { leaves, key });
    let codec = match config.get("compression").and_then(Value::as_str) {
        None => None,
        Some(c) => Some(Codec::parse(c).ok_or_else(|| format!("compression `{c}` is not one this reader knows"))?),
    };
    let level = config.get("compression_level").and_then(Value::as_str).unwrap_or("chunk");
    Ok((decoder, codec, level.to_string()))
}

/// Chunk entry `n` of a LitData index.
fn chunk(
    n: usize,
    c: &Value,
    dir: &str,
    decoder: &Arc<Litdata>,
    codec: Option<Codec>,
    level: &str,
) -> Result<ShardSpec, String> {
    {
        let name = c["filename"].as_str().ok_or_else(|| format!("chunk {n} has no filename"))?;
        super::inside(name).map_err(|why| format!("chunk {n}: {why}"))?;
        let samples = c["chunk_size"].as_u64().ok_or_else(|| format!("chunk {n} has no chunk_size"))? as usize;
        let path = format!("{dir}{name}");
        let storage = match (codec, level) {
            (None, _) => Storage::Raw,
            (Some(Codec::Zstd), "batch") => Storage::Framed,
            (Some(codec), "sample") => Storage::RawItems(codec),
            (Some(codec), _) => Storage::Whole { path: path.clone(), codec, hashes: Vec::new() },
        };
        let stem = name.strip_suffix(".bin").unwrap_or(name);
        Ok(ShardSpec {
            stem: format!("{dir}{}", stem.strip_suffix(".zstd").unwrap_or(stem)),
            path,
            samples,
            size: if codec.is_none() { c["chunk_bytes"].as_u64() } else { None },
            storage,
            decode: Decode::Litdata(decoder.clone()),
        })
    }
}

fn u32_at(v: &[u8], at: usize, big: bool) -> Option<u32> {
    let b: [u8; 4] = v.get(at..at + 4)?.try_into().ok()?;
    Some(if big { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) })
}

/// A numpy/tensor leaf with its header as `.npy`.
fn with_header(v: &[u8], big: bool, dtype_of: fn(u32) -> Option<&'static str>) -> Result<Vec<u8>, String> {
    let code = u32_at(v, 0, big).ok_or("the array header is cut short")?;
    let ndim = u32_at(v, 4, big).ok_or("the array header is cut short")? as usize;
    let dtype = dtype_of(code).ok_or_else(|| format!("array dtype index {code} has no .npy form"))?;
    let mut shape = Vec::with_capacity(ndim.min(64));
    for d in 0..ndim {
        shape.push(u32_at(v, 8 + 4 * d, big).ok_or("the array shape is cut short")? as usize);
    }
    let values = &v[(8 + 4 * ndim).min(v.len())..];
    flat_check(dtype, &shape, values)?;
    Ok(crate::source::npy::npy(dtype, &shape, values))
}

fn flat_check(dtype: &str, shape: &[usize], values: &[u8]) -> Result<(), String> {
    let item: usize = dtype[2..].parse().unwrap_or(1);
    let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or("the array shape overflows")?;
    if count.checked_mul(item) != Some(values.len()) {
        return Err(format!("shape {shape:?} of {dtype} needs {count} values; {} bytes are there", values.len()));
    }
    Ok(())
}

impl Litdata {
    /// The key (if the item has a `__key__` leaf) and fields of one item's bytes.
    pub(super) fn decode(&self, data: &[u8], wanted: Option<&[&str]>) -> Result<(Option<String>, Vec<Field>), String> {
        let n = self.leaves.len();
        let header =
            4usize.checked_mul(n).filter(|&h| h <= data.len()).ok_or("the item is shorter than its leaf sizes")?;
        let mut at = header;
        let mut key = None;
        let mut fields = Vec::with_capacity(n);
        for (i, (name, leaf)) in self.leaves.iter().enumerate() {
            let size = u32_at(data, 4 * i, false).ok_or("the item is shorter than its leaf sizes")? as usize;
            let v = data.get(at..at.saturating_add(size)).ok_or_else(|| {
                format!("leaf `{name}` runs past the item's end ({size} bytes at {at} of {})", data.len())
            })?;
            at += size;
            if Some(i) == self.key {
                key = Some(String::from_utf8_lossy(v).into_owned());
                continue;
            }
            if wanted.is_some_and(|w| !w.contains(&&**name)) {
                continue;
            }
            let bad = || format!("leaf `{name}` holds {} bytes, not a value of its serializer", v.len());
            let bytes = match leaf {
                Leaf::Raw => v.to_vec(),
                Leaf::Int => super::int_text("<i8", v).ok_or_else(bad)?.into_bytes(),
                Leaf::Float => super::float_text("<f8", v).ok_or_else(bad)?.into_bytes(),
                Leaf::Bool => match v {
                    [b] => {
                        if *b != 0 {
                            b"1".to_vec()
                        } else {
                            b"0".to_vec()
                        }
                    }
                    _ => return Err(bad()),
                },
                Leaf::Numpy => with_header(v, false, numpy_dtype).map_err(|e| format!("leaf `{name}`: {e}"))?,
                Leaf::Tensor => with_header(v, true, torch_dtype).map_err(|e| format!("leaf `{name}`: {e}"))?,
                Leaf::Flat(dtype) => {
                    let item: usize = dtype[2..].parse().unwrap_or(1);
                    if v.len() % item != 0 {
                        return Err(bad());
                    }
                    crate::source::npy::npy(dtype, &[v.len() / item], v)
                }
            };
            fields.push(Field { name: name.clone(), data: bytes.into() });
        }
        Ok((key, fields))
    }
}
