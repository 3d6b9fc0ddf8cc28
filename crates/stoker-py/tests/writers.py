"""The writer scripts of integration/py, run by .venv-peers' Python through
integration/py/fixture_server.py: one server a test process, started at its first script, that
has already imported the peers' packages and forks a child per script (each script started
afresh spent 4-5 s of CPU importing torch and the writers)."""

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ROOT / "integration/py"
_server = None


def writers_python() -> str:
    return os.environ.get("STOKER_WRITERS_PYTHON") or str(ROOT / ".venv-peers/bin/python")


def run(script: str, *args) -> subprocess.CompletedProcess:
    """``python integration/py/SCRIPT ARGS...`` with the writers' Python, in this process's
    working directory: its exit status and its stdout and stderr as text."""
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([writers_python(), str(SCRIPTS / "fixture_server.py"), "--preload"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        ready = _server.stdout.readline()
        assert ready == b"ready\n", f"{writers_python()} fixture_server.py did not start (run integration/setup.sh)"
    argv = [str(SCRIPTS / script), *map(str, args)]
    _server.stdin.write(json.dumps({"argv": argv, "cwd": os.getcwd()}).encode() + b"\n")
    _server.stdin.flush()
    head = _server.stdout.readline().split()
    assert len(head) == 3, f"the fixture server stopped while running {script} {args}; run the script by hand"
    rc, n_out, n_err = map(int, head)
    out, err = _server.stdout.read(n_out), _server.stdout.read(n_err)
    return subprocess.CompletedProcess(argv, rc, out.decode(), err.decode(errors="replace"))
