//! Retries: a transient failure (5xx, 408, 429, a transport error, a short or overlong body,
//! a stall, a timeout) is tried again after an exponential backoff with jitter, up to the
//! configured attempts and within the read's deadline; anything else fails at once with a
//! hint. Every store gets the same policy, counted here, because object_store's own retries
//! are off for the stores Stoker builds.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::Fetcher;
use crate::error::{Error, Result};

/// One attempt's failure, classified.
pub(super) struct Failure {
    pub(super) transient: bool,
    /// The object is not there (404): reported as `Error::NotFound`, so callers that treat a
    /// missing object as "none" (manifests, pack plans) match a variant, not a message.
    pub(super) missing: bool,
    /// The object is not the version the read expects (a failed precondition, or an answer
    /// of another size, tag or time): reported as `Error::Changed`, never retried.
    pub(super) changed: bool,
    /// The object is larger than a whole read of it may be: reported as `Error::BadIndex`
    /// (its size, then the most), never retried.
    pub(super) too_large: Option<(u64, u64)>,
    pub(super) message: String,
    pub(super) hint: Option<String>,
}

impl Failure {
    /// A failure trying again cannot help.
    pub(super) fn fatal(message: impl Into<String>) -> Self {
        Failure {
            transient: false,
            missing: false,
            changed: false,
            too_large: None,
            message: message.into(),
            hint: None,
        }
    }

    /// The object is `size` bytes, more than the `most` a whole read of it takes.
    pub(super) fn too_large(size: u64, most: u64) -> Self {
        Failure { too_large: Some((size, most)), ..Failure::fatal(format!("{size} bytes, more than {most}")) }
    }

    /// A failure worth another attempt.
    pub(super) fn transient(message: impl Into<String>) -> Self {
        Failure { transient: true, ..Failure::fatal(message) }
    }

    /// The object is another version than the read expects; `why` says what differs.
    pub(super) fn changed(why: String) -> Self {
        Failure { changed: true, ..Failure::fatal(why) }
    }
}

impl Fetcher {
    /// Retry transient failures with exponential backoff and full jitter, all of it within
    /// `deadline` when there is one: past it the attempt under way is abandoned and the read
    /// fails, however many attempts were left. `what` names the bytes in the final error; it
    /// is only formatted if there is one.
    pub(super) async fn retrying<T, F, Fut>(
        &self,
        shown: &str,
        what: impl Fn() -> String,
        deadline: Option<Duration>,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, Failure>>,
    {
        let attempts = self.cfg.attempts.max(1);
        let mut backoff = self.cfg.backoff;
        let started = tokio::time::Instant::now();
        // A deadline too far to be an instant is none.
        let give_up_at = deadline.and_then(|d| started.checked_add(d));
        let fail = |attempt: u32, fail: Failure| {
            self.counters.failures.fetch_add(1, Relaxed);
            if fail.changed {
                return Error::Changed { object: shown.to_string(), reason: fail.message };
            }
            if let Some((size, most)) = fail.too_large {
                return Error::too_large(shown, size, most);
            }
            if fail.missing {
                return Error::NotFound { what: format!("{shown} ({})", what()), hint: fail.hint };
            }
            Error::Fetch {
                object: shown.to_string(),
                what: what(),
                attempts: attempt,
                // object_store quotes the request URL, userinfo included: redacted here so
                // that Debug, not only Display, is clean.
                message: crate::uri::redact_text(&fail.message).into_owned(),
                hint: fail.hint,
                transient: fail.transient,
            }
        };
        let past_deadline = |last: Option<&str>| {
            let d = deadline.unwrap_or_default();
            let mut message = format!("the read did not finish within its deadline of {d:?}");
            if let Some(last) = last {
                message.push_str(&format!(" (the last attempt: {last})"));
            }
            let hint = Some(format!(
                "the store is failing or stalling; raise deadline_ms (now {}) to wait longer",
                d.as_millis()
            ));
            Failure { hint, ..Failure::transient(message) }
        };
        for attempt in 1..=attempts {
            let tried = match give_up_at {
                Some(at) => match tokio::time::timeout_at(at, f()).await {
                    Ok(r) => r,
                    Err(_) => return Err(fail(attempt, past_deadline(None))),
                },
                None => f().await,
            };
            match tried {
                Ok(b) => return Ok(b),
                Err(failure) if failure.transient && attempt < attempts => {
                    let jittered = backoff.mul_f64(jitter());
                    // A backoff that ends past the deadline leaves the next attempt no time.
                    if give_up_at.is_some_and(|at| tokio::time::Instant::now() + jittered >= at) {
                        return Err(fail(attempt, past_deadline(Some(&failure.message))));
                    }
                    self.counters.retries.fetch_add(1, Relaxed);
                    tokio::time::sleep(jittered).await;
                    backoff = (backoff * 2).min(self.cfg.max_backoff);
                }
                Err(failure) => return Err(fail(attempt, failure)),
            }
        }
        unreachable!("the last attempt returns")
    }
}

/// A uniform factor in [0.5, 1.0): "equal jitter", so backoff never collapses to zero.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    0.5 + (h.finish() % 1_000_000) as f64 / 2_000_000.0
}

/// Sort an object_store error into transient (retry) or not, with a hint for the latter.
pub(super) fn classify(e: object_store::Error) -> Failure {
    use object_store::Error as E;
    if let Some(refused) = super::client::RedirectRefused::within(&e) {
        let hint = "point `endpoint` (or `region`) at the host that serves the data: a store's redirects are \
                    followed only within its endpoint's host";
        return Failure { hint: Some(hint.into()), ..Failure::fatal(refused.to_string()) };
    }
    if let Some(tls) = super::client::tls_failure(&e) {
        let message = format!("{e}: TLS: {tls}");
        // Another attempt meets the same certificate: fail at once, saying what TLS said.
        if matches!(tls, rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented) {
            let hint = "for a server whose certificate comes from a private CA, give ca_certificate=PATH (its PEM \
                        file) or set SSL_CERT_FILE; check that the URI names the host the certificate is for";
            return Failure { hint: Some(hint.into()), ..Failure::fatal(message) };
        }
        // An alert or a record that does not decrypt (a middlebox, a connection cut
        // mid-handshake) may pass on another attempt.
        return Failure::transient(message);
    }
    let message = with_causes(&e);
    if super::client::causes(&e).any(|c| c.is::<super::answers::EncodedAnswer>()) {
        return Failure::fatal(message);
    }
    let (transient, hint) = match &e {
        E::NotFound { .. } => (false, Some("the object does not exist: check the bucket, prefix and name".to_string())),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => (
            false,
            Some(
                "the server refused access: check the credentials (S3: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; \
                 GCS: a service account; Azure: an account key), or, for a plain http(s) server (which is sent no \
                 credentials), that it serves this object"
                    .into(),
            ),
        ),
        E::Precondition { .. } | E::NotModified { .. } => {
            return Failure::changed(
                "the server refused the entity tag it had when first read (412 Precondition \
                                     Failed): the object was replaced"
                    .into(),
            )
        }
        E::Generic { .. } | E::JoinError { .. } => {
            let status = http_status(&message);
            match status {
                Some(s) if (500..600).contains(&s) || s == 408 || s == 429 => (true, None),
                Some(401) | Some(403) => (false, Some("check the credentials and the bucket's permissions".into())),
                Some(404) => (false, Some("the object does not exist".into())),
                Some(_) => (false, None),
                // No status: a transport failure (connect, reset, timeout, short body).
                None => (true, None),
            }
        }
        _ => (false, None),
    };
    let missing = matches!(e, E::NotFound { .. }) || http_status(&message) == Some(404);
    Failure { transient, missing, changed: false, too_large: None, message: clipped(message), hint }
}

/// `e` and the errors beneath it, each said once: object_store's own words for a malformed
/// answer are "error sending request", the cause (an answer that is not HTTP, headers too
/// large) is further down. Credentials in any URL it quotes are redacted.
fn with_causes(e: &object_store::Error) -> String {
    let mut out = String::new();
    for cause in super::client::causes(e) {
        let text = cause.to_string();
        if !text.is_empty() && !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    crate::uri::redact_text(&out).into_owned()
}

/// The most of a store's error text a failure keeps: object_store quotes an error answer's
/// whole body (a proxy's HTML page, or megabytes a broken server sends), which would then be
/// in every error message and log line.
const MESSAGE_MAX: usize = 4 << 10;

/// `message` cut to [`MESSAGE_MAX`] bytes (at a character's edge), saying how much was left out.
fn clipped(mut message: String) -> String {
    if message.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let left = message.len() - end;
        message.truncate(end);
        message.push_str(&format!("... ({left} bytes more of the server's answer left out)"));
    }
    message
}

/// [`classify`] for a write: a server that does not take writes (405 Method Not Allowed,
/// 501 Not Implemented: a plain HTTP server's answer to a PUT) fails at once; asking again
/// would only add seconds to every index saved beside its shards.
pub(super) fn classify_write(e: object_store::Error) -> Failure {
    let mut f = classify(e);
    if matches!(http_status(&f.message), Some(405 | 501)) {
        f.transient = false;
    }
    f
}

/// [`classify`] for a listing: a server that says it cannot list (405 Method Not Allowed,
/// 501 Not Implemented: what plain HTTP servers answer a WebDAV `PROPFIND`) fails at once
/// with what to do instead; asking again would only add seconds to every open.
pub(super) fn classify_listing(e: object_store::Error) -> Failure {
    let mut f = classify(e);
    if matches!(http_status(&f.message), Some(405 | 501)) {
        f.transient = false;
        f.hint = Some(
            "this server cannot list objects: name the data instead, with a brace pattern \
             (https://host/data/train-{0000..0099}.tar), ?list=FILE (a file of object names), or the URI of its \
             index (index.json) or manifest"
                .into(),
        );
    }
    f
}

/// The HTTP status in an object_store error message, if it names one.
pub(super) fn http_status(msg: &str) -> Option<u16> {
    for marker in ["status code: ", "Status: ", "status: "] {
        if let Some(at) = msg.find(marker) {
            let digits: String = msg[at + marker.len()..].chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(s) = digits.parse() {
                return Some(s);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_cannot_list_is_not_asked_again() {
        let e = |status: &str| object_store::Error::Generic {
            store: "HTTP",
            source: format!("Server returned non-2xx status code: {status}").into(),
        };
        for s in ["501 Not Implemented", "405 Method Not Allowed"] {
            let f = classify_listing(e(s));
            assert!(!f.transient && f.hint.as_deref().is_some_and(|h| h.contains("brace pattern")), "{s}");
        }
        assert!(classify_listing(e("503 Service Unavailable")).transient);
        assert!(classify(e("501 Not Implemented")).transient, "a read's 501 is still the server's trouble");
    }

    #[test]
    fn a_huge_error_answer_is_clipped_and_still_classified() {
        let page = format!("Server returned non-2xx status code: 503 Service Unavailable: {}", "é".repeat(1 << 20));
        let f = classify(object_store::Error::Generic { store: "HTTP", source: page.into() });
        assert!(f.transient, "still a 503");
        assert!(f.message.len() < 5 << 10 && f.message.ends_with("left out)"), "{} bytes", f.message.len());
    }

    #[test]
    fn statuses_are_found_in_messages() {
        assert_eq!(http_status("Server returned non-2xx status code: 503 Service Unavailable: <Error>"), Some(503));
        assert_eq!(http_status("connection reset"), None);
    }
}
