#!/usr/bin/env python3
"""The guides' augmentation chain, whole, side by side on the same JPEGs and cores:

    RandomResizedCrop(224) -> HorizontalFlip -> ColorJitter(0.2, 0.2, 0.2, 0.1)
        -> Normalize(ImageNet mean/std) -> ToTensor (float32 [3, 224, 224])

Rows (each in its own process, one epoch after one untimed warm-up epoch, rounds alternating):

  stoker        stoker.Loader over the WebDataset shards, decode={"jpg": stoker.Image(224,
                crop="random_resized", flip=True, color_jitter=(0.2, 0.2, 0.2, 0.1),
                layout="CHW", dtype="float32", mean=..., std=...)}: all of it in Rust
  torchvision   DataLoader (2 workers) over the files: PIL decode + torchvision transforms.v2
                (RandomResizedCrop, RandomHorizontalFlip, ColorJitter on the PIL image, then
                ToImage, ToDtype(float32, scale=True), Normalize)
  albumentations DataLoader (2 workers) over the files: cv2.imdecode + Albumentations
                (RandomResizedCrop, HorizontalFlip, ColorJitter(p=1), Normalize, ToTensorV2)

Data: integration/bench_decode_data.py's ImageNet-like JPEGs (made with .venv, which has
scikit-image; pass --dir to reuse them). Run with the venv that has stoker, torchvision and
albumentations (.venv-peers):

    .venv/bin/python -c "import sys; sys.path.insert(0, 'integration'); import bench_decode_data as d; \\
        d.build(__import__('pathlib').Path('/work/bench_aug'), 2048)"
    .venv-peers/bin/python integration/bench_augment.py --dir /work/bench_aug [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BATCH = 64


def files(root: Path):
    names = sorted((root / "files").glob("*.jpg"))
    labels = [int(x) for x in (root / "files" / "labels.txt").read_text().split()]
    return names, labels


def run_stoker(root: Path, workers: int) -> tuple:
    import stoker

    spec = {"jpg": stoker.Image(224, crop="random_resized", flip=True, color_jitter=(0.2, 0.2, 0.2, 0.1),
                                layout="CHW", dtype="float32", mean=MEAN, std=STD), "cls": stoker.Int()}
    loader = stoker.Loader(str(root / "shards"), batch_size=BATCH, shuffle=True, seed=0, decode=spec)

    def epoch():
        n = 0
        for b in loader:
            x = b["jpg"]
            assert x.shape[1:] == (3, 224, 224) and str(x.dtype) == "torch.float32"
            n += x.shape[0]
        return n

    return epoch


class _Files:
    def __init__(self, names, labels, kind):
        self.names, self.labels, self.kind, self.t = names, labels, kind, None

    def __len__(self):
        return len(self.names)

    def _make(self):
        if self.kind == "torchvision":
            import torch
            from torchvision.transforms import v2

            return v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                               v2.ColorJitter(0.2, 0.2, 0.2, 0.1), v2.ToImage(),
                               v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
        import albumentations as A
        from albumentations.pytorch import ToTensorV2

        return A.Compose([A.RandomResizedCrop(size=(224, 224)), A.HorizontalFlip(),
                          A.ColorJitter(0.2, 0.2, 0.2, 0.1, p=1.0), A.Normalize(mean=MEAN, std=STD), ToTensorV2()])

    def __getitem__(self, i):
        if self.t is None:
            self.t = self._make()
        if self.kind == "torchvision":
            from PIL import Image

            with Image.open(self.names[i]) as im:
                x = self.t(im.convert("RGB"))
        else:
            import cv2
            import numpy as np

            data = np.fromfile(self.names[i], dtype=np.uint8)
            img = cv2.cvtColor(cv2.imdecode(data, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
            x = self.t(image=img)["image"]
        return x, self.labels[i]


def run_dataloader(root: Path, workers: int, kind: str):
    from torch.utils.data import DataLoader

    names, labels = files(root)
    dl = DataLoader(_Files(names, labels, kind), batch_size=BATCH, shuffle=True, num_workers=workers,
                    persistent_workers=True)

    def epoch():
        n = 0
        for x, _y in dl:
            assert tuple(x.shape[1:]) == (3, 224, 224)
            n += x.shape[0]
        return n

    return epoch


def child(row: str, root: Path, workers: int) -> None:
    epoch = run_stoker(root, workers) if row == "stoker" else run_dataloader(root, workers, row)
    epoch()  # warm-up: worker start-up, page cache, the loader's buffers
    t = time.perf_counter()
    n = epoch()
    print(json.dumps({"row": row, "images": n, "seconds": time.perf_counter() - t}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--row")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.row:
        return child(a.row, a.dir, a.workers)
    rows = ["stoker", "torchvision", "albumentations"]
    got = {r: [] for r in rows}
    for rnd in range(a.rounds):
        for r in rows if rnd % 2 == 0 else rows[::-1]:
            out = subprocess.run([sys.executable, __file__, "--row", r, "--dir", str(a.dir), "--workers",
                                  str(a.workers)], capture_output=True, text=True, timeout=1800)
            if out.returncode != 0:
                print(f"{r}: FAILED\n{out.stderr[-2000:]}")
                continue
            res = json.loads(out.stdout.strip().splitlines()[-1])
            got[r].append(res["images"] / res["seconds"])
            print(f"round {rnd + 1} {r}: {got[r][-1]:,.0f} images/s", flush=True)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}")
    for r in rows:
        print(f"{r:15s} " + " / ".join(f"{v:,.0f}" for v in got[r]) + " images/s")
    for peer in rows[1:]:
        ratios = [s / p for s, p in zip(got["stoker"], got[peer])]
        print(f"stoker / {peer}: " + " / ".join(f"{x:.2f}x" for x in ratios) + " (round by round)")
    if a.json:
        a.json.write_text(json.dumps(got))


if __name__ == "__main__":
    main()
