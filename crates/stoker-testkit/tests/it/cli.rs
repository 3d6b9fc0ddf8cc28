//! The two binaries as real processes: startup line, serving, signals, and
//! bad command lines.

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

const S3_SERVER: &str = env!("CARGO_BIN_EXE_s3_server");
const FAULT_PROXY: &str = env!("CARGO_BIN_EXE_fault_proxy");

/// Kills the child if the test fails before it is stopped on purpose.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl ChildGuard {
    fn pid(&self) -> u32 {
        self.0.as_ref().expect("child running").id()
    }

    /// Sends `signal` (e.g. "TERM") and waits for exit, at most 5 s.
    fn stop_with(mut self, signal: &str) -> ExitStatus {
        let status =
            Command::new("kill").arg(format!("-{signal}")).arg(self.pid().to_string()).status().expect("run kill");
        assert!(status.success());
        let child = self.0.as_mut().expect("child running");
        let status = wait_timeout(child, Duration::from_secs(5)).expect("process did not exit after the signal");
        self.0 = None;
        status
    }
}

fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Spawns `bin args` and returns it with the address from its
/// `listening on IP:PORT` line (waiting at most 5 s for it).
fn spawn_listening(bin: &str, args: &[&str]) -> (ChildGuard, SocketAddr) {
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn binary");
    let stdout = child.stdout.take().expect("stdout piped");
    let guard = ChildGuard(Some(child));
    let (tx, rx) = mpsc::channel();
    // A thread, because a blocking read has no timeout of its own.
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(5)).expect("no 'listening on' line within 5 s");
    let addr = line
        .trim_end()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .expect("address in the first line");
    (guard, addr)
}

#[tokio::test]
async fn s3_server_process_serves_and_exits_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let (child, addr) = spawn_listening(
        S3_SERVER,
        &["--root", root, "--bucket", BUCKET, "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY],
    );
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    bounded(async {
        let store = store(&format!("http://{addr}"));
        store.put(&Path::from("k"), PutPayload::from(b"value".to_vec())).await.unwrap();
        let got = store.get(&Path::from("k")).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"value");
    })
    .await;
    assert!(dir.path().join(BUCKET).join("k").is_file());
    let status = child.stop_with("TERM");
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn fault_proxy_process_injects_faults_and_exits_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let (server, s3_addr) = spawn_listening(S3_SERVER, &["--root", dir.path().to_str().unwrap(), "--bucket", BUCKET]);
    let (proxy, proxy_addr) =
        spawn_listening(FAULT_PROXY, &["--upstream", &s3_addr.to_string(), "--slowdown", "1.0", "--seed", "7"]);
    bounded(async {
        let resp = raw_request(proxy_addr, "GET", "/train/k", b"").await.unwrap();
        assert_eq!(resp.status, 503);
        assert_eq!(proxy_stats(proxy_addr).await.slowdowns, 1);
        // Turn faults off at runtime: the (anonymous) server now answers.
        assert_eq!(proxy_configure(proxy_addr, r#"{"slowdown": 0}"#).await.status, 200);
        let resp = raw_request(proxy_addr, "GET", "/train/k", b"").await.unwrap();
        assert_eq!(resp.status, 404, "{}", String::from_utf8_lossy(&resp.body));
    })
    .await;
    assert!(proxy.stop_with("INT").success());
    assert!(server.stop_with("TERM").success());
}

#[test]
fn bad_command_lines_exit_2_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_owned();
    let missing = dir.path().join("missing").to_str().unwrap().to_owned();
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        (S3_SERVER, vec![], "--root"),
        (S3_SERVER, vec!["--root", &missing], "not an existing directory"),
        (S3_SERVER, vec!["--root", &root, "--addr", "nonsense"], "--addr"),
        (S3_SERVER, vec!["--root", &root, "--addr", "127.0.0.1:99999"], "--addr"),
        (S3_SERVER, vec!["--root", &root, "--access-key", "ak"], "--secret-key"),
        (S3_SERVER, vec!["--root", &root, "--bucket", "../escape"], "invalid bucket name"),
        (S3_SERVER, vec!["--root", &root, "--region", ""], "invalid region"),
        (S3_SERVER, vec!["--root", &root, "--frobnicate"], "--frobnicate"),
        (FAULT_PROXY, vec![], "--upstream"),
        (FAULT_PROXY, vec!["--upstream", "localhost"], "--upstream"),
        (FAULT_PROXY, vec!["--upstream", "127.0.0.1:9", "--slowdown", "2"], "slowdown"),
        (FAULT_PROXY, vec!["--upstream", "127.0.0.1:9", "--reset", "abc"], "--reset"),
        (FAULT_PROXY, vec!["--upstream", "127.0.0.1:9", "--latency-ms", "-1"], "-1"),
        (FAULT_PROXY, vec!["--upstream", "127.0.0.1:9", "--spike-ms", "9999999"], "spike_ms"),
    ];
    for (bin, args, expect) in cases {
        let mut child = Command::new(bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = wait_timeout(&mut child, Duration::from_secs(5));
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{bin} {args:?} kept running");
        };
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(status.code(), Some(2), "{bin} {args:?}: {status}, stderr: {stderr}");
        assert!(stderr.contains(expect), "{bin} {args:?}: stderr lacks {expect:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{bin} {args:?} panicked: {stderr}");
        assert!(out.stdout.is_empty(), "{bin} {args:?} printed to stdout");
    }
}

#[test]
fn help_exits_0() {
    for bin in [S3_SERVER, FAULT_PROXY] {
        let out = Command::new(bin).arg("--help").output().unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"));
    }
}
