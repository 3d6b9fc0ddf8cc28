#!/usr/bin/env python3
"""Training on Ray Train from Stoker, two ways:

    python examples/ray_train.py SHARDS --mode ray-data [--workers 2] [--epochs 2]
    python examples/ray_train.py SHARDS --mode loader   [--workers 2] [--epochs 2]

``ray-data``: the dataset is ``stoker.ray.read(SHARDS, decode=...)`` (decoding in Ray read tasks,
anywhere on the cluster); each Ray Train worker takes its shard of it with
``ray.train.get_dataset_shard("train").iter_torch_batches(...)``.

``loader``: no Ray Data; each Ray Train worker runs Stoker's own Loader with its rank and the
world size from Ray's context (``rank=ctx.get_world_rank(), world_size=ctx.get_world_size()``),
so each reads and decodes its own part of every epoch on its own node, resumable with
``loader.state_dict()`` like any Loader.

SHARDS holds WebDataset tar shards with an image (``jpg`` or ``png``) and a class (``cls``) per
sample. The model is a toy (a linear layer on 32x32 thumbnails); what matters is the input
side. Prints one JSON line per worker: its rank, the samples it saw per epoch and its last
loss. Needs ``pip install 'stoker[ray]' 'ray[train]' torch``.
"""

from __future__ import annotations

import argparse
import json
import os


def image_field(shards: str) -> str:
    import stoker

    fields = {name for name in stoker.open(shards)[0] if not name.startswith("__")}
    return "png" if "png" in fields else "jpg"


def train_loop(config: dict) -> None:
    import ray.train
    import torch

    import stoker

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    field, side = config["field"], config["side"]
    model = torch.nn.Linear(side * side * 3, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen, loss = [], None
    if config["mode"] == "loader":
        spec = {field: stoker.Image(side, crop="random_resized", flip=True), "cls": stoker.Int()}
        loader = stoker.Loader(config["shards"], batch_size=config["batch"], shuffle=True, seed=0, decode=spec,
                               rank=rank, world_size=world, output="torch")
    for epoch in range(config["epochs"]):
        if config["mode"] == "loader":
            loader.set_epoch(epoch)
            batches = ((b[field], b["cls"]) for b in loader)
        else:
            shard = ray.train.get_dataset_shard("train")
            batches = ((b[field], b["cls"]) for b in shard.iter_torch_batches(batch_size=config["batch"]))
        n = 0
        for x, y in batches:
            x = x.reshape(x.shape[0], -1).float() / 255.0
            loss = torch.nn.functional.cross_entropy(model(x), y.long() % 10)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += x.shape[0]
        seen.append(n)
    print(json.dumps({"rank": rank, "world": world, "seen": seen, "loss": float(loss) if loss is not None else None}))
    ray.train.report({"seen": seen[-1] if seen else 0})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shards")
    ap.add_argument("--mode", choices=["ray-data", "loader"], default="ray-data")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--side", type=int, default=32)
    ap.add_argument("--cpus", type=int, default=None, help="logical CPUs of a local cluster (Ray's count if not given)")
    args = ap.parse_args()
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    import stoker
    import stoker.ray

    ray.init(num_cpus=args.cpus, log_to_driver=True, include_dashboard=False)
    shards = os.path.abspath(args.shards)
    field = image_field(shards)
    config = {"mode": args.mode, "shards": shards, "epochs": args.epochs, "batch": args.batch, "side": args.side,
              "field": field}
    datasets = {}
    if args.mode == "ray-data":
        spec = {field: stoker.Image(args.side, crop="random_resized", flip=True), "cls": stoker.Int()}
        # The tensors only: iter_torch_batches turns every column into a tensor, and the keys
        # are text.
        datasets["train"] = stoker.ray.read(shards, decode=spec, seed=0).select_columns([field, "cls"])
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False, resources_per_worker={"CPU": 1}),
        datasets=datasets,
        run_config=RunConfig(storage_path=os.path.join(os.path.dirname(shards), "ray_results")),
    )
    result = trainer.fit()
    print(json.dumps({"done": True, "error": None if result.error is None else str(result.error)}))
    ray.shutdown()


if __name__ == "__main__":
    main()
