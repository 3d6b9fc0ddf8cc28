"""stoker.ray on a real two-node local Ray cluster (integration/py/ray_read.py), run with the
venv that has Ray Data (.venv-peers, as the format writers: Ray pins what this venv cannot
take) and this build of stoker on its path: every sample exactly once with stoker.open's bytes,
for each layout (tar, files, Parquet, MDS, LitData, TFRecord, HDF5, JSONL, LMDB, a mix:
integration/py/ray_layouts.py), decoded tensors equal to stoker.Loader's for the same (seed, epoch, index), read tasks on both
nodes; stoker.ray.write (integration/py/ray_write.py) writing every row once, on both nodes,
resuming after a killed worker with the same bytes, to a directory, LMDB and S3. And without Ray, a
clear error naming the extra."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stoker
from test_formats import ROOT
from writers import writers_python


def peers_env(tmp_path, extra=()):
    """The environment of a .venv-peers process that imports this build of stoker (and only
    it: .venv-peers keeps its own numpy and pyarrow), and the directories ``extra``."""
    path = tmp_path / "path"
    path.mkdir(exist_ok=True)
    if not (path / "stoker").exists():
        (path / "stoker").symlink_to(Path(stoker.__file__).parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), *map(str, extra)]), "RAY_USAGE_STATS_ENABLED": "0"}


def test_ray_read_on_two_nodes_gives_stokers_bytes_and_tensors(tmp_path):
    env = peers_env(tmp_path)
    script = ROOT / "integration/py/ray_read.py"
    out = subprocess.run(
        [writers_python(), str(script), str(tmp_path / "shards")], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["nodes"] == 2, got
    assert got["split_partitions"] and got["split_whole_shards"] and got["split_even"], got
    assert got["rows"] == 60 and got["indices"] and got["bytes_equal"], got
    assert got["decoded_rows"] == 60 and got["decoded_equal"] and got["seed_matters"], got
    assert got["png_shape"] == [32, 32, 3], got
    assert got["read_nodes"] == 2, f"the read tasks ran on {got['read_nodes']} of the 2 nodes"
    # Ray's named read parameters reach the tasks, without Ray's ray_remote_args warning; a Ray
    # that takes none is an error naming them.
    assert got["labelled_on_second"], "label_selector= did not keep the read tasks on the labelled node"
    assert got["named_warnings"] == [], got["named_warnings"]
    assert "num_cpus=, max_calls=" in got["older_error"] and "ray_remote_args=" in got["older_error"], got
    # Tasks the cluster runs at once: the cluster's CPUs (GPUs, memory, custom resources) over
    # each task's share (num_cpus=0: one a CPU), at most concurrency (or the pool's size), at
    # least one.
    assert got["task_slots"] == [16, 4, 20, 16, 3, 1, 16, 2, 4, 4, 1, 5, 7, 16], got["task_slots"]
    # And a read's default task count follows them on the two one-CPU nodes.
    assert got["planned"] == [2, 4, 4, 3], got["planned"]
    assert len(got["bad_args"]) == 3, got["bad_args"]
    assert "num_cpus is an amount" in got["bad_args"][0] and "'2'" in got["bad_args"][0], got["bad_args"]
    assert "concurrency" in got["bad_args"][1] and "(1, 4)" in got["bad_args"][1], got["bad_args"]
    assert "resources['disk']" in got["bad_args"][2], got["bad_args"]
    # 12,000 files, every one read once with its index in the whole directory.
    assert got["many_files"] == [12_000, True], got
    # Three read tasks, each with the part of the listing it reads: 4,000 files, not 12,000,
    # by name (the driver looks none up, each task its own).
    assert got["many_parts"] == [[True, 4000, 4000, True]] * 3, got
    assert got["decoded_parts"] == [[True, 4000, 4000, True]] * 3, got
    assert got["tar_parts"] == [[False, 20]] * 3, got
    # Decoded from parts of a listing of files: the Loader's crops, drawn by whole-source index.
    assert got["files_decoded_equal"], got


def test_ray_read_gives_each_layout_as_stoker_opens_it(tmp_path, data):
    """Every layout Stoker opens, read by stoker.ray.read in three tasks on two nodes: each
    sample once, with stoker.open's key and bytes (integration/py/ray_layouts.py). Tar, files
    and LMDB are the session's data (conftest.py); the rest are written by their own writers."""
    from test_formats import write

    for script, kind in (("write_parquet.py", "hf"), ("write_records.py", "mds"), ("write_records.py", "litdata"),
                         ("write_tfrecord.py", "example"), ("write_hdf5.py", "mixed"), ("write_text.py", "jsonl")):
        write(script, kind, tmp_path / kind)
    tars = data / "bucket" / "tar"
    mix = tmp_path / "two.mix.json"
    mix.write_text(json.dumps({"sources": [{"uri": str(tars / "shard-0.tar"), "weight": 1},
                                           {"uri": str(tars / "shard-{1..2}.tar"), "weight": 2}]}))
    uris = {
        "tar": tars, "files": data / "bucket" / "files", "parquet": tmp_path / "hf", "mds": tmp_path / "mds",
        "litdata": tmp_path / "litdata", "tfrecord": tmp_path / "example", "hdf5": tmp_path / "mixed",
        "jsonl": tmp_path / "jsonl" / "corpus-b.jsonl.gz", "lmdb": data / "lmdb", "mix": mix,
    }
    out = subprocess.run(
        [writers_python(), str(ROOT / "integration/py/ray_layouts.py"), *(f"{k}={v}" for k, v in uris.items())],
        capture_output=True, text=True, env=peers_env(tmp_path), timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(got) == sorted(uris), got
    for name, result in got.items():
        assert isinstance(result, list), f"{name}: {result}"
        samples, tasks, once, equal = result
        assert samples > 0 and tasks >= 1, (name, result)
        assert once, f"{name}: stoker.ray.read did not give each of its {samples} samples once"
        assert equal, f"{name}: stoker.ray.read's keys or bytes differ from stoker.open's"
    # Each was cut into the three tasks asked for (within or between its shards).
    assert {k: r[1] for k, r in got.items()} == {k: 3 for k in uris}, got


def test_ray_write_packs_every_row_resumes_after_a_killed_worker_and_refuses_what_cannot_be_written(tmp_path, s3):
    env = peers_env(tmp_path, [ROOT / "integration/py"])
    out = subprocess.run(
        [writers_python(), str(ROOT / "integration/py/ray_write.py"), str(tmp_path / "out"), s3("raywrite/")],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # 3 write tasks of 20 rows, 4 samples a shard: 5 shards each, named by task and number.
    assert got["tar_report"] == {"samples": 60, "shards": 15, "kept_shards": 0, "checksums": True}, got
    assert got["tar_names"] == ["shard-000000-0000.tar", "shard-000000-0001.tar", "shard-000002-0004.tar"], got
    assert got["tar_stoker_equal"] and got["tar_webdataset_equal"] and got["tar_manifest"] and got["tar_verified"], got
    assert got["tar_write_nodes"] == 2, f"the write tasks ran on {got['tar_write_nodes']} of the 2 nodes"
    assert got["bare_read_unreserved"] and got["mapped_kept"] and got["unfused_kept"] == [True, True, True], got
    # The killed write failed with the first task's 5 shards landed; the rerun kept them and
    # left the uninterrupted write's files, byte for byte.
    assert got["killed_failed"] and got["killed_left"] == 5 and got["killed_rerun_kept"] == 5, got
    assert got["killed_same_files"] and got["killed_same_bytes"], got
    assert got["stale_samples"] == [30, 30], got
    assert got["lmdb_equal"] and got["s3_equal"], got
    # 50 documents in 2 write tasks, 10 a file: 3 Megatron pairs each; Megatron-LM reads them.
    assert got["tokens_files"] == [6, 6] and got["tokens_megatron_equal"] and got["tokens_stoker_equal"], got
    assert "holds id 70000, outside uint16" in got["refused_token_range"], got
    assert got["tokens_from_npy_equal"] and got["list_dtypes"] == ["float32", "float32"], got
    assert "not empty (it holds `data.mdb`)" in got["refused_lmdb_foreign"], got
    assert "would both be written as member 'x.npy'" in got["refused_clash"], got
    assert got["tensor_fields"] == ["__key__", "bin", "cls", "png.npy"] and got["tensor_equal"], got
    assert "not empty (it holds `notes.txt`)" in got["refused_foreign"], got
    assert "InvalidInputError" in got["refused_keyless"] and "needs a __key__ column" in got["refused_keyless"], got
    assert "column 'meta' has type struct" in got["refused_type"], got
    assert "member `a.b.jpg` would read back as key `a`" in got["refused_key"], got


WRITE_TASK_MEMORY = r"""
import json, resource, sys, types
import pyarrow as pa
import stoker.ray
from ray.data.block import BlockAccessor

dest, shard = sys.argv[1], int(sys.argv[2])
sink = stoker.ray.StokerDatasink(dest, shard_size=shard)
sink.on_write_start()
payload = bytes(range(256)) * 64  # 16 KiB
def blocks():
    # Three shards' worth of rows, made a block at a time (as Ray hands a write task its blocks).
    for b in range(3 * shard // (256 * 8192) + 1):
        keys = [f"k/{b:05d}{r:03d}" for r in range(256)]
        vals = [payload[r:r + 8000 + r] for r in range(256)]
        yield pa.table({"__key__": pa.array(keys), "jpg": pa.array(vals, pa.large_binary())})
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
written = sink.write(blocks(), types.SimpleNamespace(task_idx=0))
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
sink.on_write_complete(types.SimpleNamespace(write_returns=[written]))  # as Ray does once every task is done
print(json.dumps({"shards": len(written), "samples": sum(w["samples"] for w in written), "grown_kib": grown}))
"""


@pytest.mark.parametrize("dest", ["local", "s3"])
def test_a_write_task_holds_a_block_of_rows_not_its_shard(tmp_path, s3, dest):
    # Shards of 128 MiB, three and a bit from one task. Local: the task's memory grows by less
    # than half a shard (30-40 MiB here whatever the shard size, from 16 to 192 MiB). S3: the
    # shard goes in 8 MiB parts of a multipart upload, three in flight, and the task grows by
    # less than a shard (58-67 MiB for shards of 32 to 256 MiB). A task that gathered its shard
    # in memory grew by more than two shards (the rows as Python bytes and the tar built from
    # them; 282 MiB to S3).
    env = peers_env(tmp_path)
    shard = 128 << 20
    out_uri = str(tmp_path / "out") if dest == "local" else s3("held/")
    out = subprocess.run(
        [writers_python(), "-c", WRITE_TASK_MEMORY, out_uri, str(shard)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["shards"] == 4 and got["samples"] == 256 * (3 * shard // (256 * 8192) + 1), got
    bound = shard // 2 if dest == "local" else shard
    assert got["grown_kib"] * 1024 < bound, f"the write task grew by {got['grown_kib'] // 1024} MiB"
    back = stoker.open(out_uri)
    assert len(back) == got["samples"]


CHUNKED_BLOCK = r"""
import json, sys, types
import pyarrow as pa
import stoker, stoker.ray

dest, n = sys.argv[1], 40
keys = [f"s{i:03d}" for i in range(n)]
jpg = [bytes([i]) * (i * 37 % 500 + 1) for i in range(n)]
txt = [None if i == 5 else f"label {i % 3}" for i in range(n)]
def chunked(vals, typ, cuts):
    edges = [0, *cuts, n]
    return pa.chunked_array([pa.array(vals[a:b], typ) for a, b in zip(edges, edges[1:])], typ)
# A block as Ray assembles one from several tables, each column chunked its own way (a
# dictionary column too, one chunk a row long; an empty chunk; a chunk ending where a shard does).
table = pa.table({
    "__key__": chunked(keys, pa.string(), [11, 30]),
    "jpg": chunked(jpg, pa.large_binary(), [3, 4, 14, 25, 25]),
    "txt": pa.chunked_array([pa.array(txt[a:b]).dictionary_encode() for a, b in [(0, 17), (17, 18), (18, n)]]),
})
sink = stoker.ray.StokerDatasink(dest, samples_per_shard=7)
sink.on_write_start()
written = sink.write([table], types.SimpleNamespace(task_idx=0))
assert [len(c) for c in table.column("jpg").chunks] == [3, 1, 10, 11, 0, 15]
# Until the write completes, its shards are not a dataset (another task's may be missing).
try:
    stoker.open(dest)
    raise SystemExit("an unfinished write was opened")
except stoker.InvalidInputError as e:
    assert "did not finish" in str(e) and "rerun that write" in str(e), e
sink.on_write_complete(types.SimpleNamespace(write_returns=[written]))
print(json.dumps({"samples": [w["samples"] for w in written], "keys": keys, "jpg": [j.hex() for j in jpg], "txt": txt}))
"""


def test_a_block_of_many_chunks_is_written_row_for_row_across_shard_ends(tmp_path):
    # The write task takes each chunk where it lies (no combined copy of the block); shards of 7
    # rows end inside chunks, and chunk ends differ between columns.
    out = subprocess.run(
        [writers_python(), "-c", CHUNKED_BLOCK, str(tmp_path / "out")],
        capture_output=True, text=True, env=peers_env(tmp_path), timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    want = json.loads(out.stdout.strip().splitlines()[-1])
    assert want["samples"] == [7, 7, 7, 7, 7, 5]
    back = list(stoker.open(tmp_path / "out"))
    assert [s["__key__"] for s in back] == want["keys"]
    assert [bytes(s["jpg"]).hex() for s in back] == want["jpg"]
    assert [bytes(s["txt"]).decode() if "txt" in s else None for s in back] == want["txt"]


def test_stoker_pack_on_ray_runs_the_python_package_and_resumes(tmp_path):
    cli = ROOT / "target/debug/stoker"
    assert cli.exists(), f"{cli} is missing: cargo build -p stoker-cli (integration/test.sh builds it)"
    env = {**peers_env(tmp_path, [ROOT / "integration/py"]), "STOKER_PYTHON": writers_python()}
    src, dest = tmp_path / "src", tmp_path / "dest"
    subprocess.run([writers_python(), "-c", f"import ray_read; ray_read.write_shards({str(src)!r})"], check=True, env=env, timeout=300)
    run = [str(cli), "pack", str(src), str(dest), "--ray", "local", "--samples-per-shard", "8", "--json"]
    first = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads(first.stdout.strip().splitlines()[-1])
    assert report["samples"] == 60 and report["kept_shards"] == 0 and report["checksums"], report
    again = json.loads(subprocess.run(run, capture_output=True, text=True, env=env, timeout=300, check=True).stdout.splitlines()[-1])
    assert again["kept_shards"] == again["shards"] == report["shards"], again
    want = {s["__key__"]: s for s in stoker.open(src)}
    got = {s["__key__"]: s for s in stoker.open(dest)}
    assert got == want
    # What --ray cannot do is refused before anything runs; a missing interpreter is named.
    grouped = subprocess.run(run + ["--group"], capture_output=True, text=True, env=env, timeout=60)
    assert grouped.returncode != 0 and "no --group" in grouped.stderr, grouped.stderr
    missing = subprocess.run(run, capture_output=True, text=True, env={**env, "STOKER_PYTHON": "/nonexistent/python"}, timeout=60)
    assert missing.returncode != 0 and "STOKER_PYTHON" in missing.stderr and "stoker[ray]" in missing.stderr, missing.stderr


@pytest.mark.parametrize("mode", ["ray-data", "loader"])
def test_ray_train_example_trains_on_every_sample_each_epoch(tmp_path, mode):
    # The shards ray_read.py writes: 3 x 20 samples, a PNG and a class each.
    env = peers_env(tmp_path, [ROOT / "integration/py"])
    shards = tmp_path / "shards"
    make = f"import ray_read; ray_read.write_shards({str(shards)!r})"
    subprocess.run([writers_python(), "-c", make], check=True, env=env, timeout=120)
    out = subprocess.run(
        [writers_python(), str(ROOT / "examples/ray_train.py"), str(shards), "--mode", mode, "--cpus", "4"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    lines = (out.stdout + out.stderr).splitlines()
    done = [json.loads(line) for line in lines if line.startswith('{"done"')]
    assert done == [{"done": True, "error": None}], lines[-20:]
    ranks = {}
    for line in lines:
        # Ray prefixes a worker's lines with its name (and colour codes); a warning may quote
        # the print's source line, which is not JSON.
        at = line.find('{"rank": ')
        try:
            r = json.loads(line[at:]) if at >= 0 else None
        except ValueError:
            continue
        if r is not None:
            ranks[r["rank"]] = r
    assert sorted(ranks) == [0, 1] and all(r["world"] == 2 for r in ranks.values()), ranks
    # Two epochs, the 60 samples split between the two workers in each.
    assert [sum(r["seen"][e] for r in ranks.values()) for e in range(2)] == [60, 60], ranks


def test_without_ray_the_error_names_the_extra():
    code = "import sys\nsys.modules['ray'] = None\ntry:\n    import stoker.ray\nexcept ImportError as e:\n    print(e)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "pip install 'stoker[ray]'" in out.stdout, out.stdout + out.stderr
