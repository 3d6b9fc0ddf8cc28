//! Stoker's test kit: loopback servers and shared fixtures for the tests, the examples and
//! `stoker bench`'s embedded demo.
//!
//! Two services, each usable in-process (from tests) or as a binary, and [`fixtures`]:
//!
//! * [`s3`]: a real S3 endpoint over a local directory, built on `s3s` +
//!   `s3s-fs`, with SigV4 auth and `TCP_NODELAY` on every connection.
//! * [`proxy`]: an HTTP/1.1 reverse proxy that injects latency, latency
//!   spikes, `503 SlowDown`, TCP resets and truncated bodies, driven by a
//!   seeded RNG so a failing test replays the same fault sequence.
//! * [`http`]: a static file server that behaves as common HTTP servers do
//!   (weak or no entity tags, strict `If-Match`, no listing, injected `500`s).
//! * [`lmdb`]: LMDB environments written with heed.
//!
//! Both return a [`ServerHandle`] that knows the bound address (bind to port
//! 0 to get a free one) and can shut the server down.

#![warn(missing_docs)]

pub mod fixtures;
pub mod http;
pub mod lmdb;
pub mod proxy;
pub mod rng;
pub mod s3;

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a shutdown waits for in-flight requests before dropping them.
///
/// Kept short because these servers only serve tests: a hung client must not
/// make a test suite (or a SIGTERM) wait for long.
pub const GRACEFUL_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);

/// What a server's `serve` returns: a boxed future, so that the server's code is compiled in
/// this crate once rather than in every binary that awaits it.
pub type Boxed<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// A running server: its address and the means to stop it.
///
/// Dropping the handle does *not* stop the server (the accept loop is a
/// detached task); call [`ServerHandle::shutdown`] for an orderly stop.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl ServerHandle {
    /// The address the server is listening on (with the real port when bound
    /// to port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:PORT`, ready for `AmazonS3Builder::with_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting connections, lets in-flight requests finish (at most
    /// [`GRACEFUL_SHUTDOWN_TIMEOUT`]), then returns.
    pub async fn shutdown(self) {
        // An error only means the loop already ended; nothing left to stop.
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Prints the `listening on IP:PORT` line that scripts and tests parse, and
/// flushes it so a reader on a pipe sees it at once.
pub fn print_listening(addr: SocketAddr) {
    let mut out = std::io::stdout().lock();
    // Ignore errors: a closed stdout must not kill a server that is otherwise fine.
    let _ = writeln!(out, "listening on {addr}");
    let _ = out.flush();
}

/// Resolves when the process receives SIGINT or SIGTERM.
///
/// # Errors
/// Fails if the signal handlers cannot be installed.
pub async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

/// A boxed connection future, as produced by a per-connection serve function.
type ConnFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs the accept loop shared by both servers on an already bound listener.
///
/// `serve_conn` turns one accepted socket into a future that serves it; it
/// receives the [`GracefulShutdown`] so the connection can be watched.
/// Every accepted socket gets `TCP_NODELAY`: without it a response written as
/// headers + body in two writes waits for the client's delayed ACK (~40 ms).
pub(crate) fn spawn_accept_loop<F>(listener: TcpListener, serve_conn: F) -> std::io::Result<ServerHandle>
where
    F: Fn(TcpStream, &GracefulShutdown) -> ConnFuture + Send + 'static,
{
    let addr = listener.local_addr()?;
    let (stop, mut stop_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let graceful = GracefulShutdown::new();
        // A dropped handle must not stop the server (tests often keep only the
        // address), so once the sender is gone we simply stop watching it.
        let mut watching = true;
        loop {
            tokio::select! {
                res = listener.accept() => match res {
                    Ok((socket, _peer)) => {
                        // Failing to set the option only costs latency, never correctness.
                        let _ = socket.set_nodelay(true);
                        tokio::spawn(serve_conn(socket, &graceful));
                    }
                    Err(err) => {
                        // Typically EMFILE: back off briefly instead of spinning.
                        eprintln!("accept error: {err}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                changed = stop_rx.changed(), if watching => {
                    if changed.is_err() {
                        watching = false;
                    } else if *stop_rx.borrow() {
                        break;
                    }
                }
            }
        }
        drop(listener);
        // Idle keep-alive connections close at once; busy ones get a deadline.
        let _ = tokio::time::timeout(GRACEFUL_SHUTDOWN_TIMEOUT, graceful.shutdown()).await;
    });
    Ok(ServerHandle { addr, stop, task })
}

/// Run a binary's `main` future on a new multi-threaded runtime; failing to start one is an
/// error exit.
pub fn run_main(main: impl std::future::Future<Output = std::process::ExitCode>) -> std::process::ExitCode {
    match tokio::runtime::Runtime::new() {
        Ok(rt) => rt.block_on(main),
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Announce `addr` (the line scripts read the port from) and wait for SIGTERM or SIGINT.
pub async fn announce_and_wait(addr: std::net::SocketAddr) {
    print_listening(addr);
    if let Err(err) = shutdown_signal().await {
        eprintln!("error: cannot wait for signals: {err}");
    }
}
