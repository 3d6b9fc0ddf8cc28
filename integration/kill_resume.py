#!/usr/bin/env python3
"""Kill and resume: SIGKILL stoker.Loader consumers at seeded random points, resume each from
its checkpoint, and check that what was committed over all runs is the epoch exactly once,
with the right bytes, in the order an uninterrupted run delivers.

    .venv/bin/python integration/kill_resume.py                 # 100 kills, 4 ranks, S3
    .venv/bin/python integration/kill_resume.py --seed 7 --kills 300 --backend tar

The data is WebDataset tar shards (shuffled order), served by the embedded S3 server
(`$STOKER_S3_SERVER`, else target/debug/s3_server; `cargo build -p stoker-testkit --bin
s3_server` makes it) or read from local disk with ``--backend tar``. Each rank is a chain of
consumer processes (integration/kill_resume_consumer.py, which describes the commit protocol
and the kill events); the ranks run side by side, each killed at its own points, chosen
uniformly over the epoch's events: on receiving a batch, mid-way through logging it (torn
line), after logging, mid-way through writing the checkpoint, before and after its rename.
The kill points follow from ``--seed``: the same seed kills at the same events. A share of
the runs (``--timed-share``) is also SIGKILLed by this script after a seeded random delay
(``--max-timer``), whichever comes first: those kills land where no event is, e.g. during
start-up, while the source opens, or while Stoker writes its disk cache (the S3 runs share a
disk cache and a memory cache, in 64 KiB blocks); the same seed gives the same delays, not
the same instruction.

Exit status 0 when the check holds, 1 with the missing/duplicated samples otherwise.
``--protocol save-first`` runs a consumer that checkpoints before logging: the check must
fail for it (the pytest wrapper asserts that).
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from kill_resume_consumer import LINE, events, payload  # noqa: E402

CONSUMER = HERE / "kill_resume_consumer.py"
RUN_TIMEOUT_S = 120  # one consumer run; a hang is a failure, not a wait


def write_shards(bucket: Path, samples: int, shards: int) -> None:
    bucket.mkdir(parents=True, exist_ok=True)
    per = -(-samples // shards)
    for s in range(shards):
        with tarfile.open(bucket / f"shard-{s:04d}.tar", "w", format=tarfile.PAX_FORMAT) as tf:
            for i in range(s * per, min((s + 1) * per, samples)):
                for ext, data in (("bin", payload(i)), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))


class S3Server:
    """The embedded S3 server over ``root`` (each subdirectory a bucket)."""

    def __init__(self, root: Path, binary: Optional[str] = None, who: str = "kill_resume") -> None:
        binary = binary or os.environ.get("STOKER_S3_SERVER") or str(ROOT / "target/debug/s3_server")
        if not os.path.isfile(binary):
            sys.exit(
                f"{who}: no S3 server binary at {binary}: build it with "
                "`cargo build -p stoker-testkit --bin s3_server` or set STOKER_S3_SERVER"
            )
        self.proc = subprocess.Popen(
            [binary, "--root", str(root), "--access-key", "ak", "--secret-key", "sk"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.proc.kill()
            sys.exit(f"{who}: the S3 server did not start: {line!r}")
        self.endpoint = "http://" + line.split()[-1]

    def uri(self, path: str) -> str:
        return f"s3://{path}?endpoint={self.endpoint}&access_key_id=ak&secret_access_key=sk"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class Chain:
    """One rank: consumer runs, each killed at its next point, then one run to the end."""

    def __init__(self, args: argparse.Namespace, uri: str, rank: int, work: Path, env: Dict[str, str]) -> None:
        self.args, self.uri, self.rank, self.work, self.env = args, uri, rank, work, env
        self.kills: List[int] = []
        self.uncommitted = 0  # samples delivered, then dropped on resume (not checkpointed)
        self.tmp_left = 0  # kills that left a half- or fully-written checkpoint never renamed
        self.runs = 0
        self.unreached = 0  # kill points a resumed run never reached (save-first mode only)
        self.error: Optional[str] = None
        self.timed = 0  # kills by timer rather than at an event
        # Which runs also get a timer, and its delay: seeded per rank.
        self.rng = random.Random(args.seed * 1009 + rank)

    def run(self, die_at: int = -1, timer: Optional[float] = None) -> subprocess.CompletedProcess:
        """One consumer run; with `timer`, SIGKILLed from here after that many seconds unless
        it died at `die_at` first."""
        a = self.args
        cmd = [sys.executable, str(CONSUMER), "--uri", self.uri, "--dir", str(self.work)]
        cmd += ["--rank", str(self.rank), "--world-size", str(a.ranks), "--batch-size", str(a.batch_size)]
        cmd += ["--seed", str(a.seed), "--die-at", str(die_at), "--protocol", a.protocol]
        self.runs += 1
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        try:
            out, err = proc.communicate(timeout=timer if timer is not None else RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            if timer is None:
                proc.kill()
                proc.communicate()
                raise
            proc.kill()  # SIGKILL at a moment no event chose: start-up, open, native calls
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
            if proc.returncode == -9:
                self.timed += 1
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def committed_len(self) -> int:
        ckpt = self.work / f"rank-{self.rank}.ckpt"
        return json.loads(ckpt.read_text())["log_len"] if ckpt.exists() else 0

    def drive(self, points: List[int]) -> None:
        try:
            self._drive(points)
        except subprocess.TimeoutExpired as e:
            self.error = f"rank {self.rank}: a consumer run hung (> {RUN_TIMEOUT_S} s): {e.cmd}"
        except Exception as e:  # reported by the main thread, never lost in this one
            self.error = f"rank {self.rank}: {type(e).__name__}: {e}"

    def _drive(self, points: List[int]) -> None:
        log = self.work / f"rank-{self.rank}.log"
        tmp = self.work / f"rank-{self.rank}.ckpt.tmp"
        for point in points:
            timed = self.rng.random() < self.args.timed_share
            timer = self.rng.uniform(0.0, self.args.max_timer) if timed else None
            before = self.timed
            r = self.run(point, timer)
            if r.returncode == 0:
                if self.args.protocol == "commit":
                    self.error = f"rank {self.rank}: kill point {point} was never reached:\n{r.stdout}{r.stderr}"
                    return
                self.unreached += 1
                continue
            if r.returncode != -9:
                self.error = f"rank {self.rank}: consumer exited {r.returncode} (not SIGKILL):\n{r.stderr}"
                return
            if self.timed > before:  # by the timer: before or after the source had opened
                self.kills.append(-2 if "opened" in r.stderr else -1)
            else:
                self.kills.append(point)
            extra = log.stat().st_size - self.committed_len() if log.exists() else 0
            self.uncommitted += -(-max(extra, 0) // LINE)
            self.tmp_left += tmp.exists()
        r = self.run()
        if r.returncode != 0:
            self.error = f"rank {self.rank}: the final run exited {r.returncode}:\n{r.stderr}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=100, help="SIGKILLs in total over all ranks")
    p.add_argument("--seed", type=int, default=1, help="kill points, shuffle and checkpoint pattern")
    p.add_argument("--ranks", type=int, default=4, help="ranks, each a chain of runs; side by side")
    p.add_argument("--samples", type=int, default=1200)
    p.add_argument("--shards", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=6)
    p.add_argument("--backend", choices=["s3", "tar"], default="s3")
    p.add_argument("--protocol", choices=["commit", "save-first"], default="commit")
    p.add_argument("--timed-share", type=float, default=0.3, help="share of runs that also get a kill timer")
    p.add_argument("--max-timer", type=float, default=1.5, help="timer delays are uniform in [0, this] seconds")
    p.add_argument("--work", help="work directory (default: a temporary one, removed after)")
    a = p.parse_args()
    if a.samples % a.ranks:
        p.error("--samples must divide by --ranks (no wrap padding, so the epoch is each sample once)")

    started = time.monotonic()
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="stoker-kill-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    write_shards(work / "data/bucket/kr", a.samples, a.shards)
    env = {**os.environ, "STOKER_CACHE_DIR": str(work / "cache")}
    server = S3Server(work / "data") if a.backend == "s3" else None
    uri = server.uri("bucket/kr") if server else str(work / "data/bucket/kr")
    if server:
        # A memory cache and a disk cache that all ranks' processes share, in 64 KiB blocks:
        # runs write blocks as they go, so kills land mid-write too, and later runs read them.
        disk = urllib.parse.quote(str(work / "disk-cache"), safe="")
        uri += f"&cache_bytes={32 << 20}&cache_block={64 << 10}&disk_cache_dir={disk}"
    try:
        # The uninterrupted run of each rank: the order a resumed chain must reproduce.
        refs = []
        for rank in range(a.ranks):
            (work / f"ref-{rank}").mkdir(exist_ok=True)
            refs.append(Chain(a, uri, rank, work / f"ref-{rank}", env))
        threads = [threading.Thread(target=c.drive, args=([],)) for c in refs]
        chains = []
        for rank in range(a.ranks):
            (work / f"run-{rank}").mkdir(exist_ok=True)
            chains.append(Chain(a, uri, rank, work / f"run-{rank}", env))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        errors = [c.error for c in refs if c.error]
        if errors:
            print("\n".join(errors), file=sys.stderr)
            return 1
        rng = random.Random(a.seed)
        plans = []
        for c, ref in zip(chains, refs):
            batches = int(json.loads((ref.work / f"rank-{c.rank}.ckpt").read_text())["batches"])
            n_events = len(events(batches, a.seed))
            k = a.kills // a.ranks + (c.rank < a.kills % a.ranks)
            if k > n_events:
                p.error(f"{k} kills for rank {c.rank} but its epoch has only {n_events} events")
            plans.append(sorted(rng.sample(range(n_events), k)))
        threads = [threading.Thread(target=c.drive, args=(plan,)) for c, plan in zip(chains, plans)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        if server:
            server.stop()

    errors = [c.error for c in chains if c.error]
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1

    def committed(c: Chain) -> List[int]:
        data = (c.work / f"rank-{c.rank}.log").read_bytes()
        n = c.committed_len()
        if len(data) != n and a.protocol == "commit":
            raise AssertionError(f"rank {c.rank}: log has {len(data)} bytes, the checkpoint commits {n}")
        return [int(x) for x in data[:n].decode().split()]

    names = {}
    for c in chains:
        plan_events = events(int(json.loads((c.work / f"rank-{c.rank}.ckpt").read_text())["batches"]), a.seed)
        for k in c.kills:
            name = {-1: "timer-while-starting", -2: "timer-while-reading"}.get(k) or plan_events[k][1]
            names[name] = names.get(name, 0) + 1
    counts = collections.Counter(i for c in chains for i in committed(c))
    missing = sorted(set(range(a.samples)) - set(counts))
    twice = sorted(i for i, n in counts.items() if n > 1)
    unknown = sorted(set(counts) - set(range(a.samples)))
    order_ok = all(committed(c) == committed(r) for c, r in zip(chains, refs))
    kills = sum(len(c.kills) for c in chains)
    report = {
        "backend": a.backend,
        "protocol": a.protocol,
        "seed": a.seed,
        "ranks": a.ranks,
        "samples": a.samples,
        "kills": kills,
        "kills_by_event": dict(sorted(names.items())),
        "runs": sum(c.runs for c in chains),
        "delivered_then_dropped_on_resume": sum(c.uncommitted for c in chains),
        "unrenamed_checkpoints_left": sum(c.tmp_left for c in chains),
        "kill_points_not_reached": sum(c.unreached for c in chains),
        "disk_cache_blocks": sum(1 for _ in (work / "disk-cache").rglob("*.blk")) if server else None,
        "committed": sum(counts.values()),
        "missing": len(missing),
        "duplicated": len(twice),
        "order_as_uninterrupted": order_ok,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(report))
    ok = not missing and not twice and not unknown and order_ok and (kills == a.kills or a.protocol != "commit")
    if not ok:
        print(f"FAILED: missing {missing[:20]} duplicated {twice[:20]} unknown {unknown[:20]}", file=sys.stderr)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
