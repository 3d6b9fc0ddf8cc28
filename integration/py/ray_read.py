"""stoker.ray.read on a real two-node local Ray cluster, checked against Stoker's own reader.

    python ray_read.py OUTDIR

Writes three tar shards of 20 samples (a PNG photo-like image, a class, random bytes) into
OUTDIR, starts a Ray cluster of two one-CPU nodes (ray.cluster_utils.Cluster: two raylets on
this machine), reads the shards with stoker.ray.read undecoded and decoded, and prints one
line of JSON saying what it found: every index exactly once, the bytes stoker.open gives, the
tensors stoker.Loader gives for the same (seed, epoch, index), the nodes the cluster had and
the nodes the read tasks ran on. Needs ray[data], Pillow and numpy, and stoker importable.
"""

import io
import json
import os
import random
import re
import sys
import tarfile
import warnings

import numpy as np
from PIL import Image


def write_shards(out):
    rng = random.Random(5)
    os.makedirs(out, exist_ok=True)
    for shard in range(3):
        with tarfile.open(os.path.join(out, f"train-{shard:03d}.tar"), "w") as tar:
            for k in range(20):
                i = shard * 20 + k
                w, h = rng.randrange(40, 90), rng.randrange(40, 90)
                pixels = np.fromfunction(lambda y, x, c: (x * 3 + y * (c + 1) + i * 7) % 256, (h, w, 3))
                buf = io.BytesIO()
                Image.fromarray(pixels.astype(np.uint8)).save(buf, format="PNG")
                members = {"png": buf.getvalue(), "cls": str(i % 10).encode(), "bin": rng.randbytes(rng.randrange(0, 300))}
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def main():
    out = sys.argv[1]
    write_shards(out)
    import ray

    import stoker
    import stoker.ray
    from ray_cluster import two_nodes

    # The second node carries a label, for a read that names it (Ray's named parameters).
    with two_nodes(labels={"stoker-test": "reader"}) as second:
        nodes = len([n for n in ray.nodes() if n["Alive"]])

        ds = stoker.open(out)
        raw = stoker.ray.read(out, override_num_blocks=3).take_all()
        seen = sorted(r["__index__"] for r in raw)
        bytes_equal = all(
            r["__key__"] == ds[r["__index__"]]["__key__"]
            and all(bytes(r[f]) == ds[r["__index__"]][f] for f in ("png", "cls", "bin"))
            for r in raw
        )

        spec = {
            "png": stoker.Image(32, crop="random_resized", flip=True, color_jitter=(0.2, 0.2, 0.2, 0.1)),
            "cls": stoker.Int(),
        }
        decoded = stoker.ray.read(out, decode=spec, seed=7, epoch=2, override_num_blocks=4)
        rows = decoded.take_all()
        loader = stoker.Loader(out, batch_size=8, seed=7, decode=spec, output="numpy")
        loader.set_epoch(2)
        want = {}
        for batch in loader:
            for row, index in enumerate(batch["__index__"]):
                want[index] = (batch["png"][row], int(batch["cls"][row]))
        decoded_equal = len(rows) == len(want) and all(
            np.array_equal(r["png"], want[r["__index__"]][0]) and int(r["cls"]) == want[r["__index__"]][1] for r in rows
        )
        # With another seed the crops differ: the comparison above can fail.
        other = {r["__index__"]: r["png"] for r in stoker.ray.read(out, decode=spec, seed=8, epoch=2).take_all()}
        seed_matters = any(not np.array_equal(other[i], want[i][0]) for i in want)
        # The same images as files: each read task opens its part of the listing (15 files), and
        # its samples draw their crops by their index in the whole directory, as the Loader's do.
        files = os.path.join(os.path.dirname(os.path.abspath(out)), "images")
        os.makedirs(files, exist_ok=True)
        for i in range(len(ds)):
            with open(os.path.join(files, f"{ds[i]['__key__']}.png"), "wb") as f:
                f.write(ds[i]["png"])
        png_spec = {"png": spec["png"]}
        file_rows = stoker.ray.read(files, decode=png_spec, seed=7, epoch=2, override_num_blocks=4).take_all()
        file_loader = stoker.Loader(files, batch_size=8, seed=7, decode=png_spec, output="numpy")
        file_loader.set_epoch(2)
        file_want = {i: b["png"][row] for b in file_loader for row, i in enumerate(b["__index__"])}
        files_decoded_equal = len(file_rows) == len(file_want) == len(ds) and all(
            np.array_equal(r["png"], file_want[r["__index__"]]) for r in file_rows
        )

        # The nodes the reads ran on: a map right after a read runs in the read's own task
        # (Ray Data fuses the two), where it notes its node.
        def node(batch):
            return {"node": [ray.get_runtime_context().get_node_id()] * len(batch["__index__"])}

        read_nodes = {r["node"] for r in stoker.ray.read(out, override_num_blocks=6).map_batches(node).take_all()}
        # Ray's named read parameters (Ray Data 2.60 deprecates ray_remote_args for them) reach
        # the read tasks: with label_selector naming the second node's label, every task runs
        # there (the map inherits the selector, so it is fused into the read and notes the
        # read's node; without the selector the reads run on both nodes, as read_nodes shows).
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            labelled = stoker.ray.read(out, override_num_blocks=4, label_selector={"stoker-test": "reader"})
            labelled_nodes = {r["node"] for r in labelled.map_batches(node).take_all()}
        named_warnings = [str(w.message) for w in caught if "ray_remote_args" in str(w.message)]
        # A Ray whose readers take no named parameters: an error naming them and saying how (such
        # a Ray would hand them to the datasource, as unknown source options).
        real_read = ray.data.read_datasource

        def older_ray(datasource, *, override_num_blocks=None, concurrency=None, ray_remote_args=None):
            return real_read(datasource, override_num_blocks=override_num_blocks, concurrency=concurrency,
                             ray_remote_args=ray_remote_args)

        ray.data.read_datasource = older_ray
        try:
            stoker.ray.read(out, num_cpus=1, max_calls=2)
            older_error = None
        except stoker.InvalidInputError as e:
            older_error = str(e)
        finally:
            ray.data.read_datasource = real_read
        # Tasks the cluster runs at once, for the default task count: the fewest of each
        # resource a task asks for over the cluster's total, at most concurrency or the pool's size.
        slots = stoker.ray.task_slots
        big = {"CPU": 16.0, "GPU": 2.0, "memory": 64e9, "disk": 4.0}
        task_slots = [
            slots(big, {}, None), slots(big, {"num_cpus": 4}, None), slots({"CPU": 2.0}, {"num_cpus": 0.1}, None),
            slots(big, {"num_cpus": 0}, None), slots(big, {}, 3), slots({"CPU": 2.0}, {"num_cpus": 4}, None),
            slots(big, {"num_cpus": None}, None), slots(big, {"num_gpus": 1}, None),
            slots(big, {"memory": 16e9}, None), slots(big, {"resources": {"disk": 1}}, None),
            slots(big, {"resources": {"tpu": 1}}, None),
            slots(big, {}, None, ray.data.ActorPoolStrategy(size=5)), slots(big, {}, 7, ray.data.TaskPoolStrategy(size=5)),
            slots(big, {}, None, ray.data.ActorPoolStrategy(min_size=1)),
        ]
        # A directory of 12,000 files, listed by name only on the driver: each task looks up
        # and reads the files of its part of the listing.
        many = os.path.join(os.path.dirname(os.path.abspath(out)), "many")
        for i in range(12_000):
            d = os.path.join(many, f"{i // 1000:02d}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"file-with-a-longish-name-{i:06d}.bin"), "wb") as f:
                f.write(i.to_bytes(2, "little"))
        many_rows = stoker.ray.read(many, override_num_blocks=3).take_all()
        # File i (in path order) holds i: every file once, each with its index in the whole source.
        many_ok = sorted(int.from_bytes(bytes(r["bin"]), "little") for r in many_rows) == list(range(12_000)) and all(
            r["__index__"] == int.from_bytes(bytes(r["bin"]), "little") for r in many_rows
        )

        # The default task count in a read: the slots with num_cpus named or in ray_remote_args,
        # at most concurrency (12,000 files: up to 24 tasks, none of fewer than 512 samples).
        def read_tasks(**kw):
            done = stoker.ray.read(many, **kw).materialize()
            return int(re.search(r"(\d+) tasks executed", done.stats()).group(1))

        planned = [read_tasks(), read_tasks(num_cpus=0.5), read_tasks(ray_remote_args={"num_cpus": 0.5}),
                   read_tasks(num_cpus=0.25, concurrency=3)]
        bad_args = []
        for kw in ({"num_cpus": "2"}, {"concurrency": (1, 4)}, {"resources": {"disk": True}}):
            try:
                stoker.ray.read(many, **kw)
            except stoker.InvalidInputError as e:
                bad_args.append(str(e))
        # Each read task carries the part of the listing its run covers, not the whole of it,
        # decoding or not; a tar read's tasks carry the whole (its samples are not one file each).
        def listings(source, parts):
            out = []
            for task in source.get_read_tasks(parts):
                listing, part = task.read_fn.args[-2:]
                data = ray.get(listing) if isinstance(listing, ray.ObjectRef) else listing
                snapshot = json.loads(data)
                # A local directory of files is listed by name only; other listings are looked up.
                by_name = "names" in snapshot
                listed = snapshot["names"] if by_name else snapshot["objects"]
                out.append((part, len(listed), task.metadata.num_rows, by_name))
            return out

        many_parts = listings(stoker.ray.StokerDatasource(many), 3)
        decoded_parts = listings(stoker.ray.StokerDatasource(many, decode={"bin": stoker.Bytes()}), 3)
        tar_parts = listings(stoker.ray.StokerDatasource(out), 3)

        # The split: whole shards when there are enough, else even runs; always a partition.
        split = stoker.ray.split
        partitions = all(
            [a for a, _ in split(n, starts, k)] + [n] == sorted({0, n} | {b for _, b in split(n, starts, k)})
            and split(n, starts, k)[0][0] == 0
            for n in (1, 7, 60, 1000)
            for starts in ([], [0], list(range(0, n, 13)))
            for k in (1, 2, 3, 8, 2000)
        )
        whole_shards = split(60, [0, 20, 40], 3) == [(0, 20), (20, 40), (40, 60)] and split(60, [0, 20, 40], 2) in (
            [(0, 20), (20, 60)],
            [(0, 40), (40, 60)],
        )
        print(
            json.dumps(
                {
                    "split_partitions": partitions,
                    "split_whole_shards": whole_shards,
                    "split_even": split(60, [0, 20, 40], 6) == [(k * 10, k * 10 + 10) for k in range(6)],
                    "rows": len(raw),
                    "indices": seen == list(range(len(ds))),
                    "bytes_equal": bytes_equal,
                    "decoded_rows": len(rows),
                    "decoded_equal": decoded_equal,
                    "seed_matters": seed_matters,
                    "files_decoded_equal": files_decoded_equal,
                    "png_shape": list(rows[0]["png"].shape),
                    "nodes": nodes,
                    "read_nodes": len(read_nodes),
                    "labelled_on_second": labelled_nodes == {second.node_id},
                    "named_warnings": named_warnings,
                    "older_error": older_error,
                    "task_slots": task_slots,
                    "planned": planned,
                    "bad_args": bad_args,
                    "many_files": [len(many_rows), many_ok],
                    "many_parts": many_parts,
                    "decoded_parts": decoded_parts,
                    "tar_parts": [(part, rows) for part, _, rows, _ in tar_parts],
                }
            )
        )


if __name__ == "__main__":
    main()
