//! The records packs and shard writers keep in their destination, and the refusal of a
//! directory whose writer did not finish.

use super::{Error, Result, Store};

/// The record `stoker pack` keeps in its destination (`complete` once the pack is whole).
pub(crate) const PACK_RECORD: &str = ".stoker-pack.json";
/// The record a shard writer's job ([`crate::pack::ShardWriter::begin`]) keeps in its
/// destination (`complete` once its `finish` has indexed it).
pub(crate) const WRITE_RECORD: &str = ".stoker-write.json";
/// The manifest a token pack (`stoker pack --layout tokens`) rewrites after every part: the
/// source's documents, and those of its parts so far.
const TOKENS_RECORD: &str = ".stoker-tokens.json";

/// Whether a record's JSON says its writer finished: `complete`, or for a token pack's
/// manifest, parts holding every document. `None`: not a record of ours.
fn finished(record: &str, json: &serde_json::Value) -> Option<bool> {
    if record != TOKENS_RECORD {
        return json.get("complete")?.as_bool();
    }
    let documents = json.get("documents")?.as_u64()?;
    let parts = json.get("parts")?.as_array()?;
    let done = parts.iter().map(|p| p.get("documents").and_then(|d| d.as_u64())).sum::<Option<u64>>()?;
    Some(done >= documents)
}

/// Refuse a directory whose pack, write or token pack record says it did not finish: its
/// files are only part of the dataset, and without a manifest (written last) nothing else
/// would tell. A record that is not one of ours (not JSON, no `complete`) is no dataset file
/// and is ignored.
pub(super) async fn unfinished(
    store: &Store,
    listed: impl Fn(&str) -> bool,
    display: &str,
    own: Option<&str>,
) -> Result<()> {
    for record in [PACK_RECORD, WRITE_RECORD, TOKENS_RECORD] {
        if own == Some(record) || !listed(record) {
            continue;
        }
        // A plan is about 100 bytes a shard; one past this is not ours.
        let bytes = match store.get_at_most(record, 64 << 20).await {
            Ok(b) => b,
            Err(e) if matches!(e.kind(), crate::ErrorKind::NotFound | crate::ErrorKind::Corrupt) => continue,
            Err(e) => return Err(e),
        };
        let complete = serde_json::from_slice::<serde_json::Value>(&bytes).ok().and_then(|v| finished(record, &v));
        if complete == Some(false) {
            let (what, finish, files) = match record {
                PACK_RECORD => ("a `stoker pack`", "rerun the same `stoker pack` command to finish it", "DIR/*.tar"),
                TOKENS_RECORD => (
                    "a token pack",
                    "rerun the same `stoker pack --layout tokens` command to finish it",
                    "DIR/tokens-00000.idx",
                ),
                _ => {
                    ("a shard writer's job (such as `stoker.ray.write`)", "rerun that write to finish it", "DIR/*.tar")
                }
            };
            return Err(Error::InvalidUri {
                uri: display.to_string(),
                reason: format!(
                    "it holds the output of {what} that did not finish (as its {record} records), so its files are \
                     only part of the dataset; {finish} (to read the files already there meanwhile, name them, such \
                     as `{files}`)"
                ),
            });
        }
    }
    Ok(())
}
