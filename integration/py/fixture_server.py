"""Run this folder's writer and reader scripts for the test suites, each in a child forked from
a process that has already imported what they import.

The scripts write fixtures with the peers' own writers (MosaicML Streaming, LitData, pyarrow,
h5py, Megatron, tfrecord, `datasets`), run by .venv-peers' Python. Most of each run was the
import of those packages (torch among them: 4-5 s of CPU a run on a 2-core VM, about 30 runs
in the Rust suite and 10 in the Python one). Here they are imported once; each request forks a
child that runs one script as ``python SCRIPT ARGS...`` would (``__main__``, ``sys.argv``, its
own stdout, stderr and working directory), so no script sees another's state.

With ``--preload`` it imports those packages first (the writers' venv); without, nothing (a
venv without them, whose scripts are light). Protocol, over this process's stdin and stdout:
it prints ``ready`` once its imports are done; then, for each request line (a JSON object:
``{"argv": [script, args...], "cwd": dir}``), it answers ``RC STDOUT_BYTES STDERR_BYTES`` on a
line, followed by the child's stdout and stderr bytes. EOF on stdin ends it. Clients: ``crates/stoker/tests/common/writers.rs`` and
``crates/stoker-py/tests/writers.py``.
"""
import importlib
import json
import os
import runpy
import sys
import tempfile
import traceback

# What the scripts import that costs time; one that is missing is left to the script to report.
PRELOAD = ("numpy", "pyarrow", "pyarrow.parquet", "torch", "streaming", "litdata", "h5py", "tfrecord",
           "zstandard", "tokenizers", "PIL.Image", "datasets")


def run(argv, cwd):
    """Fork a child running script argv[0] with argv; its exit status, stdout and stderr."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            os.chdir(cwd)
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            try:
                runpy.run_path(argv[0], run_name="__main__")
                code = 0
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                # Not the parent's exit handlers: they belong to this server.
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    out.seek(0)
    err.seek(0)
    return os.waitstatus_to_exitcode(status), out.read(), err.read()


def main():
    for name in PRELOAD if "--preload" in sys.argv[1:] else ():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 (a script that needs it reports its own error)
            pass
    reply = sys.stdout.buffer
    reply.write(b"ready\n")
    reply.flush()
    for line in sys.stdin.buffer:
        req = json.loads(line)
        rc, out, err = run(req["argv"], req["cwd"])
        reply.write(b"%d %d %d\n" % (rc, len(out), len(err)) + out + err)
        reply.flush()


if __name__ == "__main__":
    main()
