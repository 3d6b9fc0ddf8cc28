//! LitData's token chunks: what `litdata.optimize(..., item_loader=TokensLoader())` writes for
//! language-model pretraining (LitGPT's data preparation among others).
//!
//! A chunk is `u32` item count `n`, `n + 1` `u32` byte offsets (the first just past them, the
//! last the file's end), then each item's tokens back to back, with no header of their own, in
//! the one dtype the index's `data_format` names (`no_header_numpy:K`, `no_header_tensor:K`).
//! An item is what the optimize function yielded: a document. LitData's own reader drops the
//! boundaries and cuts each chunk's token stream into blocks; here every item stays a
//! document, so packing (`crate::tokens`) can put document boundaries, positions and EOS
//! where they belong. Opening reads each chunk's offset table (one ranged read a chunk).

use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;

use super::flat::{FileDocs, Flat};
use super::idx::TokenType;
use super::TokenFile;
use crate::error::{Error, Result};
use crate::store::Store;

#[derive(Deserialize)]
struct IndexJson {
    config: Config,
    chunks: Vec<Chunk>,
}

#[derive(Deserialize)]
struct Config {
    #[serde(default)]
    item_loader: Option<String>,
    #[serde(default)]
    data_format: Vec<String>,
    #[serde(default)]
    compression: Option<String>,
    #[serde(default)]
    encryption: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Chunk {
    filename: String,
    chunk_size: u64,
}

/// Whether LitData index `bytes` is of token chunks (`TokensLoader`).
pub(crate) fn holds_tokens(bytes: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Top {
        config: Loader,
    }
    #[derive(Deserialize)]
    struct Loader {
        #[serde(default)]
        item_loader: Option<String>,
    }
    serde_json::from_slice::<Top>(bytes).is_ok_and(|t| t.config.item_loader.as_deref() == Some("TokensLoader"))
}

/// LitData's numpy (`_NUMPY_DTYPES_MAPPING`) and torch (`_TORCH_DTYPES_MAPPING`) dtype
/// indices, as token types: integers only.
fn token_type(format: &str) -> std::result::Result<TokenType, String> {
    let (kind, index) = format.split_once(':').unwrap_or((format, ""));
    let index: u32 = index.parse().map_err(|_| format!("data_format `{format}` names no dtype"))?;
    let ty = match (kind, index) {
        ("no_header_numpy", 0) | ("no_header_tensor", 12) => TokenType::I8,
        ("no_header_numpy", 1) | ("no_header_tensor", 13 | 14) => TokenType::I16,
        ("no_header_numpy", 2) | ("no_header_tensor", 15 | 16) => TokenType::I32,
        ("no_header_numpy", 3) | ("no_header_tensor", 17 | 18) => TokenType::I64,
        ("no_header_numpy", 4) | ("no_header_tensor", 11) => TokenType::U8,
        ("no_header_numpy", 5) | ("no_header_tensor", 20) => TokenType::U16,
        ("no_header_numpy", 6) => TokenType::U32,
        ("no_header_numpy" | "no_header_tensor", _) => {
            return Err(format!("data_format `{format}` is not an integer type token ids can be read as"))
        }
        _ => return Err(format!("data_format `{format}` is not a TokensLoader format (no_header_numpy/tensor)")),
    };
    Ok(ty)
}

/// The token chunks of LitData index `index` (read already: `bytes`), in its order.
pub(crate) async fn chunks(store: &Store, index: &str, bytes: &[u8]) -> Result<Vec<TokenFile>> {
    let bad = |reason: String| Error::BadIndex {
        path: store.describe(index),
        reason: format!("{reason}; write it again with litdata.optimize(..., item_loader=TokensLoader())"),
    };
    let parsed: IndexJson =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not a LitData index.json of token chunks ({e})")))?;
    let c = &parsed.config;
    if c.item_loader.as_deref() != Some("TokensLoader") {
        return Err(bad("its item_loader is not TokensLoader".into()));
    }
    if !c.encryption.as_ref().is_none_or(serde_json::Value::is_null) {
        return Err(Error::NotSupported {
            what: format!("{}: the chunks are encrypted; decrypt them with LitData first", store.describe(index)),
        });
    }
    if let Some(codec) = &c.compression {
        return Err(Error::NotSupported {
            what: format!(
                "{}: token chunks compressed with {codec}: LitData's TokensLoader maps chunks as they are, so write \
                 them without compression",
                store.describe(index)
            ),
        });
    }
    let ty = match c.data_format.as_slice() {
        [one] => token_type(one).map_err(bad)?,
        other => return Err(bad(format!("token chunks hold one array an item, not {} leaves", other.len()))),
    };
    if parsed.chunks.is_empty() {
        return Err(Error::Empty { uri: store.describe(index), reason: "its index names no token chunks".into() });
    }
    // A chunk's name is a file beside the index, not a path out of the dataset.
    if let Some(why) = parsed.chunks.iter().find_map(|c| crate::source::records::inside(&c.filename).err()) {
        return Err(bad(why));
    }
    let dir = index.rsplit_once('/').map_or(String::new(), |(d, _)| format!("{d}/"));
    futures::stream::iter(parsed.chunks.into_iter().map(|chunk| {
        let path = format!("{dir}{}", chunk.filename);
        async move { one(store, path, chunk, ty).await }
    }))
    .buffered(16)
    .try_collect()
    .await
}

/// One chunk: its offset table read and checked.
///
/// Sized by the store, not by the index: `chunk_bytes` is the file's size in LitData 0.2.7x
/// but its items' bytes without the offset table in older versions, and a count or a size an
/// index claims must not size a read before the file is known to hold it.
async fn one(store: &Store, path: String, chunk: Chunk, ty: TokenType) -> Result<TokenFile> {
    let bad = |reason: String| Error::BadIndex { path: store.describe(&path), reason };
    let n = chunk.chunk_size;
    if n > u64::from(u32::MAX) {
        return Err(bad(format!("{n} items: a chunk counts its items in 32 bits")));
    }
    let obj = store.open_object(&path).await?;
    let table = (n + 2) * 4;
    if table > obj.size() {
        return Err(bad(format!("{n} items cannot fit in its {} bytes", obj.size())));
    }
    // The count first, in the first 64 KiB (all of a usual table): a large table is read
    // only once the chunk's own count agrees with the index's.
    let first = store.read_span(&obj, 0..table.min(64 << 10)).await?;
    let count = u32::from_le_bytes([first[0], first[1], first[2], first[3]]);
    if u64::from(count) != n {
        return Err(bad(format!("it holds {count} items where the index says {n}")));
    }
    let head = match first.len() as u64 == table {
        true => first,
        false => [first, store.read_span(&obj, 64 << 10..table).await?].concat().into(),
    };
    let word = |i: usize| u32::from_le_bytes([head[4 * i], head[4 * i + 1], head[4 * i + 2], head[4 * i + 3]]);
    let offsets: Vec<u64> = (1..n as usize + 2).map(|i| u64::from(word(i))).collect();
    let flat = Flat::from_offsets(ty, &offsets, table, obj.size()).map_err(bad)?;
    let name = path.strip_suffix(".bin").unwrap_or(&path).to_string();
    Ok(TokenFile { name, bin: obj, index: FileDocs::Flat(flat) })
}
