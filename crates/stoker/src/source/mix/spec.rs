//! Mix files: the sources of a mix, their weights and how an epoch is made of them, read from
//! JSON or TOML (or inline `mix:{JSON}`), with credentials kept out of parse errors.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::uri::{self, SourceOptions};

/// One source of a mix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixEntry {
    /// The source's URI (any form [`crate::open`] takes, except another mix).
    pub uri: String,
    /// Its weight: positive; only the ratios between weights matter.
    pub weight: f64,
    /// Its name in the `__source__` field and in stats; default: the URI without its query.
    #[serde(default)]
    pub name: Option<String>,
    /// Its open options (over the options the whole mix is opened with).
    #[serde(default)]
    pub options: SourceOptions,
}

/// What to do with a field that one source's samples lack and another's have.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum FillMissing {
    /// `true`: fill every missing field with empty bytes; `false`: fail (the default).
    All(bool),
    /// Fill the fields named with the given text (UTF-8 bytes); any other missing field fails.
    Fields(BTreeMap<String, String>),
}

/// A mix: its sources and how an epoch is made of them. The serde form is the mix file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixSpec {
    /// The sources, each with its weight.
    pub sources: Vec<MixEntry>,
    /// Samples per epoch; default: without replacement, the longest epoch in which no
    /// source's share exceeds its size; with replacement, every source's size added up.
    #[serde(default)]
    pub epoch_length: Option<u64>,
    /// Let a source give an epoch more samples than it has, repeating them evenly.
    #[serde(default)]
    pub replacement: bool,
    /// Fill fields missing from a source instead of failing.
    #[serde(default)]
    pub fill_missing: Option<FillMissing>,
    /// What the weights share out: samples (the [`Loader`](crate::Loader)'s mixes) or tokens
    /// (read by [`TokenLoader`](crate::tokens::TokenLoader), which packs by tokens).
    #[serde(default)]
    pub weight_by: WeightBy,
}

/// What a mix's weights share out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightBy {
    /// Each source's share of the samples.
    #[default]
    Samples,
    /// Each source's share of the tokens (token corpora, or text with a tokenizer).
    Tokens,
}

const MIX_PREFIX: &str = "mix:";

/// The largest mix file read (a mix of thousands of sources is some hundred KB).
const MAX_MIX_FILE_BYTES: u64 = 64 << 20;

/// Whether `uri` names a mix: `mix:...`, or a path ending `.mix.json` or `.mix.toml`.
pub fn is_mix_uri(uri: &str) -> bool {
    let path = uri.split('?').next().unwrap_or(uri);
    uri.starts_with(MIX_PREFIX) || path.ends_with(".mix.json") || path.ends_with(".mix.toml")
}

impl MixSpec {
    /// Parse a mix from JSON text. Errors never quote credential values.
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| spec_error("JSON", &e.to_string(), text))
    }

    /// Parse a mix from TOML text. Errors never quote credential values, nor the line of a
    /// file that holds any (toml quotes the offending line).
    pub fn from_toml(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| spec_error("TOML", &uri::toml_error(&e, text), text))
    }

    /// Read a mix file (`.json` or `.toml`; otherwise JSON if it starts with `{`). Relative
    /// local paths in it are taken relative to the file's directory.
    pub fn load(path: &Path) -> Result<Self> {
        // A mix file is text of a few KB; a path given by mistake (a corpus) is refused unread.
        let text = crate::store::read_capped(path, MAX_MIX_FILE_BYTES)
            .and_then(|b| String::from_utf8(b).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
            .map_err(|e| Error::io(path.display(), e))?;
        let name = path.to_string_lossy();
        let json = name.ends_with(".json") || (!name.ends_with(".toml") && text.trim_start().starts_with('{'));
        let parsed = if json { Self::from_json(&text) } else { Self::from_toml(&text) };
        let mut spec = parsed.map_err(|e| match e {
            Error::InvalidOption { message } => {
                Error::invalid_option(format!("mix file {}: {message}", path.display()))
            }
            other => other,
        })?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        for e in &mut spec.sources {
            if e.name.is_none() {
                e.name = Some(default_name(&e.uri));
            }
            if !e.uri.contains("://") && !Path::new(&e.uri).is_absolute() {
                e.uri = dir.join(&e.uri).to_string_lossy().into_owned();
            }
        }
        Ok(spec)
    }

    /// Parse the forms [`is_mix_uri`] accepts.
    pub fn from_uri(uri: &str) -> Result<Self> {
        let rest = uri.strip_prefix(MIX_PREFIX).unwrap_or(uri);
        if rest.trim_start().starts_with('{') {
            return Self::from_json(rest);
        }
        Self::load(Path::new(rest))
    }
}

/// A mix file's parse error, with any credential values in the text scrubbed from it.
fn spec_error(format: &str, message: &str, text: &str) -> Error {
    let mut secrets = Vec::new();
    collect_secrets(&serde_json::from_str(text).unwrap_or_default(), &mut secrets);
    if let Ok(v) = toml::from_str::<serde_json::Value>(text) {
        collect_secrets(&v, &mut secrets);
    }
    // Secret keys and their values as written, also in text that does not parse at all.
    secrets.extend(uri::secret_values(text).unwrap_or_default());
    Error::invalid_option(format!("bad mix {format}: {}", uri::redact_text(&uri::scrub(message, &secrets))))
}

fn collect_secrets(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                if uri::is_secret_option(k) {
                    match v {
                        serde_json::Value::String(s) => out.push(s.clone()),
                        other => out.push(other.to_string()),
                    }
                } else {
                    collect_secrets(v, out);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_secrets(v, out)),
        _ => {}
    }
}

/// The name a source gets without one: its URI as written, without the query (which may
/// hold credentials).
pub(super) fn default_name(uri: &str) -> String {
    let base = uri.split('?').next().unwrap_or(uri).trim_end_matches('/');
    uri::redact(if base.is_empty() { uri } else { base })
}
