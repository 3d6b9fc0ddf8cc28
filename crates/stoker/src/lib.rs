#![warn(unreachable_pub)]
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod batch;
mod buffer;
pub mod cache;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod decode;
pub mod demo;
pub mod diagnose;
#[cfg(doctest)]
mod docs;
pub mod error;
mod escape;
pub mod fetch;
pub mod fork;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod loader;
mod memory;
mod npy;
pub mod pack;
pub mod pinned;
mod prefetch;
pub mod ranges;
mod redact;
pub mod sample;
pub mod sampler;
mod small_file;
pub mod source;
pub mod stats;
pub mod store;
pub mod tokens;
pub mod uri;

// The public async entry points a binary awaits (open, index, pack, diagnose, the token
// writers and loader) box their work in a plain function of this crate (`*_boxed`). An
// `async fn`'s body is a generic item to rustc: each crate that awaits it compiles its own copy
// of it and of everything it awaits, which for `open` is every layout's code. Boxed here, the
// CLI and the Python extension compile a few lines each instead of the library again.
pub use batch::Batch;
pub use error::{Error, ErrorKind, Result};
pub use loader::{ErrorPolicy, Loader, LoaderConfig, LoaderState};
pub use sample::{Field, Sample, SampleMeta};
pub use source::{
    index, index_with_progress, open, Capability, DynSampleSource, IndexReport, MixSource, MixSpec, SampleSource,
    SourceInfo,
};
pub use stats::{Damage, DamageCause, SkippedByCause, StatsSnapshot};
pub use uri::{DamagePolicy, Layout, SourceOptions};
