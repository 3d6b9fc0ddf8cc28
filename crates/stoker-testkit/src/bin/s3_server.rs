//! `s3_server`: serves a directory as S3 on loopback (see the crate README).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use stoker_testkit::s3::{self, S3ServerConfig, ServeError};

/// Serve a directory as an S3 endpoint (each subdirectory is a bucket).
///
/// Prints `listening on IP:PORT` once bound; stops on SIGINT/SIGTERM.
#[derive(Debug, Parser)]
#[command(name = "s3_server", version)]
struct Args {
    /// Directory to serve; must exist.
    #[arg(long)]
    root: PathBuf,
    /// Address to bind (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// Access key id; requires --secret-key. Without keys only unsigned
    /// requests are accepted.
    #[arg(long, requires = "secret_key")]
    access_key: Option<String>,
    /// Secret access key; requires --access-key.
    #[arg(long, requires = "access_key")]
    secret_key: Option<String>,
    /// Region that request signatures must be scoped to.
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// Create this bucket (subdirectory of --root) at start; repeatable.
    #[arg(long = "bucket", value_name = "NAME")]
    buckets: Vec<String>,
}

fn main() -> ExitCode {
    // clap exits with status 2 and a usage message on bad arguments.
    let args = Args::parse();
    let mut config = S3ServerConfig::new(args.root);
    config.addr = args.addr;
    config.region = args.region;
    config.buckets = args.buckets;
    if let (Some(ak), Some(sk)) = (args.access_key, args.secret_key) {
        config = config.with_credentials(ak, sk);
    }

    stoker_testkit::run_main(async move {
        let server = match s3::serve(config).await {
            Ok(server) => server,
            // Bad input the parser could not see (missing root, bad bucket name):
            // same status as a usage error.
            Err(ServeError::Config(msg)) => Args::command().error(ErrorKind::ValueValidation, msg).exit(),
            Err(err) => {
                eprintln!("error: {err}");
                return ExitCode::FAILURE;
            }
        };
        stoker_testkit::announce_and_wait(server.addr()).await;
        server.shutdown().await;
        ExitCode::SUCCESS
    })
}
