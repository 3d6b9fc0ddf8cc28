#!/usr/bin/env python3
"""Memory soak: stoker.Loader reads epoch after epoch over S3 (the embedded server) for a
fixed time, with a memory cache smaller than the dataset and a prefetch byte budget, while
this script samples the reader's RSS. The longer run of the reliability checks:

    .venv/bin/python integration/soak.py --minutes 10           # the documented run
    .venv/bin/python integration/soak.py --minutes 0.2 --mb 24  # smoke (the suite runs this)

Needs the S3 server binary (`$STOKER_S3_SERVER`, else target/release/s3_server, else
target/debug/s3_server: `cargo build --release -p stoker-testkit --bin s3_server`) and
the package built into .venv (`maturin develop`).

The reader is a child process (torch output, so every batch goes through DLPack; one sample of
each batch is checked byte for byte). RSS is read from /proc/PID/status once a second; the
child's baseline is its RSS after `import torch, stoker` and opening the source, before the
first batch. Checks, each printed with its figures:
  * growth: median RSS over the last tenth of the run vs. median over the tenth right after
    warm-up (the first quarter, and at least two full epochs, so the cache has filled) < 5%;
  * peak: VmHWM <= baseline + cache_bytes + max_bytes_in_flight + 100 MB (the memory the
    configuration allows, plus the stated slack).
Exit status 0 when both hold (and the reader ran without error), 1 otherwise.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kill_resume import S3Server  # noqa: E402  (the same embedded-server start-up)

ROOT = Path(__file__).resolve().parent.parent
MB = 1 << 20
# Small shards: the test S3 server (s3s-fs) hashes the whole object on every ranged GET, so its
# cost per request grows with the shard, not with the bytes asked for.
SHARD_MB = 2


def payload(i: int) -> bytes:
    """Sample i: 16..112 KiB, its first 8 bytes the index, the rest a repeating pattern."""
    n = (16 + (i * 37) % 97) << 10
    head = i.to_bytes(8, "little")
    return head + bytes((i + j) % 251 for j in range(251)) * ((n - 8) // 251) + b"\x00" * ((n - 8) % 251)


def write_shards(bucket: Path, total_mb: int) -> int:
    bucket.mkdir(parents=True, exist_ok=True)
    i, size, shard = 0, 0, 0
    while size < total_mb * MB:
        with tarfile.open(bucket / f"soak-{shard:04d}.tar", "w") as tf:
            while size < min((shard + 1) * SHARD_MB, total_mb) * MB:
                data = payload(i)
                info = tarfile.TarInfo(f"{i:07d}.bin")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
                size += len(data)
                i += 1
        shard += 1
    return i


def rss_kb(pid: int) -> Tuple[int, int]:
    """(VmRSS, VmHWM) of pid in KiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                fields[k] = int(v.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def child(a: argparse.Namespace) -> int:
    import torch

    import stoker

    ds = stoker.open(a.uri)
    loader = stoker.Loader(
        ds, batch_size=a.batch_size, shuffle=True, seed=7, prefetch=a.prefetch, max_bytes_in_flight=a.budget_mb * MB
    )
    print(json.dumps({"ready": len(ds)}), flush=True)
    sys.stdin.readline()  # the parent reads the baseline RSS, then says go
    deadline = time.monotonic() + a.seconds
    epoch = 0
    while time.monotonic() < deadline:
        seen = 0
        for batch in loader:
            row = seen % len(batch["__index__"])
            i = batch["__index__"][row]
            column = batch["bin"]
            if isinstance(column, tuple):  # (values, offsets)
                got = column[0][column[1][row] : column[1][row + 1]]
            else:  # every sample of the batch has the same length: [B, L]
                got = column[row]
            if bytes(got.numpy()) != payload(i):
                print(f"sample {i} has wrong bytes", file=sys.stderr)
                return 3
            assert isinstance(got, torch.Tensor)
            seen += len(batch["__index__"])
            if time.monotonic() >= deadline:
                break
        else:
            if seen != len(ds):
                print(f"epoch {epoch} delivered {seen} of {len(ds)} samples", file=sys.stderr)
                return 4
            epoch += 1
            print(json.dumps({"epoch": epoch, "stats": loader.stats()}), flush=True)
    # The parent stops measuring here: the interpreter's exit after it (torch's teardown) briefly
    # takes 50-120 MB more, which is not the reader's memory (the RSS is flat to this line).
    print(json.dumps({"done": epoch}), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--mb", type=int, default=160, help="dataset size in MiB (more than the cache)")
    p.add_argument("--cache-mb", type=int, default=48, help="memory cache (cache_bytes)")
    p.add_argument("--budget-mb", type=int, default=32, help="prefetch byte budget (max_bytes_in_flight)")
    p.add_argument("--cache-block-kb", type=int, default=1024, help="cache block (cache_block; stoker's default 1 MiB)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--uri", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a)
    if a.mb <= a.cache_mb:
        p.error("--mb must exceed --cache-mb: the soak is over a dataset larger than the cache")

    # The release server when built: the debug one spends a core on hashing (see SHARD_MB).
    release = ROOT / "target/release/s3_server"
    binary = os.environ.get("STOKER_S3_SERVER") or str(release if release.exists() else ROOT / "target/debug/s3_server")
    work = Path(tempfile.mkdtemp(prefix="stoker-soak-"))
    samples = write_shards(work / "data/soak", a.mb)
    server = S3Server(work / "data", binary, who="soak")
    try:
        return soak(a, work, samples, server.uri("soak") + f"&cache_bytes={a.cache_mb * MB}&cache_block={a.cache_block_kb << 10}")
    finally:
        server.stop()


def soak(a: argparse.Namespace, work: Path, samples: int, uri: str) -> int:
    """Run the reader child over ``uri`` for the set time, sampling its RSS; report and judge."""
    seconds = a.minutes * 60
    cmd = [sys.executable, __file__, "--child", "--uri", uri, "--seconds", str(seconds)]
    cmd += ["--batch-size", str(a.batch_size), "--prefetch", str(a.prefetch), "--budget-mb", str(a.budget_mb)]
    env = {**os.environ, "STOKER_CACHE_DIR": str(work / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    if not ready.startswith('{"ready"'):
        proc.wait()
        sys.exit(f"soak: the reader did not start (exit {proc.returncode})")
    baseline, _ = rss_kb(proc.pid)
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.close()
    started = time.monotonic()
    samples_rss: List[Tuple[float, int]] = []
    epochs: List[Tuple[float, dict]] = []

    done = threading.Event()

    def read_progress() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            report = json.loads(line)
            if "done" in report:
                done.set()
            else:
                epochs.append((time.monotonic() - started, report))

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    peak = 0
    while proc.poll() is None and not done.is_set():
        try:
            rss, hwm = rss_kb(proc.pid)
        except (FileNotFoundError, KeyError, ProcessLookupError):
            break  # exited between poll and read
        samples_rss.append((time.monotonic() - started, rss))
        peak = max(peak, hwm)
        done.wait(1.0)  # the sampling period; ends early when the reader is done
    elapsed = time.monotonic() - started
    proc.wait()
    reader.join(timeout=10)
    # Warm-up: a quarter of the run, and at least two epochs (the cache is full by then).
    warm = max(elapsed / 4, epochs[1][0] if len(epochs) > 1 else elapsed / 4)
    tenth = max(elapsed / 10, 2.0)
    after_warm = [r for t, r in samples_rss if warm <= t < warm + tenth]
    last = [r for t, r in samples_rss if t >= elapsed - tenth]
    if not after_warm or not last:
        print(f"soak: too few RSS samples ({len(samples_rss)}) for a {elapsed:.0f} s run", file=sys.stderr)
        return 1
    early, late = statistics.median(after_warm), statistics.median(last)
    growth = late / early - 1
    allowed = baseline + (a.cache_mb + a.budget_mb + 100) * 1024
    stats = epochs[-1][1]["stats"] if epochs else {}
    report = {
        "minutes": round(elapsed / 60, 2),
        "dataset_mb": a.mb,
        "samples": samples,
        "cache_mb": a.cache_mb,
        "budget_mb": a.budget_mb,
        "cache_block_kb": a.cache_block_kb,
        "batch_size": a.batch_size,
        "prefetch": a.prefetch,
        "epochs": len(epochs),
        "samples_per_s": round(stats.get("samples_per_s", 0), 1),
        "cache_hit_rate": stats.get("cache_hit_rate"),
        "peak_bytes_in_flight_mb": round(stats.get("peak_bytes_in_flight", 0) / MB, 1),
        "rss_baseline_mb": round(baseline / 1024, 1),
        "rss_after_warmup_mb": round(early / 1024, 1),
        "rss_end_mb": round(late / 1024, 1),
        "growth_pct": round(growth * 100, 2),
        "peak_rss_mb": round(peak / 1024, 1),
        "peak_allowed_mb": round(allowed / 1024, 1),
        "rss_min_max_mb": [round(min(r for _, r in samples_rss) / 1024, 1), round(max(r for _, r in samples_rss) / 1024, 1)],
        "reader_exit": proc.returncode,
    }
    print(json.dumps(report))
    failures = []
    if proc.returncode != 0:
        failures.append(f"the reader exited {proc.returncode}")
    if growth >= 0.05:
        failures.append(f"RSS grew {growth:.1%} after warm-up (limit 5%)")
    if peak > allowed:
        failures.append(f"peak RSS {peak / 1024:.0f} MB over baseline + cache + budget + 100 MB = {allowed / 1024:.0f} MB")
    if len(epochs) < 2:
        failures.append(f"only {len(epochs)} full epochs: too short to tell growth from warm-up")
    for f in failures:
        print("FAILED: " + f, file=sys.stderr)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
