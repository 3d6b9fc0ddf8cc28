"""Kill and resume (integration/kill_resume.py): 100 SIGKILLs of stoker.Loader consumers over
S3 (4 ranks, shuffled, a shared disk cache), at batch/log/checkpoint events and by timer, each
resumed from its checkpoint; the committed deliveries are the epoch exactly once."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "integration" / "kill_resume.py"


def run(*args, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def report(r):
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    return json.loads(lines[-1])


def test_a_hundred_kills_over_s3_lose_and_repeat_nothing():
    assert os.environ.get("STOKER_S3_SERVER"), "set STOKER_S3_SERVER (integration/test.sh builds and sets it)"
    r = run("--kills", "100", "--ranks", "4", "--seed", "1", "--backend", "s3")
    got = report(r)
    assert r.returncode == 0, f"{got}\n{r.stderr}"
    assert got["kills"] == 100 and got["samples"] == got["committed"] == 1200
    assert got["missing"] == got["duplicated"] == 0 and got["order_as_uninterrupted"]
    # The kills fell everywhere that matters, not only between batches.
    events = {"received", "mid-record", "recorded", "mid-save", "pre-rename", "saved"}
    assert events <= set(got["kills_by_event"]), got["kills_by_event"]
    assert got["delivered_then_dropped_on_resume"] > 0 and got["unrenamed_checkpoints_left"] > 0
    # The runs shared a disk cache that kills interrupted, and read it back right.
    assert got["disk_cache_blocks"] > 0


def test_the_check_fails_for_a_consumer_that_checkpoints_before_logging():
    # Without kills that consumer is right, so the check does not fail by construction...
    clean = run("--kills", "0", "--backend", "tar", "--protocol", "save-first")
    assert clean.returncode == 0 and report(clean)["missing"] == 0, clean.stderr
    # ...and with kills it loses the batch of each last checkpoint, which the check reports.
    r = run("--kills", "12", "--backend", "tar", "--protocol", "save-first")
    got = report(r)
    assert r.returncode == 1 and got["missing"] > 0 and "missing" in r.stderr, (got, r.stderr)
