//! Telling an `index.json` of MosaicML Streaming from LitData's (or neither) by what it holds.

use super::{Error, Layout, Result, Store};

/// The layout whose `index.json` is among `indexes`, told by what it holds: MosaicML
/// Streaming's lists `shards` (each with a `format`, `mds`), LitData's lists `chunks` beside a
/// `config`. An `index.json` that is neither (or not JSON) is left to be read as a file, unless
/// files named as those layouts' shards lie among `beside`: then it is their damaged index,
/// and reading every file as a sample would hand shards' bytes to training as samples. Nor is
/// it read as a file when it was `named_alone` (the dataset it indexes was meant).
pub(super) async fn sniff_indexes<'a>(
    store: &Store,
    indexes: impl Iterator<Item = &'a str>,
    beside: &[&str],
    named_alone: bool,
) -> Result<Option<Layout>> {
    for path in indexes {
        let bytes = store.get(path).await?;
        if let Some(layout) = index_signature(&bytes) {
            return Ok(Some(layout));
        }
        let shard = beside.iter().find(|p| records_shard_name(p));
        if shard.is_none() && !named_alone {
            continue;
        }
        let why = match serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
            Err(e) => format!("it is not JSON ({e})"),
            Ok(_) => "it lists neither MosaicML Streaming's `shards` nor LitData's `chunks` and `config`".into(),
        };
        let reason = match shard {
            Some(shard) => format!(
                "{why}, yet `{shard}` beside it is named as their shards are: the index is damaged; write it again, \
                 or give ?layout=objects to read every file as one sample"
            ),
            // Named alone, the dataset it indexes was meant, not one sample of its JSON.
            None => format!(
                "{why}: not an index Stoker reads (damaged?); to read the file itself as one sample, give \
                 ?layout=objects"
            ),
        };
        return Err(Error::BadIndex { path: store.describe(path), reason });
    }
    Ok(None)
}

/// Whether `path` is named as MosaicML Streaming's shards (`shard.00000.mds`, compressed
/// `shard.00000.mds.zstd`) or LitData's chunks (`chunk-0-0.bin`) are.
fn records_shard_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    (name.starts_with("shard.") && name.contains(".mds")) || (name.starts_with("chunk-") && name.ends_with(".bin"))
}

/// Which indexed layout an `index.json`'s bytes belong to, if any (see [`sniff_indexes`]).
fn index_signature(bytes: &[u8]) -> Option<Layout> {
    use serde::de::IgnoredAny;
    /// Only what tells the layouts apart: a shard entry's `format`; whether `chunks` is a
    /// list and `config` an object. Everything else is skipped unparsed, so a huge index
    /// costs no tree of it.
    #[derive(serde::Deserialize)]
    struct Sniff {
        shards: Option<Vec<Format>>,
        chunks: Option<Vec<IgnoredAny>>,
        config: Option<std::collections::HashMap<String, IgnoredAny>>,
    }
    #[derive(serde::Deserialize)]
    struct Format {
        format: Option<serde_json::Value>,
    }
    let v: Sniff = serde_json::from_slice(bytes).ok()?;
    let is_mds = v.shards.is_some_and(|s| s.iter().any(|f| f.format.as_ref().and_then(|f| f.as_str()) == Some("mds")));
    let is_litdata = v.chunks.is_some() && v.config.is_some();
    match (is_mds, is_litdata) {
        (true, false) => Some(Layout::Mds),
        (false, true) => Some(Layout::Litdata),
        _ => None,
    }
}
