#!/usr/bin/env python3
"""Ray Data reading and decoding the same JPEG shards on the same local cluster and cores:

    read + JPEG decode + RandomResizedCrop(224) + horizontal flip, uint8 [224, 224, 3]

Rows (each epoch consumed with iter_batches(batch_size=256, batch_format="numpy") on the driver):

  stoker            stoker.ray.read(shards, decode={"jpg": stoker.Image(224, crop="random_resized",
                    flip=True), "cls": stoker.Int()}): Rust decode inside the read tasks
  ray-webdataset    ray.data.read_webdataset(shards, decoder=None) then map_batches with PIL
                    decode + torchvision RandomResizedCrop(224) + RandomHorizontalFlip
  ray-images        ray.data.read_images(files, mode="RGB") (Ray's PIL decode of whole images)
                    then map_batches with the same crop and flip on the decoded arrays

Data: integration/bench_decode_data.py's ImageNet-like JPEGs (shards/ and files/), as
bench_augment.py uses them. Run with the venv that has stoker, Ray Data and torchvision:

    .venv-peers/bin/python integration/bench_ray.py --dir /work/bench_aug [--rounds 3] [--cpus 2]

Each round runs every row once (order alternating), one untimed warm-up epoch first per row
(Ray starts its workers and imports; Stoker opens its shard indexes).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def stoker_ds(root: Path):
    import stoker
    import stoker.ray

    spec = {"jpg": stoker.Image(224, crop="random_resized", flip=True), "cls": stoker.Int()}
    return stoker.ray.read(str(root / "shards"), decode=spec, seed=0)


def _crop_flip(img, t):
    import numpy as np

    return np.asarray(t(img), dtype=np.uint8)


def _transform():
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])


def webdataset_ds(root: Path):
    import ray.data

    def decode(batch):
        import io

        import numpy as np
        from PIL import Image

        t = _transform()
        out = []
        for data in batch["jpg"]:
            with Image.open(io.BytesIO(data)) as im:
                out.append(_crop_flip(im.convert("RGB"), t))
        return {"jpg": np.stack(out), "cls": np.array([int(c) for c in batch["cls"]])}

    files = sorted(str(p) for p in (root / "shards").glob("*.tar"))
    return ray.data.read_webdataset(files, decoder=None).map_batches(decode, batch_size=64)


def images_ds(root: Path):
    import ray.data

    def crop(batch):
        import numpy as np
        from PIL import Image

        t = _transform()
        return {"image": np.stack([_crop_flip(Image.fromarray(a), t) for a in batch["image"]])}

    files = sorted(str(p) for p in (root / "files").glob("*.jpg"))
    return ray.data.read_images(files, mode="RGB").map_batches(crop, batch_size=64)


ROWS = {"stoker": stoker_ds, "ray-webdataset": webdataset_ds, "ray-images": images_ds}


def epoch(ds, column: str) -> int:
    n = 0
    for b in ds.iter_batches(batch_size=256, batch_format="numpy"):
        x = b[column]
        assert x.shape[1:] == (224, 224, 3), x.shape
        n += x.shape[0]
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=os.cpu_count())
    ap.add_argument("--rows", default=",".join(ROWS))
    args = ap.parse_args()
    import ray

    ray.init(num_cpus=args.cpus, log_to_driver=False, include_dashboard=False)
    rows = args.rows.split(",")
    results: dict = {r: [] for r in rows}
    for r in rows:  # warm-up
        epoch(ROWS[r](args.dir), "image" if r == "ray-images" else "jpg")
    for k in range(args.rounds):
        for r in rows if k % 2 == 0 else rows[::-1]:
            t = time.perf_counter()
            n = epoch(ROWS[r](args.dir), "image" if r == "ray-images" else "jpg")
            rate = n / (time.perf_counter() - t)
            results[r].append(rate)
            print(f"round {k + 1} {r}: {rate:,.0f} images/s", flush=True)
    ray.shutdown()
    print(f"machine: {args.cpus} Ray CPUs, load average {os.getloadavg()}")
    for r in rows:
        print(f"{r:16s} " + " / ".join(f"{x:,.0f}" for x in results[r]) + " images/s")
    if "stoker" in results:
        for r in rows:
            if r != "stoker":
                ratios = " / ".join(f"{a / b:.2f}x" for a, b in zip(results["stoker"], results[r]))
                print(f"stoker / {r}: {ratios} (round by round)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
