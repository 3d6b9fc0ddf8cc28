//! The plan: every output sample, in output order, and the shard boundaries, decided up front
//! from keys and sizes alone so a rerun computes the same plan and can skip finished work.

use std::collections::HashMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use super::{names, PackOptions};
use crate::error::{Error, Result};
use crate::sample::{display_key, unescape_key, SampleMeta};
use crate::source::DynSampleSource;
use crate::uri::Layout;

/// One output sample: its key, the source samples it is made of, and its kept fields.
pub(crate) struct Out {
    pub key: String,
    /// Source indices, in source order (several only with `group`).
    pub parts: Vec<usize>,
    /// Kept fields: name as written, payload size.
    pub fields: Vec<(Arc<str>, u64)>,
    /// Bytes the sample takes in a tar shard (0 for LMDB).
    pub tar_bytes: u64,
}

impl Out {
    pub(crate) fn payload(&self) -> u64 {
        self.fields.iter().map(|f| f.1).sum()
    }
}

/// One tar shard of the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ShardPlan {
    /// File name in the destination.
    pub name: String,
    /// Index of its first output sample.
    pub first: usize,
    /// Number of samples.
    pub samples: usize,
    /// Exact file size.
    pub bytes: u64,
}

/// What `.stoker-pack.json` records: enough to tell "the same job, resume it" from "a
/// different dataset" and to check finished shards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PlanFile {
    pub format: String,
    pub version: u32,
    pub layout: Layout,
    /// The source as given (credentials redacted); informational.
    pub source: String,
    /// Hash of the options that shape the output and of every output key, field name and size.
    pub fingerprint: String,
    /// The source's version when the pack began (its files' sizes and times, or entity tags:
    /// [`crate::SampleSource::fingerprint`]), hex: a file rewritten at its size since is
    /// another pack's source, whose shards are not kept. `None` where the layout does not say,
    /// and in plans written before it was kept (which cannot tell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_version: Option<String>,
    pub samples: usize,
    pub payload_bytes: u64,
    /// LMDB: the field each record holds (its name is not stored in LMDB itself).
    pub fields: Vec<String>,
    pub shards: Vec<ShardPlan>,
    /// Set once every shard (or the LMDB file) and the indexes are in place.
    pub complete: bool,
}

pub(crate) const PLAN_FILE: &str = crate::source::PACK_RECORD;
const FORMAT: &str = "stoker-pack";
const VERSION: u32 = 1;

/// The output samples and, for tar, the shards.
pub(crate) struct Plan {
    pub outs: Vec<Out>,
    pub file: PlanFile,
}

/// Read every sample's key and field sizes (from indexes and listings, not payloads).
pub(crate) async fn metas(src: &Arc<DynSampleSource>) -> Result<Vec<SampleMeta>> {
    let n = src.len();
    futures::stream::iter((0..n).map(|i| {
        let src = src.clone();
        async move { src.meta(i).await }
    }))
    .buffered(64)
    .try_collect()
    .await
}

/// Decide the output: grouping, field selection, name checks, order and shard boundaries.
pub(crate) fn make(metas: Vec<SampleMeta>, opts: &PackOptions, source: &str, dest: &str) -> Result<Plan> {
    let fail = |reason: String| Error::Pack { dest: dest.to_string(), reason };
    let mut outs = group(metas, opts.group);
    if let Some(keep) = &opts.field {
        for o in &mut outs {
            o.fields.retain(|f| &*f.0 == keep.as_str());
            if o.fields.is_empty() {
                return Err(fail(format!(
                    "sample `{}` has no `{}` field; --field keeps one field and every sample needs it",
                    display_key(&o.key),
                    display_key(keep)
                )));
            }
        }
    }
    let mut field_names: Vec<String> = Vec::new();
    match opts.layout {
        Layout::Tar => check_tar(&mut outs, opts.group).map_err(fail)?,
        Layout::Lmdb => {
            check_lmdb(&mut outs).map_err(fail)?;
            for o in &outs {
                if !field_names.iter().any(|f| **f == *o.fields[0].0) {
                    field_names.push(o.fields[0].0.to_string());
                }
            }
        }
        other => {
            let what = match other {
                Layout::Mix => "a mix",
                Layout::Objects => "a directory of files",
                _ => other.as_str(),
            };
            return Err(Error::invalid_option(format!("pack writes `tar` or `lmdb`; {what} is something it reads")));
        }
    }
    let shards = match opts.layout {
        Layout::Tar => shard(&outs, opts),
        _ => Vec::new(),
    };
    let file = PlanFile {
        format: FORMAT.into(),
        version: VERSION,
        layout: opts.layout,
        source: source.to_string(),
        fingerprint: fingerprint(&outs, opts, source),
        source_version: None,
        samples: outs.len(),
        payload_bytes: outs.iter().map(Out::payload).sum(),
        fields: field_names,
        shards,
        complete: false,
    };
    Ok(Plan { outs, file })
}

/// Without `group`, one output sample per source sample. With it, samples sharing a key
/// become one, placed where the key first appears, fields in source order.
fn group(metas: Vec<SampleMeta>, group: bool) -> Vec<Out> {
    let mut outs: Vec<Out> = Vec::with_capacity(metas.len());
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, m) in metas.into_iter().enumerate() {
        if group {
            if let Some(&at) = seen.get(&m.key) {
                outs[at].parts.push(i);
                outs[at].fields.extend(m.fields);
                continue;
            }
            seen.insert(m.key.clone(), outs.len());
        }
        outs.push(Out { key: m.key, parts: vec![i], fields: m.fields, tar_bytes: 0 });
    }
    outs
}

fn check_tar(outs: &mut [Out], grouped: bool) -> std::result::Result<(), String> {
    check_tar_renames(outs)?;
    for i in 0..outs.len() {
        let o = &outs[i];
        if o.fields.is_empty() {
            return Err(format!(
                "sample `{}` has no fields; a tar shard cannot hold an empty sample",
                display_key(&o.key)
            ));
        }
        if !grouped && i > 0 && outs[i - 1].key == o.key {
            return Err(format!(
                "samples {} and {i} share the key `{}`; in one tar they would read back as one sample. Pass --group \
                 to merge samples sharing a key into one (fields side by side), or give them distinct keys",
                i - 1,
                display_key(&o.key)
            ));
        }
        let key = names::tar_key(&o.key).into_owned();
        let mut bytes = 0;
        let mut written: Vec<String> = Vec::with_capacity(o.fields.len());
        for (name, size) in &o.fields {
            let member = names::member(&key, name)?;
            if written.contains(&member) {
                return Err(format!(
                    "sample `{}` has two `{}` fields (field names are compared lower-case, as readers do)",
                    display_key(&o.key),
                    display_key(&name.to_ascii_lowercase())
                ));
            }
            bytes += names::member_bytes(&member, *size);
            written.push(member);
        }
        outs[i].fields.iter_mut().for_each(|f| f.0 = Arc::from(f.0.to_ascii_lowercase()));
        outs[i].tar_bytes = bytes;
        outs[i].key = key;
    }
    Ok(())
}

/// Keys that tar names differently ([`names::tar_key`]: a byte that is not UTF-8) must not
/// take the name of another key: a reader would see two samples as one, or one under
/// another's key.
fn check_tar_renames(outs: &[Out]) -> std::result::Result<(), String> {
    let clash = |a: &str, b: &str, name: &str| {
        format!(
            "keys `{}` and `{}` would both be written as `{}` (a byte that is not UTF-8 is written as %NN); give \
             them distinct keys",
            display_key(a),
            display_key(b),
            display_key(name)
        )
    };
    let mut renamed: HashMap<String, &str> = HashMap::new();
    for o in outs {
        if let std::borrow::Cow::Owned(name) = names::tar_key(&o.key) {
            match renamed.get(&name) {
                Some(other) if *other != o.key => return Err(clash(other, &o.key, &name)),
                _ => renamed.insert(name, &o.key),
            };
        }
    }
    if renamed.is_empty() {
        return Ok(());
    }
    match outs.iter().find_map(|o| renamed.get(&o.key).map(|orig| (orig, &o.key))) {
        Some((orig, key)) => Err(clash(orig, key, key)),
        None => Ok(()),
    }
}

/// LMDB holds one value per key, in key byte order: one field per sample, unique keys. A
/// key's bytes are what [`unescape_key`] gives (an LMDB source's keys come back exactly).
fn check_lmdb(outs: &mut [Out]) -> std::result::Result<(), String> {
    for o in outs.iter() {
        if o.fields.len() != 1 {
            let names: Vec<String> = o.fields.iter().map(|f| display_key(&f.0).into_owned()).collect();
            return Err(format!(
                "sample `{}` has {} fields ({}); an LMDB record holds one value: keep one with --field NAME \
                 (one LMDB per field if you need them all), or pack as tar, which keeps every field",
                display_key(&o.key),
                names.len(),
                names.join(", ")
            ));
        }
        let len = unescape_key(&o.key).len();
        if len == 0 || len > 511 {
            return Err(format!(
                "key `{}` is {len} bytes; LMDB keys must be 1 to 511 bytes",
                display_key(&o.key.chars().take(80).collect::<String>()),
            ));
        }
    }
    outs.sort_by(|a, b| unescape_key(&a.key).cmp(&unescape_key(&b.key)));
    if let Some(w) = outs.windows(2).find(|w| unescape_key(&w[0].key) == unescape_key(&w[1].key)) {
        return Err(format!(
            "two samples share the key `{}` (source samples {:?} and {:?}); an LMDB key holds one value. \
             Give them distinct keys, or pack as tar with --group",
            display_key(&w[0].key),
            w[0].parts,
            w[1].parts
        ));
    }
    Ok(())
}

/// Shard boundaries: a shard closes before the sample that would take it past `shard_size`
/// (a bigger sample gets a shard of its own) or at `samples_per_shard`.
fn shard(outs: &[Out], opts: &PackOptions) -> Vec<ShardPlan> {
    const END: u64 = 1024;
    let per = opts.samples_per_shard.unwrap_or(usize::MAX).max(1);
    let mut shards: Vec<ShardPlan> = Vec::new();
    let mut cur: Option<ShardPlan> = None;
    for (i, o) in outs.iter().enumerate() {
        if let Some(c) = &cur {
            if c.samples >= per || c.bytes + o.tar_bytes > opts.shard_size.max(1) {
                shards.extend(cur.take());
            }
        }
        let c = cur.get_or_insert_with(|| ShardPlan {
            name: format!("{}-{:06}.tar", opts.prefix, shards.len()),
            first: i,
            samples: 0,
            bytes: END,
        });
        c.samples += 1;
        c.bytes += o.tar_bytes;
    }
    shards.extend(cur);
    shards
}

/// Where `source` (a source's display) is: without its options, and a local path made
/// absolute with its links resolved, so a rerun from another directory, or naming it `./data`
/// or `data/`, is the same pack.
fn location(source: &str) -> String {
    let bare = crate::uri::source_uri(source).split('?').next().unwrap_or_default();
    std::fs::canonicalize(bare).map_or_else(|_| bare.to_string(), |p| p.display().to_string())
}

/// FNV-1a over everything that shapes the output, two lanes for 128 bits: the options, every
/// key, field name and size, and where the source is (its display without the options, which
/// may change between runs: credentials, concurrency). Keys and sizes alone let a rerun from
/// another directory of samples of the same names and sizes keep the first run's shards as
/// its own.
fn fingerprint(outs: &[Out], opts: &PackOptions, source: &str) -> String {
    let mut h = [0xcbf29ce484222325u64, 0x84222325cbf29ce4u64];
    let mut eat = |bytes: &[u8]| {
        for (lane, h) in h.iter_mut().enumerate() {
            for &b in bytes {
                *h = (*h ^ (b as u64 + lane as u64)).wrapping_mul(0x100000001b3);
            }
            *h = (*h ^ 0xff).wrapping_mul(0x100000001b3);
        }
    };
    let shaping = format!(
        "{}|{}|{:?}|{}|{}|{:?}",
        opts.layout, opts.shard_size, opts.samples_per_shard, opts.prefix, opts.group, opts.field
    );
    eat(shaping.as_bytes());
    eat(location(source).as_bytes());
    for o in outs {
        eat(o.key.as_bytes());
        for (name, size) in &o.fields {
            eat(name.as_bytes());
            eat(&size.to_le_bytes());
        }
        for p in &o.parts {
            eat(&(*p as u64).to_le_bytes());
        }
    }
    format!("{:016x}{:016x}", h[0], h[1])
}

impl PlanFile {
    pub(super) fn parse(bytes: &[u8]) -> std::result::Result<Self, String> {
        let p: PlanFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if p.format != FORMAT || p.version != VERSION {
            return Err(format!("format {} v{} is not {FORMAT} v{VERSION}", p.format, p.version));
        }
        // The names are what `--force` deletes and what a resume keeps: a plan written by
        // `pack` names its own tar shards only, and one naming anything else (another file of
        // the destination, a path into a linked directory) was not written by it.
        if let Some(s) = p.shards.iter().find(|s| !s.name.ends_with(".tar") || super::check_plain("", &s.name).is_err())
        {
            return Err(format!("it names `{}` as a shard, which pack never writes", s.name.escape_debug()));
        }
        Ok(p)
    }

    pub(super) fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key: &str, fields: &[(&str, u64)]) -> SampleMeta {
        SampleMeta { key: key.into(), fields: fields.iter().map(|(n, s)| (Arc::from(*n), *s)).collect() }
    }

    fn opts(layout: Layout) -> PackOptions {
        PackOptions { layout, shard_size: 4096, ..PackOptions::default() }
    }

    #[test]
    fn group_merges_samples_sharing_a_key_where_it_first_appears() {
        let m = vec![meta("b", &[("cls", 1)]), meta("a", &[("jpg", 10)]), meta("b", &[("jpg", 20)])];
        let p = make(m.clone(), &PackOptions { group: true, ..opts(Layout::Tar) }, "s", "d").unwrap();
        assert_eq!(p.outs.len(), 2);
        assert_eq!((p.outs[0].key.as_str(), p.outs[0].parts.clone()), ("b", vec![0, 2]));
        assert_eq!(p.outs[0].fields.iter().map(|f| &*f.0).collect::<Vec<_>>(), ["cls", "jpg"]);
        // Without grouping the non-adjacent `b`s stay two samples, which webdataset reads as two.
        assert_eq!(make(m, &opts(Layout::Tar), "s", "d").unwrap().outs.len(), 3);
    }

    #[test]
    fn adjacent_equal_keys_need_group() {
        let m = vec![meta("a", &[("jpg", 1)]), meta("a", &[("cls", 1)])];
        let e = make(m, &opts(Layout::Tar), "s", "d").err().unwrap().to_string();
        assert!(e.contains("--group") && e.contains("`a`"), "{e}");
    }

    #[test]
    fn lmdb_wants_one_field_and_sorts_by_key() {
        let m = vec![meta("b", &[("jpg", 1), ("cls", 1)]), meta("a", &[("jpg", 2), ("cls", 1)])];
        let e = make(m.clone(), &opts(Layout::Lmdb), "s", "d").err().unwrap().to_string();
        assert!(e.contains("--field NAME") && e.contains("jpg, cls"), "{e}");
        let p = make(m, &PackOptions { field: Some("jpg".into()), ..opts(Layout::Lmdb) }, "s", "d").unwrap();
        assert_eq!(p.outs.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(p.file.fields, ["jpg"]);
    }

    #[test]
    fn shards_close_before_the_size_limit_and_oversize_samples_go_alone() {
        let m = (0..10).map(|i| meta(&format!("k{i}"), &[("bin", if i == 4 { 9000 } else { 1000 })])).collect();
        let p = make(m, &opts(Layout::Tar), "s", "d").unwrap();
        let counts: Vec<usize> = p.file.shards.iter().map(|s| s.samples).collect();
        // 1000-byte payloads take 512 + 1024 each: two fit under 4096 with the end blocks.
        assert_eq!(counts, [2, 2, 1, 2, 2, 1]);
        assert!(p.file.shards.iter().all(|s| s.bytes <= 4096 || s.samples == 1));
        assert_eq!(p.file.shards[5].name, "shard-000005.tar");
        let q = make(
            (0..5).map(|i| meta(&format!("k{i}"), &[("bin", 1)])).collect(),
            &PackOptions { samples_per_shard: Some(2), shard_size: u64::MAX, ..opts(Layout::Tar) },
            "s",
            "d",
        )
        .unwrap();
        assert_eq!(q.file.shards.iter().map(|s| s.samples).collect::<Vec<_>>(), [2, 2, 1]);
    }

    #[test]
    fn fingerprint_follows_sizes_and_options() {
        let m = || vec![meta("a", &[("jpg", 1)]), meta("b", &[("jpg", 2)])];
        let fp = |m, o: &PackOptions| make(m, o, "s", "d").unwrap().file.fingerprint;
        let base = fp(m(), &opts(Layout::Tar));
        assert_eq!(base, fp(m(), &opts(Layout::Tar)));
        assert_ne!(base, fp(vec![meta("a", &[("jpg", 1)]), meta("b", &[("jpg", 3)])], &opts(Layout::Tar)));
        assert_ne!(base, fp(m(), &PackOptions { prefix: "train".into(), ..opts(Layout::Tar) }));
        // Another source of the same names and sizes is another pack; the same source with
        // other options (credentials, concurrency) is the same.
        let at = |src: &str| make(m(), &opts(Layout::Tar), src, "d").unwrap().file.fingerprint;
        assert_eq!(base, at("s?concurrency=8"));
        assert_ne!(base, at("other"));
        // A local source however it was named: relative, with `./` or a trailing `/`.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let one = at(&format!("tar:{d}"));
        assert_eq!(one, at(&format!("tar:{d}/./")));
        assert_eq!(one, at(&format!("tar:{d}/?concurrency=4")));
        assert_ne!(one, at(&format!("tar:{d}/other")));
    }
}
