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
  stoker-parquet    stoker.ray.read(parquet, decode=...) as the stoker row, of the same samples
                    in Parquet files (columns __key__, jpg as binary, cls as int64)
  ray-parquet       ray.data.read_parquet(parquet) then map_batches as ray-webdataset's

Data: integration/bench_decode_data.py's ImageNet-like JPEGs (shards/ and files/), as
bench_augment.py uses them; parquet/ is written from shards/ on the first run (8 files of 256
rows, row groups of 128: a Hugging Face dataset's export has row groups of this order). Run
with the venv that has stoker, Ray Data and torchvision:

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


def stoker_ds(root: Path, layout: str = "shards"):
    import stoker
    import stoker.ray

    spec = {"jpg": stoker.Image(224, crop="random_resized", flip=True), "cls": stoker.Int()}
    return stoker.ray.read(str(root / layout), decode=spec, seed=0)


def make_parquet(root: Path) -> Path:
    """root/parquet: the samples of root/shards as Parquet files, written once."""
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    out = root / "parquet"
    if (out / "done").exists():
        return out
    out.mkdir(exist_ok=True)
    rows: dict = {}
    for shard in sorted((root / "shards").glob("*.tar")):
        with tarfile.open(shard) as t:
            for m in t.getmembers():
                key, ext = m.name.split(".", 1)
                rows.setdefault(key, {})[ext] = t.extractfile(m).read()
    keys = sorted(rows)
    per = -(-len(keys) // 8)
    for i in range(0, len(keys), per):
        part = keys[i : i + per]
        table = pa.table({
            "__key__": part,
            "jpg": pa.array([rows[k]["jpg"] for k in part], pa.binary()),
            "cls": pa.array([int(rows[k]["cls"]) for k in part], pa.int64()),
        })
        pq.write_table(table, out / f"train-{i // per:03d}.parquet", row_group_size=128)
    (out / "done").touch()
    return out


def _crop_flip(img, t):
    import numpy as np

    return np.asarray(t(img), dtype=np.uint8)


def _transform():
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])


def _decode(batch):
    """A batch of JPEG bytes and labels decoded with PIL, cropped and flipped."""
    import io

    import numpy as np
    from PIL import Image

    t = _transform()
    out = []
    for data in batch["jpg"]:
        with Image.open(io.BytesIO(data)) as im:
            out.append(_crop_flip(im.convert("RGB"), t))
    return {"jpg": np.stack(out), "cls": np.array([int(c) for c in batch["cls"]])}


def webdataset_ds(root: Path):
    import ray.data

    files = sorted(str(p) for p in (root / "shards").glob("*.tar"))
    return ray.data.read_webdataset(files, decoder=None).map_batches(_decode, batch_size=64)


def parquet_ds(root: Path):
    import ray.data

    files = sorted(str(p) for p in (root / "parquet").glob("*.parquet"))
    return ray.data.read_parquet(files).map_batches(_decode, batch_size=64)


def images_ds(root: Path):
    import ray.data

    def crop(batch):
        import numpy as np
        from PIL import Image

        t = _transform()
        return {"image": np.stack([_crop_flip(Image.fromarray(a), t) for a in batch["image"]])}

    files = sorted(str(p) for p in (root / "files").glob("*.jpg"))
    return ray.data.read_images(files, mode="RGB").map_batches(crop, batch_size=64)


ROWS = {
    "stoker": stoker_ds,
    "ray-webdataset": webdataset_ds,
    "ray-images": images_ds,
    "stoker-parquet": lambda root: stoker_ds(root, "parquet"),
    "ray-parquet": parquet_ds,
}
#: Each Ray row against the Stoker row of the same data.
AGAINST = {"ray-webdataset": "stoker", "ray-images": "stoker", "ray-parquet": "stoker-parquet"}


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

    make_parquet(args.dir)
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
    for r, s in AGAINST.items():
        if r in results and s in results:
            ratios = " / ".join(f"{a / b:.2f}x" for a, b in zip(results[s], results[r]))
            print(f"{s} / {r}: {ratios} (round by round)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
