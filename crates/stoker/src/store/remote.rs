//! Building object stores from a remote location and options: S3 (and S3-compatible
//! servers), GCS, Azure, HTTP. Credentials come from options or the usual environment
//! variables and never reach `Display`, `Debug` or errors. Every store talks through
//! Stoker's HTTP client ([`crate::fetch::client`]): a store's endpoint may redirect only
//! to itself, a plain HTTP source anywhere (it carries no credentials).

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::multipart::MultipartStore;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use super::{Backend, Store};
use crate::error::{Error, Result};
use crate::fetch::client::{Connector, Redirects};
use crate::fetch::Fetcher;
use crate::uri::{RemoteLocation, SourceOptions};

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

impl Store {
    /// A store over a remote location. `shown` is the URI with credentials redacted.
    pub fn remote(loc: &RemoteLocation, opts: &SourceOptions, shown: &str) -> Result<Self> {
        let (objects, multipart) = build(loc, opts, shown)?;
        let root = match &loc.names {
            // The display root is the bucket and prefix, not the pattern.
            Some(_) => format!(
                "{}{}{}",
                if loc.scheme.starts_with("http") { String::new() } else { format!("{}://", loc.scheme) },
                loc.bucket,
                if loc.prefix.is_empty() { String::new() } else { format!("/{}", loc.prefix) }
            ),
            None => shown.split('?').next().unwrap_or(shown).trim_end_matches('/').to_string(),
        };
        let mut fetcher = Fetcher::new(objects, crate::fetch::FetchConfig::from_options(opts));
        if let Some(store) = multipart {
            fetcher = fetcher.with_multipart(store);
        }
        let fetcher = Arc::new(fetcher);
        let reader = Arc::new(crate::cache::RemoteReader::new(fetcher, crate::cache::CacheConfig::from_options(opts))?);
        let policy = super::ranges::Policy::new(opts.coalesce_gap(true), opts.max_read());
        Ok(Store::new(Backend::Remote { reader, prefix: loc.prefix.clone() }, root, policy))
    }
}

fn client_options(opts: &SourceOptions, endpoint: Option<&str>) -> ClientOptions {
    let http = opts.allow_http.unwrap_or_else(|| endpoint.is_some_and(|e| e.starts_with("http://")));
    // Per-attempt limits are the fetch layer's; these bound connection set-up only.
    ClientOptions::new().with_allow_http(http).with_connect_timeout(Duration::from_secs(10)).with_timeout_disabled()
}

/// Retries happen in the fetch layer, counted and uniform across stores.
fn no_retries() -> RetryConfig {
    RetryConfig { max_retries: 0, retry_timeout: Duration::from_secs(1), ..Default::default() }
}

/// An endpoint must be an absolute http(s) URL with a host.
fn check_endpoint(e: &str) -> Result<()> {
    let shown = crate::uri::redact_endpoint(e);
    let bad = |why: &str| {
        Error::invalid_option(format!(
            "endpoint `{shown}` {why}; give the server's base URL, e.g. endpoint=http://127.0.0.1:9000"
        ))
    };
    match url::Url::parse(e) {
        Ok(u) if !matches!(u.scheme(), "http" | "https") => Err(bad("is not an http(s) URL")),
        Ok(u) if u.host_str().is_none_or(str::is_empty) => Err(bad("has no host")),
        // The store signs and sends requests to URIs made from the endpoint as written, as
        // `http::Uri`s, which are stricter than the URL parser (a `[` in the authority that
        // opens no IPv6 address): refused here, not at the first request (where it panics).
        Ok(_) if e.parse::<http::Uri>().is_err() => {
            Err(bad("is not a URL an HTTP request can be sent to (an unclosed `[`?)"))
        }
        Ok(_) => Ok(()),
        Err(err) => Err(bad(&format!("is not a URL ({err})"))),
    }
}

/// The store, and the same store as one whose multipart uploads are numbered by part (S3,
/// GCS, Azure; a plain HTTP server has none).
type Built = (Arc<dyn ObjectStore>, Option<Arc<dyn MultipartStore>>);

/// Both views of one store ([`Built`]).
fn both<S: ObjectStore + MultipartStore>(store: S) -> Built {
    let store = Arc::new(store);
    (store.clone(), Some(store))
}

fn build(loc: &RemoteLocation, opts: &SourceOptions, shown: &str) -> Result<Built> {
    let bad = |reason: String| Error::InvalidUri { uri: shown.to_string(), reason };
    // object_store errors can quote configuration; never pass them through unredacted.
    let build_err = |what: &str, e: object_store::Error| {
        let msg = crate::uri::redact_text(&e.to_string()).into_owned();
        Error::InvalidOption { message: format!("cannot configure the {what} store for {shown}: {msg}") }
    };
    let endpoint = opts.endpoint.clone();
    let roots = match &opts.ca_certificate {
        Some(path) => crate::fetch::client::read_roots(path).map_err(|why| {
            Error::invalid_option(format!(
                "ca_certificate `{}`: {why}; give a PEM file of the certificates to trust",
                path.display()
            ))
        })?,
        None => Vec::new(),
    };
    let connector = |redirects| Connector { redirects, roots: roots.clone() };
    // object_store panics on an endpoint it cannot turn into a request URI (`http://`).
    if let Some(e) = endpoint.as_deref() {
        check_endpoint(e)?;
    }
    if loc.scheme == "s3" {
        if let Some(e) = env("AWS_ENDPOINT_URL").filter(|_| endpoint.is_none()) {
            check_endpoint(&e).map_err(|err| Error::invalid_option(format!("AWS_ENDPOINT_URL: {err}")))?;
        }
    }
    match loc.scheme.as_str() {
        "s3" => {
            let mut b = AmazonS3Builder::from_env()
                .with_client_options(client_options(opts, endpoint.as_deref().or(env("AWS_ENDPOINT_URL").as_deref())))
                .with_bucket_name(&loc.bucket)
                .with_http_connector(connector(Redirects::SameOrigin))
                .with_retry(no_retries());
            if let Some(e) = &endpoint {
                b = b.with_endpoint(e);
            }
            b = b.with_virtual_hosted_style_request(opts.virtual_hosted.unwrap_or(false));
            if let Some(r) = opts.region.clone().or_else(|| env("AWS_REGION")).or_else(|| env("AWS_DEFAULT_REGION")) {
                b = b.with_region(r);
            }
            if let Some(k) = &opts.access_key_id {
                b = b.with_access_key_id(k);
            }
            if let Some(k) = &opts.secret_access_key {
                b = b.with_secret_access_key(k);
            }
            if let Some(t) = &opts.session_token {
                b = b.with_token(t);
            }
            let anonymous = opts.anonymous.unwrap_or(false);
            if anonymous {
                b = b.with_skip_signature(true);
            }
            let has_keys = (opts.access_key_id.is_some() || env("AWS_ACCESS_KEY_ID").is_some())
                && (opts.secret_access_key.is_some() || env("AWS_SECRET_ACCESS_KEY").is_some());
            let has_other = [
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            ]
            .iter()
            .any(|k| env(k).is_some());
            // Without any credential source object_store falls back to the instance metadata
            // service: a network call that hangs off the cloud. Ask instead.
            if !(has_keys || has_other || anonymous || opts.instance_metadata.unwrap_or(false)) {
                return Err(Error::InvalidOption {
                    message: format!(
                        "no S3 credentials for {shown}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the \
                         options access_key_id/secret_access_key, or anonymous=true for a public bucket, or \
                         instance_metadata=true on a cloud VM"
                    ),
                });
            }
            Ok(both(b.build().map_err(|e| build_err("S3", e))?))
        }
        "gs" => {
            let mut b = GoogleCloudStorageBuilder::from_env()
                .with_client_options(client_options(opts, None))
                .with_bucket_name(&loc.bucket)
                .with_http_connector(connector(Redirects::SameOrigin))
                .with_retry(no_retries());
            match &opts.service_account {
                Some(sa) if sa.trim_start().starts_with('{') => b = b.with_service_account_key(sa),
                Some(path) => b = b.with_service_account_path(path),
                None => {}
            }
            let has = opts.service_account.is_some()
                || [
                    "GOOGLE_SERVICE_ACCOUNT",
                    "GOOGLE_SERVICE_ACCOUNT_PATH",
                    "GOOGLE_SERVICE_ACCOUNT_KEY",
                    "GOOGLE_APPLICATION_CREDENTIALS",
                ]
                .iter()
                .any(|k| env(k).is_some());
            if !(has || opts.instance_metadata.unwrap_or(false)) {
                return Err(Error::InvalidOption {
                    message: format!(
                        "no GCS credentials for {shown}: set GOOGLE_APPLICATION_CREDENTIALS or the option \
                         service_account (a key file path or the JSON), or instance_metadata=true on a cloud VM"
                    ),
                });
            }
            Ok(both(b.build().map_err(|e| build_err("GCS", e))?))
        }
        "az" => {
            use object_store::azure::AzureConfigKey as Key;
            /// Azurite's well-known development account and key (public).
            const AZURITE_ACCOUNT: &str = "devstoreaccount1";
            const AZURITE_KEY: &str =
                "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_client_options(client_options(opts, endpoint.as_deref()))
                .with_container_name(&loc.bucket)
                .with_http_connector(connector(Redirects::SameOrigin))
                .with_retry(no_retries());
            if let Some(a) = &opts.account {
                b = b.with_account(a);
            }
            if let Some(k) = &opts.access_key {
                b = b.with_access_key(k);
            }
            let emulator =
                opts.use_emulator.unwrap_or_else(|| b.get_config_value(&Key::UseEmulator).is_some_and(|v| v == "true"));
            match (&endpoint, emulator) {
                // object_store's emulator mode takes Azurite's address from AZURITE_BLOB_STORAGE_URL
                // only (else 127.0.0.1:10000) and ignores an endpoint. With one, talk to it the way
                // emulator mode does: the well-known account and key unless given, the account as
                // the first path segment (added when the endpoint has no path).
                (Some(e), true) => {
                    let account = b.get_config_value(&Key::AccountName).unwrap_or_else(|| AZURITE_ACCOUNT.into());
                    if b.get_config_value(&Key::AccessKey).is_none() {
                        b = b.with_access_key(AZURITE_KEY);
                    }
                    let e = e.trim_end_matches('/');
                    let has_path = url::Url::parse(e).is_ok_and(|u| u.path() != "/");
                    let e = if has_path { e.to_string() } else { format!("{e}/{account}") };
                    b = b.with_use_emulator(false).with_account(account).with_endpoint(e).with_allow_http(true);
                }
                (None, true) => b = b.with_use_emulator(true).with_allow_http(true),
                (Some(e), false) => b = b.with_endpoint(e.clone()),
                (None, false) => {}
            }
            Ok(both(b.build().map_err(|e| build_err("Azure", e))?))
        }
        "http" | "https" => {
            let b = HttpBuilder::new()
                .with_client_options(client_options(opts, Some(&loc.bucket)))
                .with_url(&loc.bucket)
                .with_http_connector(connector(Redirects::Anywhere))
                .with_retry(no_retries());
            Ok((Arc::new(b.build().map_err(|e| build_err("HTTP", e))?), None))
        }
        other => Err(bad(format!("unknown scheme `{other}`"))),
    }
}
