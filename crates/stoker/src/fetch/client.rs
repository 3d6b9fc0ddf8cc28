//! The HTTP client under the object stores Stoker builds: object_store's own (reqwest, built
//! from the same [`ClientOptions`] the same way) but for the one thing those options cannot
//! say, where a redirect may lead.
//!
//! reqwest follows up to ten redirects anywhere by default and drops only `Authorization`
//! and cookies on the way to another host. For an object store that is not enough: an S3
//! request carries its session token in `x-amz-security-token`, an Azure one its `x-ms-*`
//! headers, and whatever the other host answers would be delivered as the object's bytes.
//! So a store's endpoint may redirect only within its own origin (scheme, host and port);
//! a redirect anywhere else fails the request, naming where it led ([`RedirectRefused`]).
//! Plain HTTP(S) sources follow redirects anywhere (mirrors and CDNs answer that way): they
//! carry no credentials, and reqwest would drop `Authorization` and cookies at another origin.
//!
//! The answers object_store reads whole (errors, listing pages) come to it bounded
//! ([`super::answers`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use object_store::client::{DnsResolver, HttpClient, HttpConnector};
use object_store::{ClientConfigKey as Key, ClientOptions};

/// Where a store's redirects may lead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Redirects {
    /// Only within the origin of the request redirected (S3, GCS, Azure).
    SameOrigin,
    /// Anywhere, at most ten hops (plain HTTP sources).
    Anywhere,
}

/// Redirects a store follows, at most (reqwest's default).
const MAX_HOPS: usize = 10;

/// A redirect to another origin that a store's request was not allowed to follow.
#[derive(Debug)]
pub(crate) struct RedirectRefused {
    from: String,
    to: String,
}

impl std::fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the store's endpoint {} redirected the request to {}, another host: refused (a store's request \
             carries its credentials, and the bytes would come from a server the URI does not name)",
            self.from, self.to
        )
    }
}

impl std::error::Error for RedirectRefused {}

impl RedirectRefused {
    /// The refusal somewhere in the causes of `e`, if it is one.
    pub(crate) fn within<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a RedirectRefused> {
        causes(e).find_map(|c| c.downcast_ref::<RedirectRefused>())
    }
}

/// `e` and the errors it wraps, outermost first. An io::Error's `source` skips the error it
/// wraps (hyper reports a TLS handshake's failure as io::Errors wrapping rustls's), so the
/// walk looks inside io::Errors instead.
pub(super) fn causes<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |e| match e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
        Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
        None => e.source(),
    })
}

/// The TLS failure somewhere in the causes of `e` (a certificate no trusted root vouches for,
/// one for another name, an expired one, an alert, a record that does not decrypt). reqwest's
/// own message for it is only "error sending request".
pub(crate) fn tls_failure<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    causes(e).find_map(|c| c.downcast_ref::<rustls::Error>())
}

/// `url` as an error may show it: no user info, no query (a presigned URL's signature and
/// credential live there), nothing past the path.
fn shown(url: &url::Url) -> String {
    let host = url.host_str().unwrap_or("");
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    let query = if url.query().is_some() { "?…" } else { "" };
    format!("{}://{host}{port}{}{query}", url.scheme(), url.path())
}

fn same_origin(a: &url::Url, b: &url::Url) -> bool {
    a.scheme() == b.scheme() && a.host_str() == b.host_str() && a.port_or_known_default() == b.port_or_known_default()
}

fn policy(redirects: Redirects) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > MAX_HOPS {
            return attempt.error(format!("more than {MAX_HOPS} redirects"));
        }
        let from = attempt.previous().last().cloned();
        match (redirects, from) {
            (Redirects::SameOrigin, Some(from)) if !same_origin(&from, attempt.url()) => {
                let refused = RedirectRefused { from: shown(&from), to: shown(attempt.url()) };
                attempt.error(refused)
            }
            _ => attempt.follow(),
        }
    })
}

/// Builds clients with Stoker's redirect rule and the certificates the user trusts besides
/// the system's; everything else as object_store would.
#[derive(Debug)]
pub(crate) struct Connector {
    pub(crate) redirects: Redirects,
    /// Roots trusted besides the system's (`ca_certificate`).
    pub(crate) roots: Vec<reqwest::Certificate>,
}

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let client = builder(options)?
            .tls_certs_merge(self.roots.iter().cloned())
            .redirect(policy(self.redirects))
            .build()
            .map_err(config_error)?;
        Ok(HttpClient::new(super::answers::BoundedAnswers(client)))
    }
}

/// The certificates of a PEM file (one or several, a CA bundle), or why there are none.
pub(crate) fn read_roots(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = crate::small_file::read_capped(path, crate::small_file::SMALL_FILE_BYTES)
        .map_err(|e| format!("cannot read it: {e}"))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| format!("it is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("it holds no `-----BEGIN CERTIFICATE-----` block".into());
    }
    Ok(certs)
}

/// Makes ring the process's rustls crypto provider, if none is installed yet. reqwest is built
/// without a provider of its own (aws-lc-rs's C library doubled a first build; the workspace
/// manifest says so) and panics when it builds a client with none installed; every client
/// Stoker's stores use comes from [`builder`], which calls this first. A provider the host
/// program installed before is kept.
fn install_tls_provider() {
    // Err only means one is installed already, which is what is needed.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn config_error(e: impl std::fmt::Display) -> object_store::Error {
    object_store::Error::Generic { store: "HTTP client", source: e.to_string().into() }
}

/// A reqwest client builder with every setting of `o`, as object_store 0.14's own client
/// reads them (`ClientOptions::client`, not public); certificates added in code have no
/// getter and Stoker sets none.
fn builder(o: &ClientOptions) -> object_store::Result<reqwest::ClientBuilder> {
    install_tls_provider();
    let text = |k: Key| o.get_config_value(&k);
    let flag =
        |k: Key| text(k).is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on"));
    let time = |k: Key| -> object_store::Result<Option<Duration>> {
        text(k)
            .map(|v| humantime::parse_duration(&v).map_err(|e| config_error(format!("{}: {e}", k.as_ref()))))
            .transpose()
    };
    let number = |k: Key| -> object_store::Result<Option<u64>> {
        text(k).map(|v| v.trim().parse::<u64>().map_err(|e| config_error(format!("{}: {e}", k.as_ref())))).transpose()
    };
    let mut b = reqwest::ClientBuilder::new()
        .user_agent(text(Key::UserAgent).unwrap_or_else(|| concat!("stoker/", env!("CARGO_PKG_VERSION")).into()));
    if let Some(h) = o.get_default_headers() {
        b = b.default_headers(h.clone());
    }
    if let Some(url) = text(Key::ProxyUrl) {
        let mut proxy = reqwest::Proxy::all(&url).map_err(config_error)?;
        if let Some(pem) = text(Key::ProxyCaCertificate) {
            let cert = reqwest::Certificate::from_pem(pem.as_bytes()).map_err(config_error)?;
            b = b.tls_certs_merge(std::iter::once(cert));
        }
        if let Some(ex) = text(Key::ProxyExcludes) {
            proxy = proxy.no_proxy(reqwest::NoProxy::from_string(&ex));
        }
        b = b.proxy(proxy);
    }
    if flag(Key::NoSystemCertificates) {
        b = b.tls_certs_only(std::iter::empty::<reqwest::Certificate>());
    }
    if let Some(t) = time(Key::Timeout)? {
        b = b.timeout(t);
    }
    if let Some(t) = time(Key::ConnectTimeout)? {
        b = b.connect_timeout(t);
    }
    if let Some(t) = time(Key::ReadTimeout)? {
        b = b.read_timeout(t);
    }
    if let Some(t) = time(Key::PoolIdleTimeout)? {
        b = b.pool_idle_timeout(t);
    }
    if let Some(n) = number(Key::PoolMaxIdlePerHost)? {
        b = b.pool_max_idle_per_host(usize::try_from(n).unwrap_or(usize::MAX));
    }
    if let Some(t) = time(Key::Http2KeepAliveInterval)? {
        b = b.http2_keep_alive_interval(t);
    }
    if let Some(t) = time(Key::Http2KeepAliveTimeout)? {
        b = b.http2_keep_alive_timeout(t);
    }
    if flag(Key::Http2KeepAliveWhileIdle) {
        b = b.http2_keep_alive_while_idle(true);
    }
    if let Some(n) = number(Key::Http2MaxFrameSize)? {
        b = b.http2_max_frame_size(u32::try_from(n).ok());
    }
    if flag(Key::Http1Only) {
        b = b.http1_only();
    }
    if flag(Key::Http2Only) {
        b = b.http2_prior_knowledge();
    }
    if flag(Key::AllowInvalidCertificates) {
        b = b.danger_accept_invalid_certs(true);
    }
    // A body's length is the object's size: never let a transfer encoding change it.
    b = b.no_gzip().no_brotli().no_zstd().no_deflate();
    match o.dns_resolver() {
        Some(r) => b = b.dns_resolver(Arc::new(Resolver(Some(r.clone())))),
        None if flag(Key::RandomizeAddresses) => b = b.dns_resolver(Arc::new(Resolver(None))),
        None => {}
    }
    Ok(b.https_only(!flag(Key::AllowHttp)))
}

/// Name resolution: a resolver the options carry, or the system's with its addresses
/// shuffled (object_store's `randomize_addresses`, on by default: connections spread over
/// the servers a name has).
struct Resolver(Option<Arc<dyn DnsResolver>>);

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let custom = self.0.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            // Port 0: reqwest puts the URL's port in its place.
            let mut addrs: Vec<SocketAddr> = match custom {
                Some(r) => r.resolve(&host).await?.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect(),
                None => {
                    let mut a: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
                    shuffle(&mut a);
                    a
                }
            };
            addrs.dedup();
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// Fisher-Yates with a per-call random seed (std's `RandomState`: no RNG dependency).
fn shuffle<T>(v: &mut [T]) {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    for i in (1..v.len()).rev() {
        h.write_usize(i);
        v.swap(i, (h.finish() % (i as u64 + 1)) as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_targets_are_shown_without_secrets() {
        let u = url::Url::parse("https://user:pw@cdn.example.com:8443/b/k.tar?X-Amz-Signature=abc&sig=def").unwrap();
        assert_eq!(shown(&u), "https://cdn.example.com:8443/b/k.tar?…");
        let a = url::Url::parse("http://127.0.0.1:9000/b/k").unwrap();
        assert!(same_origin(&a, &url::Url::parse("http://127.0.0.1:9000/other?x").unwrap()));
        for other in ["http://127.0.0.1:9001/b/k", "http://localhost:9000/b/k", "https://127.0.0.1:9000/b/k"] {
            assert!(!same_origin(&a, &url::Url::parse(other).unwrap()), "{other}");
        }
    }

    #[test]
    fn the_options_stoker_sets_build_a_client() {
        let o = ClientOptions::new().with_allow_http(true).with_connect_timeout(Duration::from_secs(10));
        assert!(Connector { redirects: Redirects::SameOrigin, roots: vec![] }.connect(&o).is_ok());
        let bad = ClientOptions::new().with_config(Key::ConnectTimeout, "ten seconds");
        assert!(builder(&bad).is_err(), "a setting that does not parse is an error, as in object_store");
    }
}
