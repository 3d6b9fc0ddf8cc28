"""The memory soak's smoke run (integration/soak.py --minutes 0.2 on a small dataset): the
script runs end to end and its checks hold. The real soak is the documented 10-minute run."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "integration" / "soak.py"


def test_soak_smoke_rss_flat_and_within_budget():
    assert os.environ.get("STOKER_S3_SERVER"), "set STOKER_S3_SERVER (integration/test.sh builds and sets it)"
    args = ["--minutes", "0.2", "--mb", "8", "--cache-mb", "4", "--budget-mb", "4"]
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    got = json.loads(lines[-1])
    assert r.returncode == 0, f"{got}\n{r.stderr}"
    assert got["reader_exit"] == 0 and got["epochs"] >= 2
    assert got["dataset_mb"] > got["cache_mb"] and got["cache_hit_rate"] is not None
    assert got["peak_rss_mb"] <= got["peak_allowed_mb"] and got["growth_pct"] < 5
