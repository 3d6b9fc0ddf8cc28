//! The options a source opens with ([`SourceOptions`]), the layouts it can have ([`Layout`]),
//! and the defaults behind them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::dirs::user_cache_dir;
use crate::error::{Error, Result};
use crate::redact::{is_secret_option, redact, redact_endpoint, scrub, secret_values, toml_error, SECRET_OPTIONS};

/// How samples are laid out in storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Layout {
    /// One file or object per sample, ordered by sorted relative path.
    Objects,
    /// WebDataset tar shards.
    Tar,
    /// An LMDB environment (`data.mdb`), one record per sample in key order.
    Lmdb,
    /// A weighted mix of other sources, opened from a mix file (see [`crate::source::mix`]).
    Mix,
    /// Parquet files (Hugging Face datasets, pyarrow, Spark...): a row is a sample, a column a
    /// field, a row group a shard.
    Parquet,
    /// MosaicML Streaming's MDS: `index.json` naming `shard.NNNNN.mds` files.
    Mds,
    /// LitData's optimized chunks: `index.json` naming `chunk-*.bin` files.
    Litdata,
    /// Tokenized documents: Megatron-style indexed datasets, `NAME.bin` tokens beside their
    /// `NAME.idx` index (Megatron-LM, NeMo, GPT-NeoX).
    Tokens,
    /// JSON Lines text: one document per line (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`), its text
    /// in the field `text_field` names.
    Jsonl,
    /// TFRecord files (`.tfrecord`, `.tfrecords`, `.tfrec`, gzip-compressed `.gz`): a record
    /// is a sample, its `tf.train.Example` features its fields.
    Tfrecord,
    /// HDF5 files (`.h5`, `.hdf5`): the datasets sharing a first dimension N give N samples,
    /// one field per dataset.
    Hdf5,
}

impl Layout {
    /// Every layout, in declaration order.
    pub const ALL: &'static [Layout] = &[
        Layout::Objects,
        Layout::Tar,
        Layout::Lmdb,
        Layout::Mix,
        Layout::Parquet,
        Layout::Mds,
        Layout::Litdata,
        Layout::Tokens,
        Layout::Jsonl,
        Layout::Tfrecord,
        Layout::Hdf5,
    ];

    /// The name used in URIs and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Objects => "objects",
            Layout::Tar => "tar",
            Layout::Lmdb => "lmdb",
            Layout::Mix => "mix",
            Layout::Parquet => "parquet",
            Layout::Mds => "mds",
            Layout::Litdata => "litdata",
            Layout::Tokens => "tokens",
            Layout::Jsonl => "jsonl",
            Layout::Tfrecord => "tfrecord",
            Layout::Hdf5 => "hdf5",
        }
    }
}

/// Layouts whose files are recognised by name, with the suffix that names them, in the order
/// inference tries them. A sharded layout (Parquet, MDS, ...) joins inference with a row here.
/// MDS and LitData datasets are recognised by their `index.json` (see [`INDEX_FILE`]), whose
/// content says which of the two it is.
const SHARD_SUFFIXES: &[(Layout, &str)] = &[
    (Layout::Tar, ".tar"),
    (Layout::Parquet, ".parquet"),
    (Layout::Tokens, ".idx"),
    (Layout::Jsonl, ".jsonl"),
    (Layout::Jsonl, ".jsonl.gz"),
    (Layout::Jsonl, ".jsonl.zst"),
    (Layout::Tfrecord, ".tfrecord"),
    (Layout::Tfrecord, ".tfrecords"),
    (Layout::Tfrecord, ".tfrec"),
    (Layout::Tfrecord, ".tfrecord.gz"),
    (Layout::Tfrecord, ".tfrecords.gz"),
    (Layout::Tfrecord, ".tfrec.gz"),
    (Layout::Hdf5, ".h5"),
    (Layout::Hdf5, ".hdf5"),
];

/// The file an MDS or LitData dataset is opened from: it names the shards (chunks).
pub const INDEX_FILE: &str = "index.json";

impl Layout {
    /// The layout a file of this name is a shard of, when the name alone says so (`.tar`).
    pub fn of_shard_name(name: &str) -> Option<Layout> {
        SHARD_SUFFIXES.iter().find(|(_, suffix)| name.ends_with(suffix)).map(|&(l, _)| l)
    }

    /// Whether a file at `path` is part of a dataset in this layout: a sharded layout keeps
    /// its shards only (a README beside tar shards is not one); the others keep every file.
    pub fn holds(self, path: &str) -> bool {
        if self.is_indexed() {
            // The shards are the ones its index names; the listing keeps the index alone.
            return path.rsplit('/').next() == Some(INDEX_FILE);
        }
        if self == Layout::Tokens {
            // Megatron pairs are found by their .idx; flat arrays (.bin alone, .npy) are kept for
            // the layout to take with `separator=` (never inferred from them).
            return [".idx", ".bin", ".npy"].iter().any(|s| path.ends_with(s));
        }
        let mut suffixes = SHARD_SUFFIXES.iter().filter(|(l, _)| *l == self).peekable();
        match suffixes.peek() {
            Some(_) => suffixes.any(|(_, suffix)| path.ends_with(suffix)),
            None => true,
        }
    }

    /// Whether datasets of this layout are opened from an [`INDEX_FILE`] (MDS, LitData).
    pub fn is_indexed(self) -> bool {
        matches!(self, Layout::Mds | Layout::Litdata)
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Options for opening a source. Every field is optional; `None` means "the default".
///
/// The same struct comes from a URI query (`?layout=tar&concurrency=64`), from JSON or TOML,
/// or from code. Unknown keys are rejected with the list of valid ones. `Debug` masks the
/// credentials.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SourceOptions {
    /// Force a layout instead of inferring it.
    pub layout: Option<Layout>,
    /// Field name for single-field LMDB records (default `data`).
    pub field: Option<String>,
    /// JSONL: the field of each line's object that holds the document's text (default `text`).
    pub text_field: Option<String>,
    /// Tokens layout, flat token files (a `.bin` without an `.idx`, or an `.npy`): the token
    /// that ends each document (nanoGPT's data has GPT-2's `<|endoftext|>`, 50256, between them).
    pub separator: Option<i64>,
    /// Tokens layout, a flat `.bin`: its token type (`uint16`, default; `uint32`, `int32`, ...).
    pub token_dtype: Option<String>,
    /// Parquet, MDS, LitData: read only these columns (comma-separated, `image,label`); the
    /// others are never fetched (default: every column).
    pub columns: Option<String>,
    /// Parquet, MDS, LitData: memory for shards decoded whole (a row group whose pages are
    /// coarse, a shard compressed as a whole, a LitData record batch), least recently used
    /// first (default 512 MiB). Parquet row groups, once decoded, and LitData record batches
    /// dropped with rows still unread are spilled to a file of the process's own in the user
    /// cache dir (later reads of their rows decode nothing), unless `disk_cache=false`. It
    /// also caps what one decode may produce (a shard or frame decompressed, a Parquet page or
    /// row group decoded; at least 16 MiB): a decompression bomb stops there, and a file that
    /// needs more is an error naming this option.
    pub decoded_bytes: Option<u64>,
    /// Requests a source keeps in flight for one `get_many` (default 64).
    pub concurrency: Option<usize>,
    /// Ranges closer than this many bytes are read as one request (default 16 KiB).
    pub coalesce_gap: Option<u64>,
    /// Coalesced reads are capped at this many bytes so big batches still read in parallel
    /// (default 4 MiB).
    pub max_read: Option<u64>,
    /// Where tar sidecar indexes go when the shard directory is read-only
    /// (default `$STOKER_CACHE_DIR/index`, else `$XDG_CACHE_HOME/stoker/index`, else `~/.cache/stoker/index`).
    pub index_dir: Option<PathBuf>,
    /// Write sidecar indexes next to shards (default true); when false, indexes go to `index_dir`.
    pub write_sidecar: Option<bool>,

    /// Object store endpoint (S3-compatible servers, emulators), e.g. `http://127.0.0.1:9000`.
    pub endpoint: Option<String>,
    /// Region (S3; default `us-east-1`, or `AWS_REGION`).
    pub region: Option<String>,
    /// Allow plain `http://` endpoints (default: true when the endpoint is http).
    pub allow_http: Option<bool>,
    /// A PEM file of certificates to trust besides the system's: the CA of an on-premises
    /// S3-compatible or HTTPS server (the system's roots come from `SSL_CERT_FILE` /
    /// `SSL_CERT_DIR` or the OS store).
    pub ca_certificate: Option<PathBuf>,
    /// S3 virtual-hosted-style requests (`bucket.host`) instead of path-style (default false).
    pub virtual_hosted: Option<bool>,
    /// S3 access key id (else `AWS_ACCESS_KEY_ID`).
    pub access_key_id: Option<String>,
    /// S3 secret access key (else `AWS_SECRET_ACCESS_KEY`).
    pub secret_access_key: Option<String>,
    /// S3 session token (else `AWS_SESSION_TOKEN`).
    pub session_token: Option<String>,
    /// S3: read without credentials (public buckets).
    pub anonymous: Option<bool>,
    /// S3/GCS: allow the cloud instance-metadata credential service.
    pub instance_metadata: Option<bool>,
    /// GCS service account: a JSON key file path or the JSON itself (else `GOOGLE_SERVICE_ACCOUNT`
    /// / `GOOGLE_APPLICATION_CREDENTIALS`).
    pub service_account: Option<String>,
    /// Azure storage account (else `AZURE_STORAGE_ACCOUNT_NAME`).
    pub account: Option<String>,
    /// Azure account key (else `AZURE_STORAGE_ACCOUNT_KEY`).
    pub access_key: Option<String>,
    /// Azure: talk to the Azurite emulator.
    pub use_emulator: Option<bool>,
    /// HTTP: a file (relative to the URI) listing one object name per line.
    pub list: Option<String>,

    /// Remote requests in flight at once, fixed (at most [`MAX_IN_FLIGHT`]). Unset: sized
    /// from observed latency (Little's law), from 64 up to 512 and 256 MiB of requests.
    #[serde(deserialize_with = "max_in_flight")]
    pub max_in_flight: Option<usize>,
    /// Remote reads larger than this are split into parallel parts (default 8 MiB).
    pub part_size: Option<u64>,
    /// Tries per remote request, the first included (default 6).
    pub attempts: Option<u32>,
    /// First retry backoff in ms, doubling with jitter (default 50).
    pub backoff_ms: Option<u64>,
    /// Hedge a request after this many ms (0: never; default: twice the recent p95).
    pub hedge_ms: Option<u64>,
    /// Time limit of one request attempt in ms (default 60000).
    pub timeout_ms: Option<u64>,
    /// A remote request that receives nothing for this many ms (no answer yet, or no byte of
    /// its body since the last one) is abandoned and retried (default 20000; 0: never). The
    /// timer restarts with every piece of the body, so a slow but moving read is never cut.
    pub stall_ms: Option<u64>,
    /// A remote read (a range, or an object read whole) fails once this many ms have passed
    /// since its first attempt, whatever attempts are left (default 120000; 0: no deadline):
    /// the most a stalling or failing store costs one read. Listings have no deadline (each
    /// page has the stall timeout).
    pub deadline_ms: Option<u64>,
    /// Memory cache for remote shard bytes, in bytes (default 0: off).
    pub cache_bytes: Option<u64>,
    /// Cache block size in bytes (default 1 MiB; a Loader reading in storage order or by
    /// shard windows takes 8 MiB unless this says, see [`SourceOptions::for_order`], and so
    /// does one reading all of data the disk cache holds whole, see
    /// [`BlockCache::widen_block`](crate::cache::BlockCache::widen_block)).
    pub cache_block: Option<u64>,
    /// Disk cache of remote shard bytes, shared by the processes of a node and reused by the
    /// next run (default true for remote sources; local paths never use one): `false` turns
    /// it off, whatever `disk_cache_dir` says.
    pub disk_cache: Option<bool>,
    /// Disk cache directory (default `$STOKER_CACHE_DIR/blocks`, else
    /// `$XDG_CACHE_HOME/stoker/blocks`, else `~/.cache/stoker/blocks`). One that cannot be
    /// used is warned about and read without.
    pub disk_cache_dir: Option<PathBuf>,
    /// Disk cache limit in bytes (default 10% of the space its disk has for it, counting what
    /// it holds, between 256 MiB and 50 GiB).
    pub disk_cache_bytes: Option<u64>,
    /// How the disk cache picks what to drop (default `future`: by the order the Loader will
    /// read, which it knows for this epoch and the next; least recently used for other
    /// readers), or `lru`.
    pub cache_eviction: Option<Eviction>,
    /// What a read does when the disk cache's writes fall behind it (64 MiB of fetched blocks
    /// waiting for the disk): `wait` (default) holds reads to the disk's speed, so every block
    /// the plan admits is stored; `skip` leaves that block out of the cache and reads on, for a
    /// disk that cannot keep up with the link (later epochs fetch the rest and store it then).
    pub disk_cache_behind: Option<Behind>,
    /// Use the dataset's manifest (`stoker index`) when it has one (default true).
    pub manifest: Option<bool>,
    /// What opening does with a damaged tar shard (default `raise`): `skip` keeps the samples
    /// around the damage, resynchronising at the next valid header, and reports what was lost
    /// (`SampleSource::damage`, `Loader::stats().damage`). The Loader's skip policy sets it.
    pub on_damage: Option<DamagePolicy>,
    /// `index`: record a digest (XXH3-64) of every tar member's payload in the indexes (reads every
    /// payload once); reads then verify them (default false; `pack` always records them).
    pub checksums: Option<bool>,
}

/// How the disk cache picks what to drop ([`SourceOptions::cache_eviction`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Eviction {
    /// By the reader's known future order when it gives one (the Loader does): the block
    /// needed furthest ahead goes first, and one that would go first is not stored. Least
    /// recently used without one.
    #[default]
    Future,
    /// Least recently used, whatever the reader knows.
    Lru,
}

/// What a read does when the disk cache's writes fall behind
/// ([`SourceOptions::disk_cache_behind`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Behind {
    /// Wait for the disk: every admitted block is stored.
    #[default]
    Wait,
    /// Leave the block out of the cache and read on.
    Skip,
}

/// What opening a source does when a shard is damaged (see [`SourceOptions::on_damage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DamagePolicy {
    /// Fail the open with an error naming the shard and byte offset.
    #[default]
    Raise,
    /// Keep every sample outside the damage, count and report the rest.
    Skip,
}

/// The option keys a URI query or config file may use (the fields of [`SourceOptions`]).
pub fn option_keys() -> Vec<String> {
    // Every field is an Option serialised as null by default, so the keys come from serde and
    // cannot drift from the struct.
    match serde_json::to_value(SourceOptions::default()) {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

impl std::fmt::Debug for SourceOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Through JSON so every field is listed without a second list to keep in step.
        let mut v = serde_json::to_value(self).map_err(|_| std::fmt::Error)?;
        if let Some(map) = v.as_object_mut() {
            map.retain(|_, v| !v.is_null());
            for k in SECRET_OPTIONS {
                if let Some(x) = map.get_mut(*k) {
                    *x = serde_json::Value::String("***".into());
                }
            }
            // An endpoint may carry `user:password@`; any other URL is redacted as URIs are.
            for (k, v) in map.iter_mut() {
                if let serde_json::Value::String(s) = v {
                    if k == "endpoint" {
                        *s = redact_endpoint(s);
                    } else if s.contains("://") {
                        *s = redact(s);
                    }
                }
            }
        }
        write!(f, "SourceOptions {v}")
    }
}

impl SourceOptions {
    /// Parse a URL query string (`layout=tar&concurrency=8`).
    pub fn from_query(query: &str) -> Result<Self> {
        serde_urlencoded::from_str(query).map_err(|e| {
            // serde_urlencoded does not say which key's value failed ("invalid digit found in
            // string"): each known pair parsed alone finds it. The value is not quoted (a
            // secret's may be in the query).
            let why = e.to_string();
            let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).unwrap_or_default();
            let keys = option_keys();
            let wrong = pairs.iter().filter(|(k, _)| keys.contains(k)).find_map(|(k, v)| {
                let alone = serde_urlencoded::to_string([(k, v)]).ok()?;
                serde_urlencoded::from_str::<SourceOptions>(&alone).err().map(|e| (k, e.to_string()))
            });
            match wrong {
                Some((k, why)) if !is_secret_option(k) => Error::invalid_option(format!("option `{k}`: {why}")),
                Some((k, _)) => Error::invalid_option(format!("option `{k}`: not a valid value")),
                None => option_error(why),
            }
        })
    }

    /// Parse a JSON object. Errors never quote credential values.
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| {
            // serde quotes a value of the wrong type (`invalid type: integer `123``), secrets too.
            // Parsed once more as a plain object (the options failed, the JSON may not have):
            // for the secrets to hide, and the option to blame.
            let map = match serde_json::from_str::<serde_json::Value>(text) {
                Ok(serde_json::Value::Object(map)) => map,
                _ => serde_json::Map::new(),
            };
            let mut secrets: Vec<String> =
                map.iter().filter(|(k, _)| is_secret_option(k)).flat_map(|(_, v)| json_leaves(v.clone())).collect();
            secrets.extend(secret_values(text).unwrap_or_default());
            let shown = |m: &str| crate::uri::redact_text(&scrub(m, &secrets)).into_owned();
            // Options come as keyword arguments or a dict, not as text: name the option whose
            // value is wrong, without serde's place in the JSON ("at line 1 column 19").
            let why = e.to_string();
            if !why.starts_with("unknown field") {
                if let Some((key, why)) = wrong_option(map) {
                    let why = shown(&why);
                    let why = why.rsplit_once(" at line ").map_or(why.as_str(), |(w, _)| w);
                    return Error::invalid_option(format!("option `{key}`: {why}"));
                }
            }
            option_error(shown(&why))
        })
    }

    /// Parse a TOML document (an options file). Errors are one line (where and why) and
    /// never quote credential values, nor the line of a file that holds any.
    pub fn from_toml(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| Error::invalid_option(toml_error(&e, text)))
    }

    /// Options set in `other` override those set in `self`.
    pub fn merged(self, other: SourceOptions) -> Self {
        // Field by field through serde, so a new option needs no change here.
        let (Ok(serde_json::Value::Object(mut base)), Ok(serde_json::Value::Object(over))) =
            (serde_json::to_value(&self), serde_json::to_value(&other))
        else {
            return self;
        };
        base.extend(over.into_iter().filter(|(_, v)| !v.is_null()));
        serde_json::from_value(serde_json::Value::Object(base)).unwrap_or(self)
    }

    pub(crate) fn concurrency(&self) -> usize {
        // A batch of 64 all in flight at once: the fetch layer's limit, sized from latency, is
        // what bounds the store's load; this only bounds one call's demand.
        self.concurrency.unwrap_or(64).max(1)
    }
    /// Default gap: 16 KiB on local disks (a read through a gap costs bandwidth), 1 MiB on
    /// remote stores (a request costs a round trip).
    pub(crate) fn coalesce_gap(&self, remote: bool) -> u64 {
        use crate::ranges::{LOCAL_GAP, REMOTE_GAP};
        self.coalesce_gap.unwrap_or(if remote { REMOTE_GAP } else { LOCAL_GAP })
    }

    /// Whether damaged shards are skipped around rather than failing the open.
    pub(crate) fn skip_damage(&self) -> bool {
        self.on_damage == Some(DamagePolicy::Skip)
    }
    pub(crate) fn max_read(&self) -> u64 {
        self.max_read.unwrap_or(crate::ranges::MAX_MERGED).max(1)
    }
    /// The columns `columns=` keeps, `None` for all; empty names are ignored.
    pub(crate) fn column_list(&self) -> Option<Vec<&str>> {
        let list = self.columns.as_deref()?;
        Some(list.split(',').map(str::trim).filter(|c| !c.is_empty()).collect())
    }
    pub(crate) fn field_name(&self) -> &str {
        self.field.as_deref().unwrap_or("data")
    }

    /// The directory for indexes that cannot live next to their shards.
    pub fn index_cache_dir(&self) -> PathBuf {
        match &self.index_dir {
            Some(d) => d.clone(),
            None => user_cache_dir("index"),
        }
    }

    /// Memory for shards decoded whole ([`SourceOptions::decoded_bytes`]).
    pub(crate) fn decoded_budget(&self) -> usize {
        self.decoded_bytes.map_or(DEFAULT_DECODED_BYTES, |b| usize::try_from(b).unwrap_or(usize::MAX))
    }

    /// Most bytes one decode may produce (a decompressed shard or frame, a Parquet page or
    /// row group): [`SourceOptions::decoded_bytes`], but never under 16 MiB, so a small
    /// memory for what is kept still reads ordinary shards and pages.
    pub(crate) fn decode_cap(&self) -> usize {
        self.decoded_budget().max(MIN_DECODE_CAP)
    }

    /// Where shards decoded whole are spilled (see `source::spill`), `None` when the disk
    /// cache is off: `disk_cache=false` means no disk writes at all.
    pub(crate) fn spill_dir(&self) -> Option<PathBuf> {
        (self.disk_cache != Some(false)).then(|| user_cache_dir("spill"))
    }

    /// Where text tokenized for packing is kept ([`crate::tokens::tokenized`]):
    /// `$STOKER_CACHE_DIR/tokens`, else `$XDG_CACHE_HOME/stoker/tokens`, else `~/.cache/stoker/tokens`.
    pub fn tokens_cache_dir() -> PathBuf {
        user_cache_dir("tokens")
    }

    /// The disk cache directory remote sources use, `None` when the disk cache is off.
    pub fn disk_cache_dir(&self) -> Option<PathBuf> {
        if self.disk_cache == Some(false) {
            return None;
        }
        Some(self.disk_cache_dir.clone().unwrap_or_else(|| user_cache_dir("blocks")))
    }
}

/// The least [`SourceOptions::decode_cap`] is.
const MIN_DECODE_CAP: usize = 16 << 20;

/// Default of [`SourceOptions::decoded_bytes`].
const DEFAULT_DECODED_BYTES: usize = 512 << 20;

/// Every scalar in a JSON value, as text.
fn json_leaves(v: serde_json::Value) -> Vec<String> {
    match v {
        serde_json::Value::String(s) => vec![s],
        serde_json::Value::Array(a) => a.into_iter().flat_map(json_leaves).collect(),
        serde_json::Value::Object(m) => m.into_iter().flat_map(|(_, v)| json_leaves(v)).collect(),
        serde_json::Value::Null => Vec::new(),
        other => vec![other.to_string()],
    }
}
/// A known option of the JSON object `map` whose value alone does not parse (a string for a
/// count, a negative size), with why, if any.
fn wrong_option(map: serde_json::Map<String, serde_json::Value>) -> Option<(String, String)> {
    let keys = option_keys();
    map.into_iter().filter(|(k, _)| keys.contains(k)).find_map(|(k, v)| {
        let alone = serde_json::Value::Object([(k.clone(), v)].into_iter().collect());
        serde_json::from_value::<SourceOptions>(alone).err().map(|e| (k, e.to_string()))
    })
}

/// The most requests a source may keep in flight (`max_in_flight`): far beyond what any store
/// serves one client, and within what the fetch layer's semaphore can count.
pub const MAX_IN_FLIGHT: usize = 1 << 16;

fn max_in_flight<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<usize>, D::Error> {
    match Option::<usize>::deserialize(d)? {
        Some(n) if n > MAX_IN_FLIGHT => Err(serde::de::Error::custom(format!(
            "{n} requests in flight is more than the {MAX_IN_FLIGHT} a source may keep"
        ))),
        n => Ok(n),
    }
}

fn option_error(serde_msg: String) -> Error {
    // serde names the valid keys and variants already ("expected one of ..."); make sure the
    // message always lists the keys, also for errors serde words differently.
    Error::invalid_option(format!("{serde_msg}; valid options: {}", option_keys().join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_json_and_toml_agree() {
        let q = SourceOptions::from_query("layout=lmdb&field=img&concurrency=8&write_sidecar=false").unwrap();
        let j = SourceOptions::from_json(r#"{"layout":"lmdb","field":"img","concurrency":8,"write_sidecar":false}"#)
            .unwrap();
        let t: SourceOptions =
            toml::from_str("layout = \"lmdb\"\nfield = \"img\"\nconcurrency = 8\nwrite_sidecar = false").unwrap();
        assert_eq!(q, j);
        assert_eq!(q, t);
        assert!(SourceOptions::from_json(r#"{"layuot":"tar"}"#).unwrap_err().to_string().contains("layout"));
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_option_not_a_column() {
        let e = SourceOptions::from_json(r#"{"layout":"tar","concurrency":"x"}"#).unwrap_err().to_string();
        assert!(e.contains("option `concurrency`") && e.contains("expected usize"), "{e}");
        assert!(!e.contains("column") && !e.contains("valid options"), "{e}");
        let e = SourceOptions::from_json(r#"{"cache_bytes":-1}"#).unwrap_err().to_string();
        assert!(e.contains("option `cache_bytes`"), "{e}");
        // Each option named with its own reason, whatever the order of the keys.
        let e = SourceOptions::from_json(r#"{"timeout_ms":"x","concurrency":-1}"#).unwrap_err().to_string();
        let (timeout, count) = ("option `timeout_ms`: invalid type: string", "option `concurrency`: invalid value");
        assert!(e.contains(timeout) || e.contains(count), "{e}");
        // An unknown key is named as unknown, with the valid ones, not as another's wrong value.
        let e = SourceOptions::from_json(r#"{"suffle":true,"concurrency":-1}"#).unwrap_err().to_string();
        assert!(e.contains("unknown field `suffle`") && e.contains("valid options"), "{e}");
        // A credential of the wrong type is named, its value not shown.
        let e = SourceOptions::from_json(r#"{"secret_access_key":12345678}"#).unwrap_err().to_string();
        assert!(e.contains("secret_access_key") && !e.contains("12345678"), "{e}");
    }

    #[test]
    fn the_disk_cache_is_on_unless_turned_off() {
        let on = SourceOptions::default().disk_cache_dir().expect("on by default");
        assert!(on.ends_with("blocks"), "{}", on.display());
        let there = SourceOptions::from_query("disk_cache_dir=/tmp/x").unwrap();
        assert_eq!(there.disk_cache_dir(), Some(PathBuf::from("/tmp/x")));
        for off in ["disk_cache=false", "disk_cache=false&disk_cache_dir=/tmp/x"] {
            let o = SourceOptions::from_query(off).unwrap();
            assert_eq!(o.disk_cache_dir(), None, "{off}");
        }
    }

    #[test]
    fn merge_prefers_the_later_options() {
        let base = SourceOptions { layout: Some(Layout::Tar), concurrency: Some(2), ..Default::default() };
        let over = SourceOptions { concurrency: Some(9), ..Default::default() };
        let m = base.merged(over);
        assert_eq!((m.layout, m.concurrency), (Some(Layout::Tar), Some(9)));
    }
}
