#!/usr/bin/env python3
"""Formats read as they are (issue 14): Stoker against each format's own reader, same data, same run.

    bash integration/peers_setup.sh
    .venv-peers/bin/python integration/bench_formats.py [--samples 20000 --size 65536] [--quick] [--rounds 3]

The same samples (random bytes with the id in the first 8, a label; see peers_common.py) are
written by each format's own writer: pyarrow's ``pq.write_table`` (Parquet, snappy, page index,
one row group per shard's worth of rows), MosaicML's ``MDSWriter`` and ``litdata.optimize``,
all with the same shard size. Then, each row in its own process, two epochs:

- Parquet, sequential: pyarrow ``ParquetFile.iter_batches`` (columnar, no per-row Python: the
  fastest way pyarrow reads a file) vs ``stoker.Loader(shuffle=False)``.
- Parquet, random order: Hugging Face ``datasets.Dataset.from_parquet`` through a torch
  DataLoader with ``shuffle=True`` (how HF users train) vs ``stoker.Loader(shuffle=True)``.
- MDS: MosaicML's ``StreamingDataset(local=..., shuffle=True)`` through a DataLoader vs
  ``stoker.Loader(shuffle=True)`` on the same shards; and the same over the embedded S3 server
  (``--s3``; ``--latency-ms`` added by the proxy to every request).
- LitData: LitData's ``StreamingDataset(shuffle=True)`` + ``StreamingDataLoader`` vs
  ``stoker.Loader(shuffle=True)``.
- TFRecord (``tf.train.Example`` records written by the ``tfrecord`` package's ``TFRecordWriter``,
  one file per shard): the package's PyTorch reader, a ``ChainDataset`` of ``TFRecordDataset``
  per file with its ``.tfindex`` (so DataLoader workers split each file) and its
  ``shuffle_queue_size=1024`` shuffle, vs ``stoker.Loader(shuffle=True)`` and
  ``shuffle="shards"``.
- HDF5 (h5py files, ``id``/``label`` int64 and ``data`` a ``[rows, size]`` uint8 array, one file
  per four shards of rows): the map-style ``Dataset`` the guides show (each worker opens the
  files itself and reads ``f["data"][i]``) in a DataLoader with ``shuffle=True``, vs
  ``stoker.Loader(shuffle=True)`` and ``shuffle="shards"`` decoding ``data`` with ``stoker.Npy()``;
  and the same with ``data`` chunked (16 rows a chunk) and gzip-compressed (``hdf5-gzip``: h5py
  decompresses a chunk for every row it reads from it, Stoker once, keeping it decoded).

The peers' DataLoaders use one worker per core; Stoker uses its own threads. Every epoch is
checked: each sample exactly once, payload matching id and label. Each batch ends as the
``[B, size]`` uint8 tensor a training step takes, for every reader.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers_common as pc  # noqa: E402

SCRIPT = Path(__file__).resolve()


# --- Writers not in peers_common --------------------------------------------------------------


def write_parquet(out: Path, ids: List[int], size: int, rows_per_group: int, rows_per_file: int) -> None:
    """pyarrow's writer: columns id, label, data; snappy (its default); the page index written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    for f, start in enumerate(range(0, len(ids), rows_per_file)):
        part = ids[start : start + rows_per_file]
        table = pa.table({
            "id": pa.array(part, pa.int64()),
            "label": pa.array([pc.label(i) for i in part], pa.int64()),
            "data": pa.array([pc.payload(i, size) for i in part], pa.binary()),
        })
        pq.write_table(table, out / f"train-{f:05d}.parquet", row_group_size=rows_per_group, write_page_index=True)


# --- Child side: one row ----------------------------------------------------------------------


def write_tfrecord(out: Path, ids: List[int], size: int, per_file: int) -> None:
    """The ``tfrecord`` package's writer: an Example per sample (``id``, ``label``, ``data``), and
    each file's ``.tfindex`` (what its PyTorch reader needs to split a file between workers)."""
    from tfrecord import TFRecordWriter
    from tfrecord.tools.tfrecord2idx import create_index

    out.mkdir(parents=True, exist_ok=True)
    for f, start in enumerate(range(0, len(ids), per_file)):
        path = out / f"train-{f:05d}.tfrecord"
        w = TFRecordWriter(str(path))
        for i in ids[start:start + per_file]:
            w.write({"id": (i, "int"), "label": (pc.label(i), "int"), "data": (pc.payload(i, size), "byte")})
        w.close()
        create_index(str(path), str(path.with_suffix(".tfindex")))


def write_hdf5(out: Path, ids: List[int], size: int, per_file: int, gzip: bool = False) -> None:
    """h5py's writer, as the guides show it: per file, ``id`` and ``label`` int64 and ``data`` a
    ``[rows, size]`` uint8 array (contiguous, uncompressed: the payload is random bytes)."""
    import h5py
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    for f, start in enumerate(range(0, len(ids), per_file)):
        part = ids[start:start + per_file]
        with h5py.File(out / f"train-{f:05d}.h5", "w") as h:
            h.create_dataset("id", data=np.array(part, dtype=np.int64))
            h.create_dataset("label", data=np.array([pc.label(i) for i in part], dtype=np.int64))
            chunked = {"chunks": (16, size), "compression": "gzip"} if gzip else {}
            data = h.create_dataset("data", (len(part), size), dtype=np.uint8, **chunked)
            for j, i in enumerate(part):
                data[j] = np.frombuffer(pc.payload(i, size), dtype=np.uint8)


class H5Dataset:
    """The map-style HDF5 ``Dataset`` of the guides: the files are opened lazily in each
    DataLoader worker (an h5py handle does not survive a fork), a sample is one row of each
    dataset."""

    def __init__(self, files: List[Path]) -> None:
        import h5py

        self.files = [str(f) for f in files]
        self.starts = [0]
        for f in self.files:
            with h5py.File(f, "r") as h:
                self.starts.append(self.starts[-1] + len(h["id"]))
        self.handles: Optional[List[Any]] = None

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, i: int) -> Dict[str, Any]:
        import bisect

        import h5py

        if self.handles is None:
            self.handles = [h5py.File(f, "r") for f in self.files]
        k = bisect.bisect_right(self.starts, i) - 1
        h, r = self.handles[k], i - self.starts[k]
        return {"id": int(h["id"][r]), "label": int(h["label"][r]), "data": h["data"][r]}


def child_h5py(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    from torch.utils.data import DataLoader

    t0 = time.perf_counter()
    ds = H5Dataset(sorted(Path(spec["uri"]).glob("*.h5")))
    dl = DataLoader(ds, batch_size=spec["batch"], shuffle=True, num_workers=spec["workers"],
                    collate_fn=pc.collate_samples, persistent_workers=spec["workers"] > 0)
    result["open_s"] = time.perf_counter() - t0
    _epochs(spec, result, lambda: iter(dl), pc.unpack_peer)


def child_tfrecord(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    from tfrecord.torch.dataset import TFRecordDataset
    from torch.utils.data import ChainDataset, DataLoader

    def sample(r: Dict[str, Any]) -> Dict[str, Any]:
        return {"id": int(r["id"][0]), "label": int(r["label"][0]), "data": r["data"]}

    t0 = time.perf_counter()
    files = sorted(Path(spec["uri"]).glob("*.tfrecord"))
    ds = ChainDataset([TFRecordDataset(str(f), str(f.with_suffix(".tfindex")), shuffle_queue_size=1024,
                                       transform=sample) for f in files])
    dl = DataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"], collate_fn=pc.collate_samples)
    result["open_s"] = time.perf_counter() - t0
    _epochs(spec, result, lambda: iter(dl), pc.unpack_peer)


def child(spec: Dict[str, Any]) -> None:
    result: Dict[str, Any] = {"epochs": []}
    try:
        {"stoker": child_stoker, "pyarrow": child_pyarrow, "datasets": child_datasets, "mosaicml": child_mosaicml,
         "litdata": child_litdata, "tfrecord": child_tfrecord, "h5py": child_h5py}[spec["reader"]](spec, result)
    except BaseException as e:  # reported in the table, never dropped
        import traceback

        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
    Path(spec["result"]).write_text(json.dumps(result))


def _epochs(spec: Dict[str, Any], result: Dict[str, Any], make_iter: Any, unpack: Any) -> None:
    for _ in range(spec["epochs"]):
        ep = pc.consume(make_iter(), unpack)
        result["epochs"].append(pc.epoch_record(ep, spec["samples"]))


def child_stoker(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    import stoker

    size = spec["size"]
    t0 = time.perf_counter()
    npy = spec["format"].startswith("hdf5")  # `data` is a row of a uint8 array there: an .npy per sample
    decode = {"id": stoker.Int(), "label": stoker.Int(), **({"data": stoker.Npy()} if npy else {})}
    loader = stoker.Loader(spec["uri"], batch_size=spec["batch"], shuffle=spec["shuffle"], seed=0,
                           decode=decode, **spec.get("options", {}))
    result["open_s"] = time.perf_counter() - t0
    result["info"] = {k: v for k, v in loader.dataset.info().items() if k != "uri"}

    def unpack(batch: Dict[str, Any]) -> Any:
        if npy:
            return pc.ids_from_rows(batch["data"]), batch["id"], batch["label"]
        data, _offsets = batch["data"]  # every value is `size` bytes: one [B, size] view, no copy
        return pc.ids_from_rows(data.view(-1, size)), batch["id"], batch["label"]

    _epochs(spec, result, lambda: iter(loader), unpack)


def child_pyarrow(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    size = spec["size"]
    files = sorted(Path(spec["uri"]).glob("*.parquet"))
    t0 = time.perf_counter()
    handles = [pq.ParquetFile(f) for f in files]
    result["open_s"] = time.perf_counter() - t0

    def batches() -> Any:
        for h in handles:
            for rb in h.iter_batches(batch_size=spec["batch"], columns=["id", "label", "data"]):
                col = rb.column(2)
                # A binary column's values are one contiguous buffer: the [B, size] tensor is a
                # view of it when every value has `size` bytes (checked by the offsets).
                offsets = np.frombuffer(col.buffers()[1], dtype=np.int32)[col.offset : col.offset + len(col) + 1]
                start = int(offsets[0])
                if int(offsets[-1]) - start != len(col) * size:
                    raise RuntimeError("values are not all `size` bytes")
                data = np.frombuffer(col.buffers()[2], dtype=np.uint8)[start : start + len(col) * size]
                yield {
                    "data": torch.from_numpy(data.reshape(len(col), size).copy()),
                    "id": torch.from_numpy(rb.column(0).to_numpy()),
                    "label": torch.from_numpy(rb.column(1).to_numpy()),
                }

    _epochs(spec, result, batches, pc.unpack_peer)


def child_datasets(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    import datasets
    from torch.utils.data import DataLoader

    datasets.disable_progress_bars()
    files = sorted(str(p) for p in Path(spec["uri"]).glob("*.parquet"))
    t0 = time.perf_counter()
    # Converts the Parquet files into its Arrow cache once (counted in open_s), then memory-maps it.
    ds = datasets.Dataset.from_parquet(files, cache_dir=str(Path(spec["work"]) / "hf-cache"))
    result["open_s"] = time.perf_counter() - t0
    dl = DataLoader(ds, batch_size=spec["batch"], shuffle=spec.get("shuffle", True), num_workers=spec["workers"],
                    collate_fn=pc.collate_samples)
    _epochs(spec, result, lambda: iter(dl), pc.unpack_peer)


def child_mosaicml(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    t0 = time.perf_counter()
    if spec["uri"].startswith("s3://"):
        ds = StreamingDataset(remote=spec["uri"], local=str(Path(spec["work"]) / "mds-local"), shuffle=True,
                              shuffle_seed=1, batch_size=spec["batch"])
        for stream in ds.streams:  # see bench_remote.py: forked workers must not share this client
            stream._downloader.clean_up()
    else:
        ds = StreamingDataset(local=spec["uri"], shuffle=True, shuffle_seed=1, batch_size=spec["batch"])
    dl = DataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"], collate_fn=pc.collate_samples)
    result["open_s"] = time.perf_counter() - t0
    _epochs(spec, result, lambda: iter(dl), pc.unpack_peer)


def child_litdata(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    from litdata import StreamingDataLoader, StreamingDataset

    t0 = time.perf_counter()
    ds = StreamingDataset(spec["uri"], shuffle=True, seed=1)
    dl = StreamingDataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"], collate_fn=pc.collate_samples)
    result["open_s"] = time.perf_counter() - t0
    _epochs(spec, result, lambda: iter(dl), pc.unpack_peer)


# --- Parent side ------------------------------------------------------------------------------

ROWS = [
    # (name, label, reader, format, peer, options)
    ("pyarrow-seq", "pyarrow 26 `ParquetFile.iter_batches` (sequential)", "pyarrow", "parquet", True, {}),
    ("stoker-parquet-seq", "Stoker `Loader(shuffle=False)` over the Parquet files", "stoker", "parquet", False,
     {"shuffle": False}),
    ("datasets-seq", "HF datasets 4.8 `Dataset.from_parquet` + DataLoader(shuffle=False)", "datasets", "parquet",
     True, {"shuffle": False}),
    ("datasets-shuffle", "HF datasets 4.8 `Dataset.from_parquet` + DataLoader(shuffle=True)", "datasets", "parquet",
     True, {}),
    ("stoker-parquet-shuffle", "Stoker `Loader(shuffle=True)` over the Parquet files", "stoker", "parquet", False,
     {"shuffle": True}),
    ("mosaicml", "MosaicML Streaming 0.13 `StreamingDataset(local=..., shuffle=True)`", "mosaicml", "mds", True, {}),
    ("stoker-mds", "Stoker `Loader(shuffle=True)` over the MDS shards", "stoker", "mds", False, {"shuffle": True}),
    ("litdata", "LitData 0.2.76 `StreamingDataset(shuffle=True)`", "litdata", "litdata", True, {}),
    ("stoker-litdata", "Stoker `Loader(shuffle=True)` over the LitData chunks", "stoker", "litdata", False,
     {"shuffle": True}),
    # LitData's shuffle=True permutes chunks and shuffles within them; Stoker's like of it is the
    # shard shuffle (chunks, row groups are the shards), a different mixing than the global one.
    ("stoker-litdata-shards", 'Stoker `Loader(shuffle="shards")` over the LitData chunks', "stoker", "litdata",
     False, {"shuffle": "shards"}),
    ("tfrecord", "tfrecord 1.14 `TFRecordDataset` per file (+ .tfindex, shuffle queue 1024) in a DataLoader",
     "tfrecord", "tfrecord", True, {}),
    ("stoker-tfrecord", "Stoker `Loader(shuffle=True)` over the TFRecord files", "stoker", "tfrecord", False,
     {"shuffle": True}),
    ("stoker-tfrecord-shards", 'Stoker `Loader(shuffle="shards")` over the TFRecord files', "stoker", "tfrecord",
     False, {"shuffle": "shards"}),
    ("h5py", "h5py 3.16 map-style Dataset (`f[name][i]`, files opened per worker) in a DataLoader(shuffle=True)",
     "h5py", "hdf5", True, {}),
    ("stoker-hdf5", "Stoker `Loader(shuffle=True)` over the HDF5 files", "stoker", "hdf5", False, {"shuffle": True}),
    ("stoker-hdf5-shards", 'Stoker `Loader(shuffle="shards")` over the HDF5 files', "stoker", "hdf5", False,
     {"shuffle": "shards"}),
    ("h5py-gzip", "h5py 3.16 map-style Dataset in a DataLoader(shuffle=True), `data` chunked and gzip'd",
     "h5py", "hdf5-gzip", True, {}),
    ("stoker-hdf5-gzip", "Stoker `Loader(shuffle=True)` over the chunked, gzip'd HDF5 files", "stoker", "hdf5-gzip",
     False, {"shuffle": True}),
    ("stoker-hdf5-gzip-shards", "Stoker `Loader(shuffle=\"shards\")` over the chunked, gzip'd HDF5 files", "stoker",
     "hdf5-gzip", False, {"shuffle": "shards"}),
    ("stoker-parquet-shards", 'Stoker `Loader(shuffle="shards")` over the Parquet files (row groups)', "stoker",
     "parquet", False, {"shuffle": "shards"}),
    ("mosaicml-s3", "MosaicML Streaming 0.13 over S3 (shuffle=True)", "mosaicml", "mds-s3", True, {}),
    ("stoker-mds-s3", "Stoker `Loader(shuffle=True)` over the MDS shards on S3", "stoker", "mds-s3", False,
     {"shuffle": True}),
]
# Each Stoker row against the peer row on the same data and order.
PAIRS = [("stoker-parquet-seq", "pyarrow-seq"), ("stoker-parquet-seq", "datasets-seq"),
         ("stoker-parquet-shuffle", "datasets-shuffle"), ("stoker-mds", "mosaicml"), ("stoker-litdata", "litdata"),
         ("stoker-mds-s3", "mosaicml-s3"), ("stoker-litdata-shards", "litdata"),
         ("stoker-parquet-shards", "datasets-shuffle"), ("stoker-tfrecord", "tfrecord"),
         ("stoker-tfrecord-shards", "tfrecord"), ("stoker-hdf5", "h5py"), ("stoker-hdf5-shards", "h5py"),
         ("stoker-hdf5-gzip", "h5py-gzip"), ("stoker-hdf5-gzip-shards", "h5py-gzip")]


def selected_rows(args: argparse.Namespace) -> List[Dict[str, Any]]:
    rows = [{"name": n, "label": lab, "reader": r, "format": f, "peer": p, **o} for n, lab, r, f, p, o in ROWS]
    if not args.s3:
        rows = [r for r in rows if not r["format"].endswith("-s3")]
    if args.rows:
        wanted = set(args.rows.split(","))
        unknown = wanted - {r[0] for r in ROWS}
        if unknown:
            sys.exit(f"unknown --rows {sorted(unknown)}; rows: {[r[0] for r in ROWS]}")
        rows = [r for r in rows if r["name"] in wanted]
    return rows


def prepare(args: argparse.Namespace, work: Path, formats: set, servers: Optional[pc.Servers]) -> Dict[str, Any]:
    ids = list(range(args.samples))
    shard_bytes = args.shard_mib * pc.MiB
    per_shard = max(1, shard_bytes // args.size)
    data = work / "data"
    t0 = time.perf_counter()
    if "parquet" in formats:
        write_parquet(data / "parquet", ids, args.size, per_shard, per_shard * 4)
    if formats & {"mds", "mds-s3"}:
        pc.write_mds(data / "mds", ids, args.size, shard_bytes)
    if "litdata" in formats:
        pc.write_litdata(data / "litdata", ids, args.size, shard_bytes)
    if "tfrecord" in formats:
        write_tfrecord(data / "tfrecord", ids, args.size, per_shard)
    if "hdf5" in formats:
        write_hdf5(data / "hdf5", ids, args.size, per_shard * 4)
    if "hdf5-gzip" in formats:
        write_hdf5(data / "hdf5-gzip", ids, args.size, per_shard * 4, gzip=True)
    written = time.perf_counter() - t0
    if "mds-s3" in formats and servers:
        pc.upload_dir(servers.direct, data / "mds", "mds")
    return {"write_s": written, "data": str(data), "per_shard": per_shard}


def run_one(args: argparse.Namespace, row: Dict[str, Any], work: Path, prep: Dict[str, Any],
            servers: Optional[pc.Servers], rnd: int) -> Dict[str, Any]:
    rdir = pc.fresh_dir(work, f"row-{row['name']}-{rnd}")
    spec: Dict[str, Any] = {"reader": row["reader"], "samples": args.samples, "size": args.size, "batch": args.batch,
                            "workers": args.workers, "epochs": args.epochs, "format": row["format"]}
    env = {"STOKER_CACHE_DIR": str(rdir / "stoker-cache"), "XDG_CACHE_HOME": str(rdir / "xdg-cache"),
           "LITDATA_CACHE_DIR": str(rdir / "litdata-cache"), "HF_HOME": str(rdir / "hf")}
    if row["format"] == "mds-s3":
        spec["uri"] = f"s3://{pc.BUCKET}/mds"
        env.update(pc.s3_env(servers.through_proxy))
    else:
        spec["uri"] = str(Path(prep["data"]) / row["format"])
    if row["reader"] == "stoker":
        spec["shuffle"] = row["shuffle"]
    print(f"row {row['name']}" + (f" (round {rnd + 1})" if args.rounds > 1 else "") + " ...", flush=True)
    load = os.getloadavg()[0]
    res = pc.run_row(SCRIPT, spec, env, rdir, args.timeout)
    res["load_1m"] = load
    if res.get("error"):
        print(f"  FAILED: {res['error']}", flush=True)
    else:
        for i, e in enumerate(res["epochs"], 1):
            print(f"  epoch {i}: {e['samples_per_s']:,.0f} samples/s ({e['unique']:,} unique, {e['bad']} bad)",
                  flush=True)
    if not args.keep:
        shutil.rmtree(rdir, ignore_errors=True)
    return res


def run(args: argparse.Namespace) -> Dict[str, Any]:
    m = pc.machine()
    work = Path(tempfile.mkdtemp(prefix="stoker-bench-formats-", dir=args.work_dir))
    rows = selected_rows(args)
    formats = {r["format"] for r in rows}
    servers = pc.Servers(work, args.latency_ms).start() if "mds-s3" in formats else None
    report: Dict[str, Any] = {"machine": m, "versions": pc.versions(), "args": vars(args), "rows": []}
    try:
        print(f"writing {args.samples:,} samples of {args.size:,} B as {', '.join(sorted(formats))} ...", flush=True)
        prep = prepare(args, work, formats, servers)
        report["prepare"] = prep
        runs: Dict[str, List[Dict[str, Any]]] = {r["name"]: [] for r in rows}
        for rnd in range(args.rounds):
            for row in rows if rnd % 2 == 0 else rows[::-1]:
                runs[row["name"]].append(run_one(args, row, work, prep, servers, rnd))
        for row in rows:
            res = pc.aggregate(runs[row["name"]])
            res.update({k: row[k] for k in ("name", "label", "format", "peer")})
            report["rows"].append(res)
    finally:
        if servers:
            servers.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    m["load_end"] = os.getloadavg()
    return report


def render(report: Dict[str, Any]) -> str:
    a = report["args"]
    out = [f"Formats read as they are: {a['samples']:,} samples x {a['size']:,} B, {a['shard_mib']} MiB shards, "
           f"batch {a['batch']}, peers' DataLoaders with {a['workers']} workers, {a['epochs']} epochs per row "
           f"(each row a fresh process; the files sit in the page cache)"
           + (f"; S3 rows through the embedded server + {a['latency_ms']} ms proxy" if a["s3"] else "")
           + (f"; medians of {a['rounds']} rounds (range)." if a["rounds"] > 1 else "."), ""]
    header = ["reader", "open s", "epoch 1 samples/s", "last epoch samples/s", "peak RSS MiB", "load 1m",
              "exactly once, right bytes"]
    body = []
    for r in report["rows"]:
        if r.get("error"):
            body.append([r["label"], "", "failed", "", "", f"{r.get('load_1m', 0):.1f}", r["error"]])
            continue
        e1, el = r["epochs"][0], r["epochs"][-1]
        body.append([r["label"], f"{r.get('open_s', 0):.2f}", pc.rate_cell(e1), pc.rate_cell(el),
                     "" if not r.get("peak_rss") else f"{r['peak_rss'] / pc.MiB:,.0f}", f"{r.get('load_1m', 0):.1f}",
                     pc.row_notes(r) or "yes"])
    out.append(pc.table(header, body))
    out.append("")
    ok = {r["name"]: r for r in report["rows"] if not r.get("error")}
    # The last epoch is the comparison (what a run of many epochs sees); epoch 1 is shown too,
    # since a reader that keeps what it decoded (HF's Arrow cache, Stoker's spill) pays for it there.
    for mine, peer in PAIRS:
        if mine in ok and peer in ok:
            s = ok[mine]["epochs"][-1]["samples_per_s"]
            p = ok[peer]["epochs"][-1]["samples_per_s"]
            s1, p1 = ok[mine]["epochs"][0]["samples_per_s"], ok[peer]["epochs"][0]["samples_per_s"]
            goal = "" if mine.endswith("-s3") else " (goal >= 3x)"
            out.append(f"- {ok[mine]['label']} / {ok[peer]['label']}: **{s / p:.2f}x**{goal}; epoch 1 {s1 / p1:.2f}x")
    out.append("")
    out.append(pc.machine_line(report["machine"]))
    out.append("versions: " + ", ".join(f"{k} {x}" for k, x in report["versions"].items()))
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=64 << 10, help="bytes per sample (default 65536)")
    ap.add_argument("--shard-mib", type=int, default=64, help="shard size (MDS size_limit, LitData chunk_bytes, "
                    "Parquet rows per row group = shard / size, 4 row groups per file)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="DataLoader workers for the peers")
    ap.add_argument("--s3", action="store_true", help="also the MDS rows over the embedded S3 server")
    ap.add_argument("--latency-ms", type=int, default=25, help="added by the proxy to every S3 request")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1024 samples in 4 MiB shards")
    ap.add_argument("--rows", help="comma-separated rows to run")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per row")
    ap.add_argument("--json", help="also write the full report here")
    ap.add_argument("--work-dir", help="where the temporary data goes (default: the system temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if args.quick:
        args.samples, args.shard_mib = 1024, 4
    if args.size < 16:
        ap.error("--size must be at least 16 bytes (the id is in the first 8)")
    report = run(args)
    text = render(report)
    print()
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
