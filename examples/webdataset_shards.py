"""Pack many small files into WebDataset tar shards on S3, then train from the bucket.

The standard cure for a starving GPU is to stop opening one file per sample: pack the files
into large shards once, offline, and stream the shards. This example does both halves:

1. writes a directory of small files the way datasets often arrive (``000123.bin`` payload plus
   ``000123.cls`` label per sample);
2. ``stoker pack DIR s3://bucket/shards --group --prefix train`` writes tar shards straight to
   S3 (each shard one PUT, temp names never visible), with sidecar indexes and a manifest;
3. trains from the bucket with ``stoker.Loader`` (ranged reads of just the needed bytes, a
   bounded cache, retries), and checks that every sample arrived once with its bytes;
4. reads a shard with the ``webdataset`` library too, to show the format is the standard one.

    python examples/webdataset_shards.py [--samples 2000] [--size 8192] [--s3 s3://bucket/prefix?endpoint=...]

With no ``--s3`` it starts Stoker's embedded S3 server (``target/*/s3_server``, or set
``STOKER_S3_SERVER``) on loopback. The ``stoker`` CLI is found as ``STOKER_BIN``, on ``PATH``
or in ``target/{release,debug}``: ``cargo build -p stoker-cli -p stoker-testkit`` makes both.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Tuple

import stoker

REPO = Path(__file__).resolve().parents[1]


def find_binary(env: str, name: str) -> str:
    for candidate in (os.environ.get(env), shutil.which(name), *(REPO / "target" / p / name for p in ("release", "debug"))):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    sys.exit(f"error: cannot find `{name}`; set {env} or run `cargo build -p stoker-cli -p stoker-testkit`")


def payload(i: int, size: int) -> bytes:
    return hashlib.shake_256(i.to_bytes(8, "little")).digest(size)


def write_files(root: Path, samples: int, size: int) -> None:
    root.mkdir(parents=True)
    for i in range(samples):
        (root / f"{i:06d}.bin").write_bytes(payload(i, size))
        (root / f"{i:06d}.cls").write_text(str(i % 10))


def embedded_s3(data: Path) -> Tuple[subprocess.Popen, str]:
    """Stoker's S3 test server over ``data`` (bucket ``bucket``), credentials ak/sk."""
    data.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [find_binary("STOKER_S3_SERVER", "s3_server"), "--root", str(data), "--bucket", "bucket",
         "--access-key", "ak", "--secret-key", "sk", "--addr", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("listening on "):
        proc.kill()
        sys.exit(f"error: the embedded S3 server did not start: {line!r}")
    endpoint = "http://" + line.split()[-1]
    return proc, f"s3://bucket/shards?endpoint={endpoint}&access_key_id=ak&secret_access_key=sk"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--shard-size", default="4MiB")
    ap.add_argument("--s3", help="an s3:// prefix to pack into (default: an embedded S3 server)")
    args = ap.parse_args()
    stoker_bin = find_binary("STOKER_BIN", "stoker")

    with tempfile.TemporaryDirectory() as tmp:
        files = Path(tmp) / "raw"
        write_files(files, args.samples, args.size)
        server: Optional[subprocess.Popen] = None
        if args.s3:
            dest = args.s3
        else:
            server, dest = embedded_s3(Path(tmp) / "s3")
        try:
            started = time.perf_counter()
            subprocess.run(
                [stoker_bin, "pack", str(files), dest, "--group", "--prefix", "train", "--shard-size", args.shard_size, "--quiet"],
                check=True,
            )
            print(f"packed {args.samples} samples ({2 * args.samples} files) into shards in {time.perf_counter() - started:.1f} s")

            # Train from the bucket: shuffled, prefetched, two epochs.
            # Payloads are declared fixed-width, so each batch's `bin` is one [64, size] tensor.
            spec = {"bin": stoker.Bytes(shape=(args.size,)), "cls": stoker.Int()}
            loader = stoker.Loader(dest, batch_size=64, shuffle=True, prefetch=8, decode=spec)
            for epoch in range(2):
                seen = 0
                started = time.perf_counter()
                for batch in loader:
                    for row, key in enumerate(batch["__key__"]):
                        i = int(key)
                        assert bytes(batch["bin"][row].numpy()) == payload(i, args.size), f"sample {key}: wrong bytes"
                        assert batch["cls"][row].item() == i % 10, f"sample {key}: wrong label"
                    seen += len(batch["__key__"])
                secs = time.perf_counter() - started
                assert seen == args.samples, f"epoch {epoch}: {seen} samples, expected {args.samples}"
                print(f"epoch {epoch}: {seen} samples from S3 in {secs:.2f} s ({seen / secs:,.0f} samples/s), bytes checked")
            st = loader.stats()
            hit = st["cache_hit_rate"]
            print(f"store: {st['store_requests']} requests, {st['retries']} retries, "
                  f"cache hit rate {'n/a' if hit is None else f'{hit:.2f}'}")
            if server is not None:
                check_with_webdataset(Path(tmp) / "s3" / "bucket" / "shards", args.size)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=10)


def check_with_webdataset(shards: Path, size: int) -> None:
    """The packed shards are plain WebDataset: the reference library reads them unchanged."""
    import webdataset as wds

    first = sorted(shards.glob("train-*.tar"))[0]
    n = 0
    for sample in wds.WebDataset(str(first), shardshuffle=False):
        assert sample["bin"] == payload(int(sample["__key__"]), size)
        n += 1
    print(f"webdataset {wds.__version__} read {first.name}: {n} samples, bytes match")


if __name__ == "__main__":
    main()
