"""Feeding a GPU: Stoker's loader (pinned pool, copies on its own stream) against PyTorch's
DataLoader (workers, ``pin_memory=True``, ``.cuda(non_blocking=True)``) on the same tar shards,
and both against the bound: pinned host-to-device copies of the same batch size with nothing
else to do.

Needs a CUDA machine with torch, and a release build of the ``train_loop`` example with the
``cuda`` feature::

    cargo build --release -p stoker-examples --features cuda --example train_loop
    python integration/bench_gpu.py --train-loop target/release/examples/train_loop

The data is written first (random bytes, so nothing compresses) and is in the page cache for
every row: this measures the pipeline from page cache to device memory, not a disk.
Each row reads ``--epochs`` epochs in a shuffled order; each step waits for its batch's copy
to finish, as a training step that reads the batch would.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import time
from typing import List, Tuple


def write_shards(root: str, samples: int, size: int, per_shard: int) -> None:
    """Tar shards of one ``.data`` member per sample, WebDataset style."""
    os.makedirs(root, exist_ok=True)
    if len(os.listdir(root)) > 0:
        return
    for s in range(0, samples, per_shard):
        with tarfile.open(os.path.join(root, f"shard-{s // per_shard:06}.tar"), "w") as t:
            for i in range(s, min(s + per_shard, samples)):
                info = tarfile.TarInfo(f"{i:08}.data")
                info.size = size
                t.addfile(info, _Reader(os.urandom(size)))


class _Reader:
    def __init__(self, b: bytes) -> None:
        self.b = b
        self.at = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.b) if n < 0 else self.at + n
        out = self.b[self.at : end]
        self.at = end
        return out


def bound(batch_bytes: int, seconds: float) -> float:
    """GB/s of back-to-back pinned host-to-device copies of one batch's bytes."""
    import torch

    host = torch.empty(batch_bytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(batch_bytes, dtype=torch.uint8, device="cuda")
    for _ in range(10):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        n += 1
    return n * batch_bytes / (time.perf_counter() - t0) / 1e9


class TarSamples:
    """A map-style Dataset over the shards' members: offsets read once, then one pread each."""

    def __init__(self, root: str) -> None:
        self.items: List[Tuple[str, int, int]] = []
        for name in sorted(n for n in os.listdir(root) if n.endswith(".tar")):
            path = os.path.join(root, name)
            with tarfile.open(path) as t:
                for m in t.getmembers():
                    self.items.append((path, m.offset_data, m.size))
        self.fds: dict = {}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        import torch

        path, off, size = self.items[i]
        fd = self.fds.get(path)
        if fd is None:
            fd = self.fds[path] = os.open(path, os.O_RDONLY)
        return torch.frombuffer(bytearray(os.pread(fd, size, off)), dtype=torch.uint8)


def torch_loader(root: str, batch: int, epochs: int, workers: int) -> Tuple[float, float]:
    """(samples/s, GB/s) of DataLoader → pin_memory → .cuda(non_blocking) → wait."""
    import torch
    from torch.utils.data import DataLoader

    ds = TarSamples(root)
    dl = DataLoader(
        ds,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        pin_memory=True,
        drop_last=True,
        persistent_workers=True,
        prefetch_factor=4,
        generator=torch.Generator().manual_seed(17),
    )
    stream = torch.cuda.Stream()
    n = 0
    nbytes = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for x in dl:
            with torch.cuda.stream(stream):
                d = x.cuda(non_blocking=True)
            stream.synchronize()
            n += d.shape[0]
            nbytes += d.numel()
    secs = time.perf_counter() - t0
    return n / secs, nbytes / secs / 1e9


def stoker_loader(train_loop: str, root: str, batch: int, epochs: int, cpu: bool) -> Tuple[float, float]:
    cmd = [train_loop, root, "--epochs", str(epochs), "--batch", str(batch), "--step-ms", "0"]
    if cpu:
        cmd.append("--cpu")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    m = re.search(r"\(([\d.]+) samples/s, ([\d.]+) GB/s\)", out.stdout)
    if not m:
        raise SystemExit(f"unexpected train_loop output: {out.stdout!r}")
    return float(m.group(1)), float(m.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-loop", required=True, help="the train_loop example built with --features cuda")
    ap.add_argument("--data", default="/tmp/stoker-gpu-bench/tar")
    ap.add_argument("--samples", type=int, default=16384)
    ap.add_argument("--sample-kib", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()

    import torch

    size = a.sample_kib << 10
    write_shards(a.data, a.samples, size, per_shard=max(1, (256 << 20) // size))
    # Read once so that every row finds the shards in the page cache.
    for name in os.listdir(a.data):
        with open(os.path.join(a.data, name), "rb") as f:
            while f.read(64 << 20):
                pass
    print(f"device: {torch.cuda.get_device_name(0)}; host: {os.cpu_count()} cores; torch {torch.__version__}")
    print(f"data: {a.samples} samples of {a.sample_kib} KiB in tar shards, batch {a.batch}, {a.epochs} epochs a row")
    rows = []
    for r in range(a.rounds):
        b = bound(a.batch * size, 2.0)
        s = stoker_loader(a.train_loop, a.data, a.batch, a.epochs, cpu=False)
        c = stoker_loader(a.train_loop, a.data, a.batch, a.epochs, cpu=True)
        t = torch_loader(a.data, a.batch, a.epochs, a.workers)
        rows.append((r, b, s, c, t))
        print(f"round {r + 1}: bound {b:.2f} GB/s (pinned H2D copies of one batch)")
        print(f"  stoker → cuda:0        {s[0]:9.0f} samples/s {s[1]:6.2f} GB/s  {s[1] / b:5.2f}x bound  {s[0] / t[0]:5.2f}x DataLoader")
        print(f"  stoker, host only (sums each byte){c[0]:9.0f} samples/s {c[1]:6.2f} GB/s")
        print(f"  DataLoader({a.workers} workers, pin_memory) → cuda:0 {t[0]:9.0f} samples/s {t[1]:6.2f} GB/s  {t[1] / b:5.2f}x bound")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
