//! Source URIs and options: `file:///data/shards/train-{000..127}.tar?layout=tar`.
//!
//! The options a URI query carries are the same [`SourceOptions`] a JSON or TOML config file
//! deserialises into, so a config file and a query string say the same thing.

mod braces;
mod dirs;
mod grammar;
mod options;
mod overlap;

pub use braces::expand_braces;
pub use grammar::{parse, Location, RemoteLocation, SourceUri, SCHEMES};
pub use options::{option_keys, Behind, DamagePolicy, Eviction, Layout, SourceOptions, INDEX_FILE, MAX_IN_FLIGHT};
pub(crate) use overlap::{source_uri, writes_into};
// Redaction sits at the crate root, below the error type that uses it too.
#[cfg(feature = "fuzzing")]
pub(crate) use crate::redact::is_secret_key;
pub use crate::redact::{is_secret_option, redact, redact_text, scrub};
pub(crate) use crate::redact::{redact_endpoint, secret_values, toml_error};
