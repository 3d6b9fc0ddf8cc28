//! Fixtures shared by the CLI's integration tests.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::Path;
use std::process::{Command, Output};

/// Run the `stoker` binary under test.
pub fn stoker(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stoker")).args(args).output().expect("run stoker")
}

/// Command output as text, invalid UTF-8 replaced.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Two shards, three samples each, fields `txt` and `cls`.
pub fn shards(dir: &Path) {
    for s in 0..2 {
        let mut b = tar::Builder::new(std::fs::File::create(dir.join(format!("s-{s}.tar"))).unwrap());
        for i in 0..3 {
            for (ext, data) in [("txt", format!("sample {s}-{i}")), ("cls", format!("{i}"))] {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                b.append_data(&mut h, format!("k{s}{i}.{ext}"), data.as_bytes()).unwrap();
            }
        }
        b.into_inner().unwrap();
    }
}

/// The Python the tests write fixtures with: `$STOKER_PYTHON`, else the project's `.venv`,
/// else `python3`.
pub fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("STOKER_PYTHON") {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}
