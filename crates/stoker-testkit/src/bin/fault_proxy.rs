//! `fault_proxy`: fault-injecting HTTP/1.1 reverse proxy (see the crate README).

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use stoker_testkit::proxy::{self, FaultConfig, ProxyConfig};

/// Forward HTTP/1.1 to --upstream, injecting latency, 503 SlowDown, resets
/// and truncated bodies, optionally through a link of limited bandwidth.
///
/// Prints `listening on IP:PORT` once bound; stops on SIGINT/SIGTERM.
/// Runtime control: GET /__proxy/stats, GET|POST /__proxy/config.
#[derive(Debug, Parser)]
#[command(name = "fault_proxy", version)]
struct Args {
    /// Server to forward to, e.g. 127.0.0.1:9000.
    #[arg(long)]
    upstream: SocketAddr,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Delay added to every request, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Extra uniform delay in [0, N] ms per request.
    #[arg(long, default_value_t = 0)]
    jitter_ms: u64,
    /// Probability of answering 503 SlowDown without forwarding.
    #[arg(long, default_value_t = 0.0)]
    slowdown: f64,
    /// Probability of resetting the client connection (TCP RST).
    #[arg(long, default_value_t = 0.0)]
    reset: f64,
    /// Probability of cutting a GET/HEAD response body to about half.
    #[arg(long, default_value_t = 0.0)]
    truncate: f64,
    /// Probability of a latency spike of --spike-ms.
    #[arg(long, default_value_t = 0.0)]
    spike_prob: f64,
    /// Size of a latency spike, in milliseconds.
    #[arg(long, default_value_t = 0)]
    spike_ms: u64,
    /// RNG seed: the same seed and request order give the same faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The rate of the link all forwarded response bodies share, in MiB/s (0: no limit).
    #[arg(long, default_value_t = 0)]
    link_mib_s: u64,
}

fn main() -> ExitCode {
    // clap exits with status 2 and a usage message on bad arguments.
    let args = Args::parse();
    let faults = FaultConfig {
        latency_ms: args.latency_ms,
        jitter_ms: args.jitter_ms,
        slowdown: args.slowdown,
        reset: args.reset,
        truncate: args.truncate,
        spike_prob: args.spike_prob,
        spike_ms: args.spike_ms,
        seed: args.seed,
        link_mib_s: args.link_mib_s,
    };
    if let Err(msg) = faults.validate() {
        Args::command().error(ErrorKind::ValueValidation, msg).exit();
    }
    let config = ProxyConfig { listen: args.listen, upstream: args.upstream, faults };

    stoker_testkit::run_main(async move {
        let proxy = match proxy::serve(config).await {
            Ok(proxy) => proxy,
            Err(err) => {
                eprintln!("error: cannot listen on {}: {err}", args.listen);
                return ExitCode::FAILURE;
            }
        };
        stoker_testkit::announce_and_wait(proxy.addr()).await;
        proxy.shutdown().await;
        ExitCode::SUCCESS
    })
}
