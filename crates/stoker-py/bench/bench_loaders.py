"""Same data, same run: PyTorch DataLoader with plain Python Datasets (one file per sample;
py-lmdb) at num_workers=2, vs stoker.open inside the same DataLoader, vs stoker.Loader, next
to a raw sequential read of the same bytes.

    python crates/stoker-py/bench/bench_loaders.py [--samples 4096] [--size 65536] [--workers 2]

Each figure is the best of 3 passes over a warm page cache; samples/s and ratios are printed.
"""

import argparse
import io
import os
import tarfile
import tempfile
import time

import lmdb
import torch
from torch.utils.data import DataLoader, Dataset

import stoker


def keep(batch):
    return batch


class FilesDataset(Dataset):
    """The common baseline: one open() and read() per sample."""

    def __init__(self, root):
        self.paths = sorted(os.path.join(root, f) for f in os.listdir(root))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return f.read()


class LmdbDataset(Dataset):
    """The other common baseline: py-lmdb opened lazily in each worker."""

    def __init__(self, path, n):
        self.path, self.n, self.env = path, n, None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.env is None:
            self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False)
        with self.env.begin() as txn:
            return txn.get(b"%09d" % i)


def write(root, n, size):
    files, shards = os.path.join(root, "files"), os.path.join(root, "tar")
    os.makedirs(files)
    os.makedirs(shards)
    env = lmdb.open(os.path.join(root, "lmdb"), map_size=n * (size + 4096) * 2)
    per_shard = max(1, (256 << 20) // (size + 1024))
    tf = None
    with env.begin(write=True) as txn:
        for i in range(n):
            data = os.urandom(size)
            with open(os.path.join(files, f"{i:09d}.bin"), "wb") as f:
                f.write(data)
            txn.put(b"%09d" % i, data)
            if i % per_shard == 0:
                if tf:
                    tf.close()
                tf = tarfile.open(os.path.join(shards, f"shard-{i // per_shard:06d}.tar"), "w")
            info = tarfile.TarInfo(f"{i:09d}.bin")
            info.size = size
            tf.addfile(info, io.BytesIO(data))
    tf.close()
    env.close()


def best(fn, passes=3):
    times = []
    for _ in range(passes):
        t = time.perf_counter()
        count = fn()
        times.append(time.perf_counter() - t)
    return count / min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--size", type=int, default=65536)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="stoker-bench-")
    write(root, a.samples, a.size)
    files = os.path.join(root, "files")
    paths = sorted(os.path.join(files, f) for f in os.listdir(files))

    def raw():
        for p in paths:
            with open(p, "rb") as f:
                f.read()
        return len(paths)

    def dataloader(ds):
        def run():
            dl = DataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=keep, persistent_workers=False)
            return sum(len(b) for b in dl)

        return run

    def loader(uri):
        ld = stoker.Loader(uri, batch_size=a.batch, prefetch=8)

        def run():
            return sum(len(b["__key__"]) for b in ld)

        return run

    rows = [
        ("raw read of the files", raw),
        (f"DataLoader + files Dataset, {a.workers} workers", dataloader(FilesDataset(files))),
        (f"DataLoader + py-lmdb Dataset, {a.workers} workers", dataloader(LmdbDataset(os.path.join(root, "lmdb"), a.samples))),
        (f"DataLoader + stoker.open(tar), {a.workers} workers", dataloader(stoker.open(os.path.join(root, "tar")))),
        ("stoker.Loader(tar)", loader(os.path.join(root, "tar"))),
        ("stoker.Loader(lmdb)", loader(os.path.join(root, "lmdb"))),
    ]
    results = {name: best(fn) for name, fn in rows}
    base = results[f"DataLoader + py-lmdb Dataset, {a.workers} workers"]
    raw_rate = results["raw read of the files"]
    print(f"{a.samples} samples x {a.size} B, {os.cpu_count()} cores, torch {torch.__version__}, best of 3 passes")
    print(f"{'':52} {'samples/s':>10} {'MiB/s':>8} {'x py-lmdb DL':>13} {'x raw':>7}")
    for name, rate in results.items():
        mib = rate * a.size / (1 << 20)
        print(f"{name:52} {rate:>10.0f} {mib:>8.0f} {rate / base:>12.2f}x {rate / raw_rate:>6.2f}x")


if __name__ == "__main__":
    main()
