"""The Python examples in examples/ run as documented (small sizes, real torch DataLoader)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def run_example(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_pytorch_dataloader_example_runs_every_way_and_resumes() -> None:
    out = run_example("pytorch_dataloader.py", "--samples", "600", "--size", "1024", "--workers", "2")
    for way in ("DataLoader(stoker.open(uri), workers)", "DataLoader(stoker.torch.IterableDataset)", "stoker.Loader"):
        line = next((l for l in out.splitlines() if l.startswith(way)), None)
        assert line is not None, f"no result line for {way}:\n{out}"
        assert line.split()[-4] == "600", f"{way} did not read every sample once: {line}"
    assert "covered exactly once across two loaders (600 samples)" in out


def test_webdataset_shards_example_packs_to_s3_and_trains_from_it() -> None:
    # Uses target/debug/stoker (built by `cargo test --workspace`) and STOKER_S3_SERVER.
    out = run_example("webdataset_shards.py", "--samples", "600", "--size", "4096", "--shard-size", "1MiB")
    shards = re.search(r"into (\d+) tar shards", out)
    assert shards and int(shards.group(1)) >= 3, f"1 MiB shards of ~3 MiB of tar should be several:\n{out}"
    for epoch in (0, 1):
        assert f"epoch {epoch}: 600 samples from S3" in out and "bytes checked" in out, out
    assert "read train-000000.tar" in out and "bytes match" in out, out
