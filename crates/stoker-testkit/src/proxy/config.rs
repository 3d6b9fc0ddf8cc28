//! What the proxy injects (the knobs and a partial update of them), its counters as JSON,
//! and where it listens and forwards to.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Body of the injected `503`, byte for byte what S3 sends for throttling.
pub const SLOWDOWN_BODY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";

/// Upper bound for `latency_ms`, `jitter_ms` and `spike_ms` (10 minutes).
///
/// A typo such as an extra zero should fail loudly rather than hang a test.
pub const MAX_DELAY_MS: u64 = 600_000;

/// Path prefix of the control endpoints.
pub const CONTROL_PREFIX: &str = "/__proxy/";

/// The fault knobs. Probabilities are in `[0, 1]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultConfig {
    /// Fixed delay before each request is handled, in milliseconds.
    pub latency_ms: u64,
    /// Extra uniform delay in `[0, jitter_ms]` per request.
    pub jitter_ms: u64,
    /// Probability of answering `503 SlowDown` without contacting upstream.
    pub slowdown: f64,
    /// Probability of resetting the client connection (TCP RST).
    pub reset: f64,
    /// Probability of cutting a GET/HEAD response body to about half.
    pub truncate: f64,
    /// Probability of adding `spike_ms` to the delay.
    pub spike_prob: f64,
    /// Size of a latency spike, in milliseconds.
    pub spike_ms: u64,
    /// RNG seed; setting it (even to the same value) restarts the sequence.
    pub seed: u64,
    /// The rate of the link every forwarded response body shares, in MiB/s; 0 for no limit. Models
    /// a network link as the bound where the server shares the client's cores.
    #[serde(default)]
    pub link_mib_s: u64,
}

impl Default for FaultConfig {
    /// No faults, seed 1 (the CLI default).
    fn default() -> Self {
        Self {
            latency_ms: 0,
            jitter_ms: 0,
            slowdown: 0.0,
            reset: 0.0,
            truncate: 0.0,
            spike_prob: 0.0,
            spike_ms: 0,
            seed: 1,
            link_mib_s: 0,
        }
    }
}

impl FaultConfig {
    /// Checks that probabilities are in `[0, 1]` and delays at most
    /// [`MAX_DELAY_MS`].
    ///
    /// # Errors
    /// A message naming the first bad knob.
    pub fn validate(&self) -> Result<(), String> {
        for (name, p) in [
            ("slowdown", self.slowdown),
            ("reset", self.reset),
            ("truncate", self.truncate),
            ("spike_prob", self.spike_prob),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{name} must be a probability in [0, 1], got {p}"));
            }
        }
        for (name, ms) in [("latency_ms", self.latency_ms), ("jitter_ms", self.jitter_ms), ("spike_ms", self.spike_ms)]
        {
            if ms > MAX_DELAY_MS {
                return Err(format!("{name} must be at most {MAX_DELAY_MS}, got {ms}"));
            }
        }
        Ok(())
    }

    /// Returns this config with the fields present in `patch` replaced.
    pub fn patched(&self, patch: &FaultPatch) -> Self {
        Self {
            latency_ms: patch.latency_ms.unwrap_or(self.latency_ms),
            jitter_ms: patch.jitter_ms.unwrap_or(self.jitter_ms),
            slowdown: patch.slowdown.unwrap_or(self.slowdown),
            reset: patch.reset.unwrap_or(self.reset),
            truncate: patch.truncate.unwrap_or(self.truncate),
            spike_prob: patch.spike_prob.unwrap_or(self.spike_prob),
            spike_ms: patch.spike_ms.unwrap_or(self.spike_ms),
            seed: patch.seed.unwrap_or(self.seed),
            link_mib_s: patch.link_mib_s.unwrap_or(self.link_mib_s),
        }
    }
}

/// A partial [`FaultConfig`], the body of `POST /__proxy/config`.
///
/// Field names match the config (`latency_ms`) and the CLI flags
/// (`latency-ms`). Unknown fields are rejected so a typo cannot silently
/// leave a fault off.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPatch {
    /// See [`FaultConfig::latency_ms`].
    #[serde(default, alias = "latency-ms", skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// See [`FaultConfig::jitter_ms`].
    #[serde(default, alias = "jitter-ms", skip_serializing_if = "Option::is_none")]
    pub jitter_ms: Option<u64>,
    /// See [`FaultConfig::slowdown`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowdown: Option<f64>,
    /// See [`FaultConfig::reset`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<f64>,
    /// See [`FaultConfig::truncate`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<f64>,
    /// See [`FaultConfig::spike_prob`].
    #[serde(default, alias = "spike-prob", skip_serializing_if = "Option::is_none")]
    pub spike_prob: Option<f64>,
    /// See [`FaultConfig::spike_ms`].
    #[serde(default, alias = "spike-ms", skip_serializing_if = "Option::is_none")]
    pub spike_ms: Option<u64>,
    /// See [`FaultConfig::seed`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// See [`FaultConfig::link_mib_s`].
    #[serde(default, alias = "link-mib-s", skip_serializing_if = "Option::is_none")]
    pub link_mib_s: Option<u64>,
}

/// Counters, as served by `GET /__proxy/stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyStats {
    /// Requests received (control endpoints excluded).
    pub requests: u64,
    /// Requests sent to the upstream.
    pub forwarded: u64,
    /// Injected `503 SlowDown` answers.
    pub slowdowns: u64,
    /// Injected connection resets.
    pub resets: u64,
    /// Injected truncated responses.
    pub truncations: u64,
    /// Requests that got a latency spike.
    pub spikes: u64,
    /// Forwarded requests the upstream failed to answer (`502` sent).
    pub upstream_errors: u64,
}

/// Settings for [`serve`](super::serve).
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// The HTTP server to forward to.
    pub upstream: SocketAddr,
    /// Initial fault settings.
    pub faults: FaultConfig,
}

impl ProxyConfig {
    /// Listens on `127.0.0.1:0`, forwards to `upstream`, no faults.
    pub fn new(upstream: SocketAddr) -> Self {
        Self { listen: SocketAddr::from(([127, 0, 0, 1], 0)), upstream, faults: FaultConfig::default() }
    }
}
