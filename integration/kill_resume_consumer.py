"""One rank's consumer for integration/kill_resume.py: reads its share of an epoch through
stoker.Loader, checks every sample's bytes, logs the indices it received and checkpoints, and
SIGKILLs itself at a chosen event so the driver can resume it.

Commit protocol (what makes "delivered exactly once" checkable after a SIGKILL anywhere):
  * the log (`rank-R.log`) is append-only, one fixed-width line per delivered sample index;
  * the checkpoint (`rank-R.ckpt`) holds the loader's ``state_dict()`` AND the log's length in
    bytes, written to a temporary file, fsynced, then ``os.replace``d over the old one, so a
    reader sees either the old pair or the new pair, never a mix;
  * per batch: log the batch, fsync the log, then (on save batches) checkpoint. The state then
    never counts a batch the log does not hold;
  * on start: truncate the log to the checkpoint's length (dropping what was delivered but not
    committed, including a torn line) and ``load_state_dict`` the checkpoint's state.
The committed log is then the set of delivered samples, and it must be the epoch exactly once.

``--protocol save-first`` checkpoints before logging the batch (except the last): the state
then counts a batch the log may never get, which loses samples when killed in between; run
without kills it delivers the epoch exactly once. The driver's self-test
runs it to show that the check catches a wrong protocol.

Events, in order for batch ``b``: ``received``, ``mid-record`` (half the batch logged plus a
torn line), ``recorded``; on save batches also ``mid-save`` (half the temporary file
written), ``pre-rename`` (complete and fsynced, not yet replaced), ``saved`` (replaced).
``events(...)`` lists them; ``--die-at K`` kills at the K-th event of the epoch (counting
from the start of the epoch, not of this run, so the point is independent of where a run
resumed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import List, Tuple

LINE = 7  # "%06d\n"


def payload(i: int) -> bytes:
    """Sample i's bytes: length 64..4159 varying with i, content a function of i."""
    n = 64 + (i * 2654435761) % 4096
    return bytes((i * 131 + j * 7 + (j >> 8)) % 251 for j in range(n))


def save_batch(seed: int, b: int) -> bool:
    """Whether batch b ends with a checkpoint: 2 of 3 batches, the pattern fixed by the seed,
    so some kills fall after a delivery that no checkpoint covers yet."""
    return (b * 7919 + seed * 104729) % 3 != 0


def events(num_batches: int, seed: int) -> List[Tuple[int, str]]:
    """Every event of an epoch of ``num_batches`` batches, in order."""
    out = []
    for b in range(num_batches):
        out += [(b, "received"), (b, "mid-record"), (b, "recorded")]
        if save_batch(seed, b) or b == num_batches - 1:
            out += [(b, "mid-save"), (b, "pre-rename"), (b, "saved")]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--uri", required=True)
    p.add_argument("--dir", required=True, help="where rank-R.log and rank-R.ckpt live")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="shuffle seed and save pattern")
    p.add_argument("--epoch", type=int, default=1)
    p.add_argument("--die-at", type=int, default=-1, help="SIGKILL self at this event (-1: never)")
    p.add_argument("--protocol", choices=["commit", "save-first"], default="commit")
    a = p.parse_args()

    import stoker  # after argument parsing: --help works without the native module

    log_path = os.path.join(a.dir, f"rank-{a.rank}.log")
    ckpt_path = os.path.join(a.dir, f"rank-{a.rank}.ckpt")
    tmp_path = ckpt_path + ".tmp"
    ckpt = None
    if os.path.exists(ckpt_path):
        with open(ckpt_path) as f:
            ckpt = json.load(f)  # always whole: it only ever appears by os.replace
    if os.path.exists(tmp_path):
        os.remove(tmp_path)  # a checkpoint a kill left unrenamed: never valid, never read
    log_len = ckpt["log_len"] if ckpt else 0
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.ftruncate(fd, log_len)  # drop what was delivered after the last checkpoint
    if ckpt and ckpt["done"]:
        print(json.dumps({"rank": a.rank, "done": True, "batches": 0}))
        return 0

    loader = stoker.Loader(
        a.uri,
        batch_size=a.batch_size,
        shuffle=True,
        seed=a.seed,
        rank=a.rank,
        world_size=a.world_size,
        output="numpy",
        prefetch=3,
    )
    if ckpt and ckpt["loader"]["loader"] is not None:
        loader.load_state_dict(ckpt["loader"])
        first = ckpt["batches"]
    else:
        loader.set_epoch(a.epoch)
        first = 0
    print("opened", file=sys.stderr, flush=True)  # tells the driver where a timed kill landed
    schedule = events(len(loader), a.seed)
    position = {e: k for k, e in enumerate(schedule)}

    def event(b: int, name: str) -> None:
        if position.get((b, name)) == a.die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def checkpoint(b: int, done: bool) -> None:
        body = json.dumps(
            {"loader": loader.state_dict(), "log_len": log_len, "batches": b + 1, "done": done}
        ).encode()
        with open(tmp_path, "wb") as f:
            f.write(body[: len(body) // 2])
            f.flush()
            event(b, "mid-save")
            f.write(body[len(body) // 2 :])
            f.flush()
            os.fsync(f.fileno())
        event(b, "pre-rename")
        os.replace(tmp_path, ckpt_path)
        event(b, "saved")

    done_batches = 0
    b = first - 1
    for b, batch in enumerate(loader, start=first):
        event(b, "received")
        idx = [int(i) for i in batch["__index__"]]
        column = batch["bin"]
        for row, i in enumerate(idx):
            if isinstance(column, tuple):  # (values, offsets): lengths differ in this batch
                got = column[0][column[1][row] : column[1][row + 1]].tobytes()
            else:
                got = column[row].tobytes()
            if got != payload(i) or batch["__key__"][row] != f"{i:06d}":
                print(f"rank {a.rank} batch {b}: sample {i} has wrong bytes or key", file=sys.stderr)
                return 3
        lines = "".join(f"{i:06d}\n" for i in idx).encode()
        last = b == len(loader) - 1
        save = save_batch(a.seed, b) or last
        early = a.protocol == "save-first" and save and not last
        if early:
            checkpoint(b, done=False)  # counts batch b, which the log does not hold yet
        half = (len(idx) // 2) * LINE
        os.pwrite(fd, lines[:half] + lines[half : half + 3], log_len)  # ends in a torn line
        event(b, "mid-record")
        os.pwrite(fd, lines, log_len)
        log_len += len(lines)
        event(b, "recorded")
        os.fsync(fd)  # the log is durable before a checkpoint refers to it
        if save and not early:
            checkpoint(b, done=last)
        done_batches += 1
    if b < len(loader) - 1:
        print(f"rank {a.rank}: the epoch ended at batch {b}, expected {len(loader)} batches", file=sys.stderr)
        return 4
    print(json.dumps({"rank": a.rank, "done": True, "batches": done_batches}))
    return 0


if __name__ == "__main__":
    # This consumer uses numpy output: keeping torch out makes each of the ~100 restarts
    # cost a fraction of a second instead of ~2 s of `import torch`.
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    sys.exit(main())
