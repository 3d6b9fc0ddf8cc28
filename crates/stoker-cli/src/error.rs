//! The CLI's one error type. A library error keeps its [`stoker::ErrorKind`]; the CLI's own failures
//! (arguments that parse but cannot work together, writing output, child processes) are
//! messages. Either may carry what the command was doing when it failed.

use std::fmt;
use std::process::ExitCode;

pub(crate) type Result<T, E = CliError> = std::result::Result<T, E>;

/// Why a command failed. Printed as one line: `error: {self}`.
#[derive(Debug)]
pub(crate) enum CliError {
    /// The library failed; its message names what and where.
    Stoker(stoker::Error),
    /// The CLI's own failure, in words.
    Message(String),
    /// `source` happened while doing `what`.
    Context {
        /// What the command was doing, e.g. `benchmarking tar`.
        what: String,
        /// What went wrong.
        source: Box<CliError>,
    },
}

impl CliError {
    /// The library error behind this, if there is one (its [`kind`](stoker::Error::kind)
    /// says what went wrong).
    pub(crate) fn stoker(&self) -> Option<&stoker::Error> {
        match self {
            CliError::Stoker(e) => Some(e),
            CliError::Message(_) => None,
            CliError::Context { source, .. } => source.stoker(),
        }
    }

    /// The process's exit status: 1 for every failure once the command line has parsed (clap
    /// exits with 2 for a command line it cannot parse, before any command runs).
    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::FAILURE
    }

    /// Advice to end the `error: ...` line with, when the library error calls for some.
    pub(crate) fn advice(&self) -> Option<&'static str> {
        self.stoker()
            .filter(|e| e.is_retryable())
            .map(|_| "the failure was transient: running the command again may succeed")
    }

    pub(crate) fn context(self, what: impl fmt::Display) -> Self {
        CliError::Context { what: what.to_string(), source: Box::new(self) }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Stoker(e) => e.fmt(f),
            CliError::Message(m) => f.write_str(m),
            CliError::Context { what, source } => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CliError::Stoker(e) => Some(e),
            CliError::Message(_) => None,
            CliError::Context { source, .. } => Some(&**source),
        }
    }
}

impl From<stoker::Error> for CliError {
    fn from(e: stoker::Error) -> Self {
        CliError::Stoker(e)
    }
}

impl From<String> for CliError {
    fn from(m: String) -> Self {
        CliError::Message(m)
    }
}

impl From<&str> for CliError {
    fn from(m: &str) -> Self {
        CliError::Message(m.to_string())
    }
}

/// Say what the command was doing when an error happened: `cannot write out.bin: disk full`.
pub(crate) trait Context<T> {
    /// `what` before the error.
    fn context(self, what: impl fmt::Display) -> Result<T>;
    /// `what()` before the error, built only when there is one.
    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: IntoCliError> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.into_cli_error().context(what))
    }

    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| e.into_cli_error().context(what()))
    }
}

/// What [`Context`] accepts: Stoker's and the CLI's errors keep their structure, anything else
/// implementing `std::error::Error` becomes its message.
pub(crate) trait IntoCliError {
    fn into_cli_error(self) -> CliError;
}

impl IntoCliError for CliError {
    fn into_cli_error(self) -> CliError {
        self
    }
}

impl IntoCliError for stoker::Error {
    fn into_cli_error(self) -> CliError {
        CliError::Stoker(self)
    }
}

macro_rules! foreign {
    ($($t:ty),* $(,)?) => {$(
        impl IntoCliError for $t {
            fn into_cli_error(self) -> CliError {
                CliError::Message(self.to_string())
            }
        }
    )*};
}

foreign!(std::io::Error, serde_json::Error, tokio::task::JoinError,);
#[cfg(feature = "demo")]
foreign!(stoker_testkit::s3::ServeError);

#[cfg(test)]
mod tests {
    use super::*;
    use stoker::ErrorKind;

    #[test]
    fn context_keeps_the_library_kind_and_reads_as_one_line() {
        let missing = stoker::Error::NotFound { what: "/data/x".into(), hint: None };
        let e = Err::<(), _>(missing).context("benchmarking x").unwrap_err();
        assert_eq!(e.stoker().map(stoker::Error::kind), Some(ErrorKind::NotFound));
        assert_eq!(e.advice(), None);
        assert_eq!(e.to_string(), "benchmarking x: not found: /data/x");
        let io = std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full");
        let e = Err::<(), _>(io).with_context(|| format!("cannot write {}", "out.bin")).unwrap_err();
        assert!(e.stoker().is_none() && e.advice().is_none());
        assert_eq!(e.to_string(), "cannot write out.bin: disk full");
        let reset = stoker::Error::Io { path: "/d".into(), source: std::io::ErrorKind::ConnectionReset.into() };
        let e = Err::<(), _>(reset).context("reading").unwrap_err();
        assert!(e.advice().is_some_and(|a| a.contains("transient")), "{:?}", e.advice());
        assert_eq!(CliError::from("--batch must be at least 1").to_string(), "--batch must be at least 1");
    }
}
