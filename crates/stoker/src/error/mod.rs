//! The one public error type.

use std::fmt;

mod cause;
mod pinned;
mod sampler;
mod show;

pub use cause::DamageCause;
pub use pinned::PinnedError;
pub use sampler::{SamplerError, SamplerResult};

// Keys and field names come from data: messages show them escaped (no raw control characters,
// distinct keys print distinctly). Messages from stores and HTTP clients may quote a URL with
// its credentials (a redirect's, an endpoint's userinfo): they are redacted when shown.
use crate::escape::{display_key, escape_controls};
use crate::redact::redact_text;
use show::{Doing, Hint};

/// `: sample `KEY` field `FIELD``, leaving out what is not known (a shard damaged before any
/// sample of it is read names neither).
fn sample_and_field(key: &str, field: &str) -> String {
    match (key.is_empty(), field.is_empty()) {
        (true, true) => String::new(),
        (false, true) => format!(": sample `{}`", display_key(key)),
        (true, false) => format!(": field `{}`", display_key(field)),
        (false, false) => format!(": sample `{}` field `{}`", display_key(key), display_key(field)),
    }
}

/// Result alias used across Stoker.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while opening or reading a source.
///
/// Every variant names what failed (a URI with credentials redacted, a shard, an offset, a
/// key) and, where there is one, what to do about it. [`Error::is_retryable`] tells whether
/// trying the same request again can help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URI could not be understood.
    #[error("invalid source URI `{uri}`: {reason}")]
    InvalidUri {
        /// The URI, credentials redacted.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An option (from a URI query, a config file or code) is unknown or has a bad value.
    #[error("invalid option: {message}")]
    InvalidOption {
        /// What is wrong, including the valid choices.
        message: String,
    },

    /// A path or object does not exist.
    #[error("not found: {what}{hint}", hint = Hint(.hint))]
    NotFound {
        /// What was looked for.
        what: String,
        /// What to do about it.
        hint: Option<String>,
    },

    /// The location exists but holds no samples.
    #[error("no samples in {uri}: {reason}")]
    Empty {
        /// The source URI, credentials redacted.
        uri: String,
        /// What was looked for there.
        reason: String,
    },

    /// A local I/O operation failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A store (local file system or object store) request failed.
    #[error("store error reading {path}: {source}")]
    Store {
        /// The object, relative to the store root, with the store URI.
        path: String,
        /// The object_store error, redacted wherever it is shown.
        #[source]
        source: StoreError,
    },

    /// A remote read or write failed for good: not transient, or still failing after every
    /// attempt.
    #[error(
        "{doing} {object} ({what}) failed after {attempts} attempt(s): {}{hint}",
        redact_text(.message),
        doing = Doing(.what),
        hint = Hint(.hint)
    )]
    Fetch {
        /// The object, as a URI with credentials redacted.
        object: String,
        /// Which bytes.
        what: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        message: String,
        /// What to do about it.
        hint: Option<String>,
        /// Whether the last failure was transient (the retry budget ran out).
        transient: bool,
    },

    /// An object is not the version a read is pinned to: it was replaced or modified after it
    /// was first read (or listed, or indexed) in this run. Its new bytes are never delivered.
    #[error(
        "{object} changed while it was being read: {reason}; the run cannot go on with a mix of versions: reopen the \
         source (and run `stoker index` again if the dataset has a manifest)"
    )]
    Changed {
        /// The object, credentials redacted.
        object: String,
        /// What differs.
        reason: String,
    },

    /// A tar shard is malformed: truncated, bad checksum, not a tar at all.
    #[error("corrupt tar shard {shard} at byte {offset}: {reason}")]
    CorruptTar {
        /// The shard path or URI.
        shard: String,
        /// Byte offset in the shard where the problem was found.
        offset: u64,
        /// What is wrong and what to do.
        reason: String,
    },

    /// A payload's bytes do not match the checksum recorded for them (by `stoker pack`,
    /// `stoker index --checksums`, or the format itself): they were damaged after they were
    /// written, and are never delivered.
    #[error("corrupt data in {shard}{}: {reason}", sample_and_field(.key, .field))]
    CorruptData {
        /// The shard or object, credentials redacted.
        shard: String,
        /// The sample key.
        key: String,
        /// The field.
        field: String,
        /// What did not match and what to do.
        reason: String,
    },

    /// A sidecar index or manifest could not be parsed or does not match its shard.
    #[error("bad index {path}: {reason}")]
    BadIndex {
        /// The index file.
        path: String,
        /// What is wrong.
        reason: String,
    },

    /// An LMDB environment could not be opened or read.
    #[error("LMDB error in {path}: {reason}")]
    Lmdb {
        /// The environment directory.
        path: String,
        /// What failed and what to do.
        reason: String,
    },

    /// `pack` cannot write the destination as asked (a name that could escape, a key clash,
    /// a destination holding something else).
    #[error("cannot pack into {dest}: {reason}")]
    Pack {
        /// The destination, credentials redacted.
        dest: String,
        /// What is wrong and what to do.
        reason: String,
    },

    /// A sample index past the end of the source.
    #[error("sample index {index} out of range: the source has {len} samples")]
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// The number of samples.
        len: usize,
    },

    /// A sample lacks the field asked for.
    #[error("sample {} has no field `{}`; it has: {}", display_key(.key), display_key(.field), escape_controls(.available))]
    MissingField {
        /// The sample key.
        key: String,
        /// The field asked for.
        field: String,
        /// The fields it does have, comma separated.
        available: String,
    },

    /// A sample's field could not be decoded (a corrupt, truncated, unsupported or oversized
    /// image; a label that is not an integer; an array of another shape than the run's).
    #[error(
        "cannot decode field `{}` of sample `{}` (index {index}) in {source_name}: {reason}",
        display_key(.field),
        display_key(.key)
    )]
    Decode {
        /// The source, credentials redacted.
        source_name: String,
        /// The sample key.
        key: String,
        /// The sample's index in the source.
        index: u64,
        /// The field.
        field: String,
        /// What is wrong and what to do.
        reason: String,
    },

    /// The sources of a mix do not have the same fields: a sample lacks a field the mix's
    /// schema holds (and no fill was given), or has one it does not hold.
    #[error("mix source `{source_name}`: {reason}")]
    MixSchema {
        /// The mix's name for the source.
        source_name: String,
        /// The field at fault.
        field: String,
        /// What is wrong and what to do.
        reason: String,
    },

    /// The feature or scheme is not available in this build or not implemented yet.
    #[error("not supported: {what}")]
    NotSupported {
        /// What was asked for, and the alternatives.
        what: String,
    },

    /// A sampler configuration or resume state is invalid (rank, world size, window...).
    #[error("sampler: {0}")]
    Sampler(#[from] SamplerError),

    /// Pinned memory or the GPU copy path failed, or CUDA is not available here.
    #[error(transparent)]
    Pinned(#[from] PinnedError),

    /// An error shared by several waiters of one fetch (single-flight caches). Whether a
    /// caller sees it wrapped depends on timing: match on [`Error::kind`], which looks through.
    #[error("{0}")]
    Shared(std::sync::Arc<Error>),

    /// A function the caller supplied (a transform, a consumer step, a callback) failed or
    /// panicked. Its own error is the [`source`](std::error::Error::source).
    #[error("{what} failed: {source}")]
    Callback {
        /// Which function, e.g. `the transform`.
        what: String,
        /// Its error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The system would not give Stoker a resource it needs: threads, a runtime.
    #[error("cannot start {what}: {source} (the system is short of threads or memory: lower the thread counts)")]
    Resource {
        /// What could not be started.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A bug in Stoker: a background task panicked or was cancelled, or an internal invariant
    /// did not hold.
    #[error("internal error: {0} (a bug in Stoker: please report it)")]
    Internal(String),
}

/// What kind of failure an [`Error`] is, whatever variant carries it (and through
/// [`Error::Shared`]): match on this rather than on variants.
///
/// Only [`Io`](ErrorKind::Io), [`Remote`](ErrorKind::Remote) and
/// [`Resource`](ErrorKind::Resource) errors can be retryable ([`Error::is_retryable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A bad URI, option, index, field name, mix schema or sampler setting: the caller's input.
    InvalidInput,
    /// A path, object or bucket does not exist.
    NotFound,
    /// The location exists but holds no samples.
    Empty,
    /// Asked for something this build or this source does not do.
    Unsupported,
    /// Stored bytes are damaged: a tar shard, a checksum mismatch, an index, an LMDB file.
    Corrupt,
    /// A sample's field could not be decoded.
    Decode,
    /// A local I/O operation failed.
    Io,
    /// A remote store failed (after retries when transient).
    Remote,
    /// The destination or the data conflict with what was asked: a pack destination holding
    /// something else, a source that changed while packing, an object replaced while a run
    /// read it.
    Conflict,
    /// CUDA was asked for but cannot be used here.
    CudaUnavailable,
    /// A CUDA driver call failed.
    Cuda,
    /// A function the caller supplied failed.
    Callback,
    /// The system would not give a thread or runtime.
    Resource,
    /// A bug in Stoker.
    Internal,
}

impl ErrorKind {
    /// A short lowercase name, e.g. `not_found`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Empty => "empty",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Decode => "decode",
            ErrorKind::Io => "io",
            ErrorKind::Remote => "remote",
            ErrorKind::Conflict => "conflict",
            ErrorKind::CudaUnavailable => "cuda_unavailable",
            ErrorKind::Cuda => "cuda",
            ErrorKind::Callback => "callback",
            ErrorKind::Resource => "resource",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Error {
    /// What kind of failure this is, the same whether or not it reached the caller through
    /// a single-flight cache ([`Error::Shared`]).
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as K;
        use PinnedError as P;
        match self {
            Error::InvalidUri { .. }
            | Error::InvalidOption { .. }
            | Error::IndexOutOfRange { .. }
            | Error::MissingField { .. }
            | Error::MixSchema { .. }
            | Error::Sampler(_) => K::InvalidInput,
            Error::NotFound { .. } => K::NotFound,
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => K::NotFound,
            Error::Store { source, .. } if matches!(source.inner(), object_store::Error::NotFound { .. }) => {
                K::NotFound
            }
            Error::Empty { .. } => K::Empty,
            Error::NotSupported { .. } => K::Unsupported,
            Error::CorruptTar { .. } | Error::CorruptData { .. } | Error::BadIndex { .. } | Error::Lmdb { .. } => {
                K::Corrupt
            }
            Error::Decode { .. } => K::Decode,
            Error::Io { .. } => K::Io,
            Error::Store { .. } | Error::Fetch { .. } => K::Remote,
            Error::Pack { .. } | Error::Changed { .. } => K::Conflict,
            Error::Pinned(P::CudaUnavailable { .. }) => K::CudaUnavailable,
            Error::Pinned(P::Cuda { .. }) => K::Cuda,
            Error::Pinned(P::TooLarge { .. } | P::Config { .. }) => K::InvalidInput,
            Error::Shared(e) => e.kind(),
            Error::Callback { .. } => K::Callback,
            Error::Resource { .. } => K::Resource,
            Error::Internal(_) => K::Internal,
        }
    }

    /// Whether the same request may succeed if tried again (a transient I/O or store failure,
    /// or a system briefly short of threads).
    ///
    /// Only errors of kind [`Io`](ErrorKind::Io), [`Remote`](ErrorKind::Remote) and
    /// [`Resource`](ErrorKind::Resource) can be: corrupt data, bad URIs, missing objects and
    /// out-of-range indices never are.
    pub fn is_retryable(&self) -> bool {
        if !matches!(self.kind(), ErrorKind::Io | ErrorKind::Remote | ErrorKind::Resource) {
            return false;
        }
        match self {
            Error::Io { source, .. } | Error::Resource { source, .. } => io_retryable(source),
            // A generic store failure is how object_store reports transport errors; the retry
            // layer decides how often to try, this only says whether trying can help.
            Error::Store { source, .. } => {
                matches!(source.inner(), object_store::Error::Generic { .. } | object_store::Error::JoinError { .. })
            }
            Error::Fetch { transient, .. } => *transient,
            Error::Shared(e) => e.is_retryable(),
            _ => false,
        }
    }

    /// A file read whole (`shown`: an index, a manifest, a list of names) that is `len`
    /// bytes, more than the `most` it may be (see
    /// [`Store::get_at_most`](crate::store::Store::get_at_most)).
    pub(crate) fn too_large(shown: &str, len: u64, most: u64) -> Self {
        Error::BadIndex {
            path: shown.to_string(),
            reason: format!(
                "it is {len} bytes, more than the {most} Stoker reads whole of a file that describes data (an \
                 index, a manifest, a list of names): it is not such a file, or it is damaged; name the dataset's \
                 own, or split a dataset this large into directories with an index each"
            ),
        }
    }

    pub(crate) fn io(path: impl fmt::Display, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            return Error::NotFound {
                what: path.to_string(),
                hint: Some("check the path; relative paths are resolved from the current directory".into()),
            };
        }
        Error::Io { path: path.to_string(), source }
    }

    /// Why a sample failed to read, for counting skips by cause.
    pub fn skip_cause(&self) -> DamageCause {
        use DamageCause as C;
        match self {
            Error::CorruptTar { .. } => C::DamagedHeader,
            Error::CorruptData { .. } => C::ChecksumMismatch,
            // A changed object (local or remote) is not a failed read but a file that is no
            // longer the one indexed: unreadable as indexed.
            Error::Io { .. } | Error::NotFound { .. } | Error::BadIndex { .. } | Error::Changed { .. } => {
                C::UnreadableShard
            }
            Error::Fetch { .. } | Error::Store { .. } => C::RemoteError,
            Error::Shared(e) => e.skip_cause(),
            _ => C::Other,
        }
    }

    /// `shown`'s `what` (e.g. "Parquet files") refused by a build without `feature`: what
    /// failed and how to get a build that has it.
    #[cfg_attr(all(feature = "parquet", feature = "hdf5", feature = "tokenizers"), allow(dead_code))]
    pub(crate) fn without_feature(shown: &str, what: &str, feature: &str) -> Self {
        Error::NotSupported {
            what: format!(
                "{shown}: reading {what} needs Stoker's `{feature}` feature, which this build was compiled \
                 without: rebuild with it (`--features {feature}` for stoker-cli, `features = [\"{feature}\"]` on \
                 the `stoker` dependency); the default features and the Python wheel have it"
            ),
        }
    }

    pub(crate) fn invalid_option(message: impl Into<String>) -> Self {
        Error::InvalidOption { message: message.into() }
    }

    /// A caller-supplied function (`what`, e.g. `the transform`) failed with `source`.
    pub fn callback(what: impl Into<String>, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Callback { what: what.into(), source: source.into() }
    }

    /// A background task of Stoker's own that panicked or was cancelled: a bug.
    pub(crate) fn task(e: tokio::task::JoinError) -> Self {
        let what = if e.is_panic() { "a background task panicked" } else { "a background task was cancelled" };
        Error::Internal(format!("{what}: {e}"))
    }

    /// A background task that ran a caller-supplied function (`what`): a panic is the
    /// function's; a cancellation is Stoker's.
    pub(crate) fn callback_task(what: &str, e: tokio::task::JoinError) -> Self {
        if e.is_panic() {
            return Error::callback(what, format!("it panicked: {}", panic_message(e.into_panic())));
        }
        Error::task(e)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Error::Internal(message.into())
    }

    pub(crate) fn resource(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Resource { what: what.into(), source }
    }
}

/// The text a panic carried, when it was a string.
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => p.downcast_ref::<&str>().map_or_else(|| "(no message)".to_string(), |s| s.to_string()),
    }
}

fn io_retryable(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        Interrupted | TimedOut | WouldBlock | ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
    )
}

/// An object_store error as [`Error::Store`] keeps it: shown only redacted. Its `Display` and
/// its `Debug` (what `unwrap` prints) are the error's text with every URL's userinfo and
/// secret query values removed, and it names no source below it (object_store's chain holds
/// the request URL as given, an endpoint's `user:password@` included).
pub struct StoreError(object_store::Error);

impl StoreError {
    /// The object_store error (unredacted: do not print it).
    pub fn inner(&self) -> &object_store::Error {
        &self.0
    }
}

impl From<object_store::Error> for StoreError {
    fn from(e: object_store::Error) -> Self {
        StoreError(e)
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_text(&self.0.to_string()))
    }
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The redacted text, not object_store's own Debug: that prints URLs field by field
        // (a password among them), which no text redaction can find.
        f.debug_tuple("StoreError").field(&self.to_string()).finish()
    }
}

impl std::error::Error for StoreError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_only_for_transient_failures() {
        let reset = Error::Io { path: "x".into(), source: std::io::ErrorKind::ConnectionReset.into() };
        assert!(reset.is_retryable());
        assert!(!Error::IndexOutOfRange { index: 3, len: 2 }.is_retryable());
        assert!(!Error::CorruptTar { shard: "a.tar".into(), offset: 0, reason: "x".into() }.is_retryable());
        let missing = Error::io("/nope", std::io::ErrorKind::NotFound.into());
        assert!(matches!(missing, Error::NotFound { .. }));
        assert!(!missing.is_retryable());
        assert!(missing.to_string().contains("/nope"), "{missing}");
    }

    #[test]
    fn corrupt_data_names_only_the_sample_and_field_it_knows() {
        let e = |key: &str, field: &str| {
            Error::CorruptData { shard: "a.mds".into(), key: key.into(), field: field.into(), reason: "why".into() }
                .to_string()
        };
        assert_eq!(e("", ""), "corrupt data in a.mds: why");
        assert_eq!(e("k1", ""), "corrupt data in a.mds: sample `k1`: why");
        assert_eq!(e("", "jpg"), "corrupt data in a.mds: field `jpg`: why");
        assert_eq!(e("k1", "jpg"), "corrupt data in a.mds: sample `k1` field `jpg`: why");
    }
}
