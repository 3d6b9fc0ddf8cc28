//! Credentials out of what Python shows: the same redaction the Rust errors and `Display` use,
//! for the Python half (`Dataset.uri`, `Dataset.options`, messages built in Python).

use pyo3::prelude::*;

/// `uri` with its credentials masked: userinfo, secret query values, an endpoint's password,
/// the secrets inside an inline mix (`mix:{JSON}`).
#[pyfunction]
pub(crate) fn redact(uri: &str) -> String {
    stoker::uri::redact(uri)
}

/// `text` with every URL in it redacted as [`redact`] does.
#[pyfunction]
pub(crate) fn redact_text(text: &str) -> String {
    stoker::uri::redact_text(text).into_owned()
}

/// Whether an option's value is a credential (`secret_access_key`, `session_token`, ...).
#[pyfunction]
pub(crate) fn is_secret_option(key: &str) -> bool {
    stoker::uri::is_secret_option(key)
}
