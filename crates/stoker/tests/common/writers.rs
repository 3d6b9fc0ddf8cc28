//! The scripts of `integration/py` (fixture writers, Megatron's reader), run through
//! `integration/py/fixture_server.py`: one Python per test thread that needs one, started
//! once, that has already imported the peers' packages and forks a child per script. Started
//! afresh, each run spent 4-5 s of CPU importing torch and the writers; the suite runs about
//! thirty.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

/// What a script printed, and how it ended.
#[derive(Debug)]
pub struct ScriptOutput {
    /// Its exit status (negative: the signal that ended it).
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl ScriptOutput {
    /// Whether the script exited with status 0.
    pub fn success(&self) -> bool {
        self.code == 0
    }
}

struct Server {
    py: PathBuf,
    /// Held so the server is a child of this process until it is dropped (its stdin closed,
    /// it exits).
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// Servers not running a script now.
static IDLE: Mutex<Vec<Server>> = Mutex::new(Vec::new());

/// The folder of the scripts.
fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/py")
}

fn start(py: &Path) -> Server {
    let script = scripts_dir().join("fixture_server.py");
    let mut child = Command::new(py)
        .arg(&script)
        // The peers' packages are imported up front only where they are installed.
        .args((py == super::writers_python()).then_some("--preload"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // Its imports' warnings are not the tests' output; a script's stderr comes back with
        // its answer.
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e}; run integration/setup.sh (it makes the venvs with the Python packages tests need)",
                py.display()
            )
        });
    let stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n", "{} {} did not start; run it by hand to see why", py.display(), script.display());
    Server { py: py.to_path_buf(), _child: child, stdin, stdout }
}

/// Run `integration/py/SCRIPT ARGS...` with Python `py`, as `py SCRIPT ARGS...` would (in this
/// process's working directory), and return what it printed.
pub fn run_script(py: &Path, script: &str, args: &[impl AsRef<str>]) -> ScriptOutput {
    let taken = {
        let mut idle = IDLE.lock().unwrap_or_else(|p| p.into_inner());
        idle.iter().position(|s| s.py == py).map(|i| idle.swap_remove(i))
    };
    let mut server = taken.unwrap_or_else(|| start(py));
    let mut argv = vec![scripts_dir().join(script).display().to_string()];
    argv.extend(args.iter().map(|a| a.as_ref().to_string()));
    let cwd = std::env::current_dir().unwrap();
    let req = serde_json::json!({ "argv": argv, "cwd": cwd });
    let stopped = |what: &dyn std::fmt::Display| -> ! {
        panic!(
            "the fixture server ({} {}) stopped ({what}) while running {script}; run the script by hand to see why",
            py.display(),
            scripts_dir().join("fixture_server.py").display()
        )
    };
    writeln!(server.stdin, "{req}").and_then(|_| server.stdin.flush()).unwrap_or_else(|e| stopped(&e));
    let mut head = String::new();
    match server.stdout.read_line(&mut head) {
        Ok(0) => stopped(&"no answer"),
        Err(e) => stopped(&e),
        Ok(_) => {}
    }
    let nums: Vec<i64> = head.split_whitespace().map(|n| n.parse().unwrap_or_else(|e| stopped(&e))).collect();
    let [code, out, err] = nums[..] else { stopped(&format!("answer {head:?}")) };
    let mut read = |n: i64| {
        let mut b = vec![0; n as usize];
        server.stdout.read_exact(&mut b).unwrap_or_else(|e| stopped(&e));
        b
    };
    let (stdout, stderr) = (read(out), read(err));
    IDLE.lock().unwrap_or_else(|p| p.into_inner()).push(server);
    ScriptOutput { code: code as i32, stdout, stderr }
}
