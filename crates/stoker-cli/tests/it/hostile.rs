//! The hostile corpus (`integration/py/hostile.py`) through the real `stoker` binary under a
//! 6 GiB address-space cap (`ulimit -v`): `cat`, `ls` and `inspect` of each case exit with an
//! error (status 1, a message naming the file), never an abort, within seconds.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::python;

#[test]
fn hostile_files_are_an_error_exit_never_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/py/hostile.py");
    let out = Command::new(python()).arg(&script).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cases: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let bin = env!("CARGO_BIN_EXE_stoker");
    for case in cases.as_array().unwrap() {
        let (path, options) = (case["path"].as_str().unwrap(), case["options"].as_str().unwrap());
        let target = dir.path().join(path);
        let uri =
            if options.is_empty() { target.display().to_string() } else { format!("{}?{options}", target.display()) };
        for cmd in [vec!["cat", uri.as_str(), "0"], vec!["ls", uri.as_str()], vec!["inspect", uri.as_str()]] {
            // The cap is on address space: an allocation of the sizes the corpus claims
            // (petabytes) fails at once instead of taking the machine's memory.
            let line = "ulimit -v 6291456; exec \"$0\" \"$@\"";
            let started = Instant::now();
            let run = Command::new("sh").arg("-c").arg(line).arg(bin).args(&cmd).output().unwrap();
            let took = started.elapsed();
            let err = String::from_utf8_lossy(&run.stderr);
            let what = format!("stoker {} ({})", cmd.join(" "), case["name"]);
            // `cat` reads a sample, so it must fail; `ls` and `inspect` may describe what the
            // index says without reading what it lies about, but never die.
            match (cmd[0], run.status.code()) {
                (_, Some(1)) => assert!(err.contains("error:") && err.contains(path), "{what}: {err}"),
                ("ls" | "inspect", Some(0)) => {}
                (_, code) => panic!("{what}: exit {code:?} (a signal, or success where a read must fail): {err}"),
            }
            assert!(!err.contains("panicked") && !err.contains("memory allocation"), "{what}: {err}");
            assert!(took < Duration::from_secs(10), "{what}: {took:?}");
        }
    }
}
