"""Stoker inside PyTorch data loading, three ways, on the same data:

1. ``stoker.open(uri)`` as a map-style ``Dataset`` in a stock ``torch.utils.data.DataLoader``
   with fork workers and a per-sample transform (the drop-in change: one line);
2. ``stoker.torch.IterableDataset`` in a ``DataLoader``: each worker reads its share through a
   Rust loader that prefetches (for code that must keep its DataLoader);
3. ``stoker.Loader``: batches assembled by Rust threads and handed over zero-copy as tensors,
   no worker processes at all (the fast path), with a resumable ``state_dict``.

    python examples/pytorch_dataloader.py [URI] [--samples 4096] [--size 16384] [--workers 2]

With no URI it writes WebDataset tar shards of random bytes to a temporary directory first.
Each way prints samples/s; on a GPU machine batches go to ``cuda`` with ``non_blocking=True``.
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
import tempfile
import time
from typing import Any, Dict

import torch
from torch.utils.data import DataLoader

import stoker
import stoker.torch


def write_demo(root: str, samples: int, size: int, per_shard: int = 1024) -> str:
    """WebDataset layout: ``NNNNNN.bin`` (payload) and ``NNNNNN.cls`` (label) per sample."""
    out = os.path.join(root, "shards")
    os.makedirs(out)
    rng = torch.Generator().manual_seed(0)
    for s in range(0, samples, per_shard):
        with tarfile.open(os.path.join(out, f"train-{s // per_shard:06d}.tar"), "w") as tar:
            for i in range(s, min(s + per_shard, samples)):
                payload = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=rng).numpy().tobytes()
                for name, data in ((f"{i:06d}.bin", payload), (f"{i:06d}.cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return out


def decode(sample: Dict[str, Any]) -> Dict[str, Any]:
    """Per-sample transform, run in the DataLoader's workers: bytes to a tensor and a label."""
    return {"x": torch.frombuffer(bytearray(sample["bin"]), dtype=torch.uint8), "y": int(sample["cls"])}


def timed(name: str, batches: Any, device: torch.device) -> None:
    started, n = time.perf_counter(), 0
    for batch in batches:
        x = batch["x"] if "x" in batch else batch["bin"]
        x = x.to(device, non_blocking=True)  # the step would run here
        n += x.shape[0]
    secs = time.perf_counter() - started
    print(f"{name:<48} {n:>7} samples  {n / secs:>10,.0f} samples/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("uri", nargs="?", help="a source URI (default: demo tar shards in a temp dir)")
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--size", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    with tempfile.TemporaryDirectory() as tmp:
        uri = args.uri or write_demo(tmp, args.samples, args.size)
        print(f"source: {uri}, device: {device}")

        # 1. Map-style Dataset: the one-line change in an existing DataLoader.
        ds = stoker.open(uri, transform=decode)
        loader = DataLoader(
            ds,
            batch_size=args.batch,
            shuffle=True,
            num_workers=args.workers,
            multiprocessing_context="fork" if args.workers else None,
            pin_memory=device.type == "cuda",
        )
        timed("DataLoader(stoker.open(uri), workers)", loader, device)

        # 2. IterableDataset: Rust prefetching inside each DataLoader worker.
        it = stoker.torch.IterableDataset(uri, shuffle=True)
        loader2 = DataLoader(it, batch_size=args.batch, num_workers=args.workers, collate_fn=collate_bytes)
        timed("DataLoader(stoker.torch.IterableDataset)", loader2, device)

        # 3. stoker.Loader: no worker processes; the payload declared fixed-width arrives as one
        # [B, L] uint8 tensor and the label as int64 [B], parsed on Rust threads.
        spec = {"bin": stoker.Bytes(shape=(args.size,)), "cls": stoker.Int()}
        fast = stoker.Loader(uri, batch_size=args.batch, shuffle=True, prefetch=8, decode=spec)
        timed("stoker.Loader", fast, device)

        # Resume mid-epoch: save after a few batches, continue in a fresh loader.
        fast.set_epoch(1)
        seen = []
        for i, batch in enumerate(fast):
            seen += batch["__key__"]
            if i == 3:
                state = fast.state_dict()
                break
        resumed = stoker.Loader(uri, batch_size=args.batch, shuffle=True, prefetch=8, decode=spec)
        resumed.load_state_dict(state)
        for batch in resumed:
            seen += batch["__key__"]
        assert len(seen) == len(set(seen)) == len(fast.dataset), "resume must cover the epoch exactly once"
        print(f"resume: epoch 1 covered exactly once across two loaders ({len(seen)} samples)")
        print("stats of the fast loader:", {k: v for k, v in fast.stats().items() if k in ("samples", "consumer_wait_fraction")})


def collate_bytes(samples: Any) -> Dict[str, Any]:
    """Collate webdataset-style dicts: payloads stacked as a uint8 tensor."""
    return {
        "bin": torch.stack([torch.frombuffer(bytearray(s["bin"]), dtype=torch.uint8) for s in samples]),
        "cls": [int(s["cls"]) for s in samples],
    }


if __name__ == "__main__":
    main()
