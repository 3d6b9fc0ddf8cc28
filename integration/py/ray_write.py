"""stoker.ray.write on a real two-node local Ray cluster, checked against the data it was given.

    python ray_write.py OUTDIR [S3_DEST]

Writes the three shards of ray_read.py (60 samples: a PNG, a class, random bytes) into
OUTDIR/src, starts a Ray cluster of two one-CPU nodes, and writes them back with
stoker.ray.write in several ways, printing one line of JSON saying what it found:

- tar: every sample once with its bytes, as read back by Stoker and by webdataset; several
  shards per task; a manifest with every member's checksum; write tasks on both nodes;
- killed: a write whose worker dies in the middle (os._exit in the task, after some of its
  shards landed, with Ray's retries off) fails; the rerun completes, keeps the shards that
  landed, and leaves the same files, byte for byte, as the uninterrupted write;
- stale: a rerun over fewer rows removes the shards it no longer writes;
- lmdb, tokens (Megatron pairs read back by Megatron-LM's reader), tensors (a decoded image
  column as .npy), S3 (when S3_DEST is given), and refusals:
  a foreign destination, a row without a key, a column of a type that has no member form.

Needs ray[data], webdataset, megatron-core, Pillow and numpy, and stoker importable.
"""

import filecmp
import io
import json
import os
import sys

import numpy as np

from ray_read import write_shards


def _npy_bytes(a):
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def files(d):
    """Every file under ``d`` (relative names), hidden ones included."""
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


def main():
    out = sys.argv[1]
    s3_dest = sys.argv[2] if len(sys.argv) > 2 else None
    src = os.path.join(out, "src")
    write_shards(src)
    import pyarrow
    import ray
    import webdataset as wds

    import stoker
    import stoker.ray
    from ray_cluster import two_nodes

    found = {}
    with two_nodes():
        want = {s["__key__"]: s for s in stoker.open(src)}

        def same(samples):
            got = {s["__key__"]: s for s in samples}
            return got.keys() == want.keys() and all(
                {f: bytes(v) for f, v in got[k].items() if f in ("png", "cls", "bin")}
                == {f: want[k][f] for f in ("png", "cls", "bin")}
                for k in want
            )

        # Three read tasks of 20 rows in blocks of 5, shards of 4 samples: 5 shards a task.
        def dataset(rows=None, concurrency=None, **ray_args):
            ds = stoker.ray.read(
                src, override_num_blocks=3, rows_per_block=5, concurrency=concurrency, ray_remote_args=ray_args
            )
            return ds if rows is None else ds.filter(lambda r: r["__index__"] < rows)

        # A bare read is written with Ray Data's per-operator reservations off (one operator:
        # nothing to split), on a copy; a pipeline with a map keeps them.
        from stoker.ray import _write_plan

        bare = dataset()
        plan = _write_plan(bare)
        found["bare_read_unreserved"] = (
            plan is not bare and not plan.context.op_resource_reservation_enabled
            and bare.context.op_resource_reservation_enabled
        )
        mapped = dataset().map_batches(lambda b: b)
        found["mapped_kept"] = _write_plan(mapped) is mapped and mapped.context.op_resource_reservation_enabled
        # A write with its own task-pool size, or remote args Ray will not fuse with the
        # read's, is a second operator: reservations kept.
        found["unfused_kept"] = [
            _write_plan(bare, concurrency=2) is bare,
            _write_plan(bare, ray_remote_args={"num_cpus": 0.5}) is bare,
            (lambda d: _write_plan(d) is d)(dataset(concurrency=2)),
        ]

        tar = os.path.join(out, "tar")

        def node(batch):
            return {**batch, "node": np.array([ray.get_runtime_context().get_node_id()] * len(batch["__key__"]))}

        report = stoker.ray.write(dataset().map_batches(node), tar, samples_per_shard=4)
        found["tar_report"] = {k: report[k] for k in ("samples", "shards", "kept_shards", "checksums")}
        back = list(stoker.open(tar))
        found["tar_stoker_equal"] = same(back)
        found["tar_write_nodes"] = len({s["node"] for s in back})
        found["tar_manifest"] = os.path.exists(report["manifest"])
        shards = sorted(f for f in os.listdir(tar) if f.endswith(".tar"))
        found["tar_names"] = shards[:2] + shards[-1:]
        found["tar_webdataset_equal"] = same(wds.WebDataset([os.path.join(tar, s) for s in shards], shardshuffle=False))
        found["tar_verified"] = stoker.index(tar, checksums=True)["checksums"]

        # The same write without the node column, as the reference for the killed one.
        plain = os.path.join(out, "plain")
        stoker.ray.write(dataset(), plain, samples_per_shard=4)

        # A write whose second task dies: one task at a time, so the first task's shards have
        # landed.
        killed = os.path.join(out, "killed")
        marker = os.path.join(out, "kill-once")
        open(marker, "w").close()

        def killer(batch):
            if 20 in batch["__index__"] and os.path.exists(marker):
                os.remove(marker)
                os._exit(1)
            return batch

        # Ray's retries off, and one task at a time, in every step: steps with other arguments
        # would not be fused into one task (and a write task not fused with its read gets its
        # rows in the order upstream tasks finish).
        no_retry = {"max_retries": 0}
        try:
            stoker.ray.write(
                dataset(concurrency=1, **no_retry).map_batches(killer, batch_size=None, concurrency=1, **no_retry),
                killed,
                samples_per_shard=4,
                concurrency=1,
                ray_remote_args=no_retry,
            )
            found["killed_failed"] = False
        except Exception:
            found["killed_failed"] = True
        found["killed_left"] = len([f for f in os.listdir(killed) if f.endswith(".tar")])
        rerun = stoker.ray.write(dataset(), killed, samples_per_shard=4)
        found["killed_rerun_kept"] = rerun["kept_shards"]
        names = files(plain)
        found["killed_same_files"] = names == files(killed)
        found["killed_same_bytes"] = all(
            filecmp.cmp(os.path.join(plain, n), os.path.join(killed, n), shallow=False)
            for n in names
            if n.endswith(".tar")
        )

        # Fewer rows on the same destination: the shards no longer written go.
        fewer = stoker.ray.write(dataset(rows=30), plain, samples_per_shard=4)
        found["stale_samples"] = [fewer["samples"], len(stoker.open(plain))]

        # LMDB: one value per key.
        lmdb_dir = os.path.join(out, "lmdb")
        stoker.ray.write(dataset(), lmdb_dir, layout="lmdb", field="png")
        env = stoker.open(lmdb_dir, layout="lmdb")
        found["lmdb_equal"] = len(env) == len(want) and all(want[s["__key__"]]["png"] == s["data"] for s in env)

        # A decoded image column is written as .npy.
        tensors = os.path.join(out, "tensors")
        spec = {"png": stoker.Image(16), "cls": stoker.Int()}
        rows = {r["__key__"]: r for r in stoker.ray.read(src, decode=spec).take_all()}
        stoker.ray.write(stoker.ray.read(src, decode=spec), tensors)
        npy = {s["__key__"]: s for s in stoker.open(tensors)}
        found["tensor_fields"] = sorted(next(iter(npy.values())).keys())
        found["tensor_equal"] = npy.keys() == rows.keys() and all(
            np.array_equal(np.load(io.BytesIO(npy[k]["png.npy"])), rows[k]["png"])
            and int(npy[k]["cls"]) == rows[k]["cls"]
            for k in rows
        )

        # Token ids as Megatron indexed datasets, read back by Megatron-LM's reader and Stoker.
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        tokens_dir = os.path.join(out, "tokens")
        docs = [[(i * 7 + k) % 65536 for k in range(i % 9)] for i in range(50)]
        docs[3] = [65535, 0, 1]
        items = [{"__key__": f"d{i:03d}", "ids": d} for i, d in enumerate(docs)]
        rep = stoker.ray.write(
            ray.data.from_items(items, override_num_blocks=2), tokens_dir, layout="tokens", samples_per_shard=10
        )
        prefixes = sorted(f[: -len(".idx")] for f in os.listdir(tokens_dir) if f.endswith(".idx"))
        read = []
        for p in prefixes:
            # Megatron's arrays are views of its memory map: read them while it is open.
            megatron = IndexedDataset(os.path.join(tokens_dir, p))
            read += [[int(t) for t in megatron[i]] for i in range(len(megatron))]
        found["tokens_files"] = [rep["shards"], len(prefixes)]
        found["tokens_megatron_equal"] = read == docs
        mine = [np.frombuffer(s["tokens"], "<u2").tolist() for s in stoker.open(tokens_dir, layout="tokens")]
        found["tokens_stoker_equal"] = mine == docs

        # .npy bytes (as Stoker reads MDS ndarray columns or Parquet lists) are token ids too.
        npy_items = [{"__key__": f"n{i:03d}", "npy": _npy_bytes(np.array(d, dtype=np.int64))} for i, d in enumerate(docs)]
        npy_dir = os.path.join(out, "tokens-npy")
        stoker.ray.write(ray.data.from_items(npy_items, override_num_blocks=2), npy_dir, layout="tokens", field="npy")
        again = [np.frombuffer(s["tokens"], "<u2").tolist() for s in stoker.open(npy_dir, layout="tokens")]
        found["tokens_from_npy_equal"] = again == docs

        # A list column keeps its element type in its .npy.
        lists = ray.data.from_arrow(
            pyarrow.table({"__key__": ["a", "b"], "emb": pyarrow.array([[0.5, 1.5], [2.5]], pyarrow.list_(pyarrow.float32()))})
        )
        lists_dir = os.path.join(out, "lists")
        stoker.ray.write(lists, lists_dir)
        arrays = [np.load(io.BytesIO(s["emb.npy"])) for s in stoker.open(lists_dir)]
        found["list_dtypes"] = [str(a.dtype) for a in arrays]

        if s3_dest:
            s3 = stoker.ray.write(dataset(), s3_dest, samples_per_shard=8)
            found["s3_equal"] = same(stoker.open(s3_dest)) and s3["shards"] == 9

        def refused(f):
            try:
                f()
            except Exception as e:  # what the user sees, whatever wraps it: Ray's traceback's last line
                return ([line for line in str(e).splitlines() if "Error: " in line] or [str(e)])[-1]
            return None

        foreign = os.path.join(out, "foreign")
        os.makedirs(foreign)
        open(os.path.join(foreign, "notes.txt"), "w").close()
        found["refused_foreign"] = refused(lambda: stoker.ray.write(dataset(), foreign))
        keyless = ray.data.from_items([{"jpg": b"x"}])
        found["refused_keyless"] = refused(lambda: stoker.ray.write(keyless, os.path.join(out, "keyless")))
        nested = ray.data.from_items([{"__key__": "a", "meta": {"x": 1}}])
        found["refused_type"] = refused(lambda: stoker.ray.write(nested, os.path.join(out, "nested")))
        dotted = ray.data.from_items([{"__key__": "a.b", "jpg": b"x"}])
        found["refused_key"] = refused(lambda: stoker.ray.write(dotted, os.path.join(out, "dotted")))
        lmdb_foreign = os.path.join(out, "lmdb-foreign")
        os.makedirs(lmdb_foreign)
        open(os.path.join(lmdb_foreign, "data.mdb"), "w").close()
        found["refused_lmdb_foreign"] = refused(
            lambda: stoker.ray.write(dataset(), lmdb_foreign, layout="lmdb", field="png")
        )
        clash = ray.data.from_arrow(pyarrow.table({
            "__key__": ["a"], "x": pyarrow.array([[1]], pyarrow.list_(pyarrow.int32())), "x.npy": [b"raw"],
        }))
        found["refused_clash"] = refused(lambda: stoker.ray.write(clash, os.path.join(out, "clash")))
        big = ray.data.from_items([{"__key__": "a", "ids": [1, 70000]}])
        found["refused_token_range"] = refused(
            lambda: stoker.ray.write(big, os.path.join(out, "big"), layout="tokens")
        )
        print(json.dumps(found))


if __name__ == "__main__":
    main()
