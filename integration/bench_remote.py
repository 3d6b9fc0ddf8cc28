#!/usr/bin/env python3
"""Remote epochs side by side (issue 12): Stoker against MosaicML Streaming and LitData on the same
embedded S3 server with latency added to every request, and the mixing each shuffle gives.

    bash integration/peers_setup.sh
    .venv-peers/bin/python integration/bench_remote.py [--samples 20000 --size 65536 --latency-ms 25] [--quick] [--json out.json]
    .venv-peers/bin/python integration/bench_remote.py --epochs 3 --cache-fraction 0.25   # data 4x every cache

The same samples (random bytes, the id in the first 8 bytes, a label) are written by each reader's
own writer: MosaicML's ``MDSWriter``, ``litdata.optimize``, and ``webdataset.TarWriter`` shards
indexed by ``stoker index`` for Stoker, all the same shard size, uploaded through the S3 API to
the embedded S3 server (s3s-fs). Readers go through the fault proxy, which adds ``--latency-ms``
to every request and, with ``--link-mib-s N``, carries every forwarded response body over one shared link of
N MiB/s: the server, the proxy and the reader share this machine's cores, so without a link rate
the bound is what the cores allow all three, where a node reading from a real store is bound by
its network with cores to spare. Each row runs in its own process with fresh cache directories and reads two
shuffled epochs; the peers through a torch DataLoader with one worker per core, Stoker through
``stoker.Loader``. Every epoch is checked: each sample exactly once, payload matching id and
label. Requests and bytes are counted at the proxy for every row; peak memory is sampled from
outside over the row's process tree: RSS summed, and anonymous RSS summed (without file-backed
pages, so the libraries that forked workers map are not counted once per worker).

The bound: the first row reads the same tar shards whole, each epoch, through Stoker's store layer
with no cache, sampler, index or batches (``stoker bench``'s bound worker: parallel ranged reads
under the fetch layer's in-flight limit), into memory and dropped; every other row's epochs are
also given as ``x bound``. ``--cache-fraction F`` limits every reader's cache to that share of
the data (Stoker ``disk_cache_bytes``, MosaicML ``cache_limit``, LitData ``max_cache_size``), so
that every epoch reads from the store.

Mixing: from each reader's epoch-1 delivery order, |pos(i+1) - pos(i)| in storage order, plus
``webdataset``'s own ``WebDataset(...).shuffle(1000)`` over the same tar shards (read locally:
only its order is measured).

Two peer quirks are worked around, each visible in its row's label or code: LitData's obstore
client is given ``allow_http`` (it cannot reach a plain-HTTP endpoint otherwise; its boto3 path
has its own row), and MosaicML's parent-process S3 client is dropped before the DataLoader forks
(left in place, its workers share one keep-alive socket: 60 s stalls or corrupted shards; the
``mosaicml-as-is`` row, run only when named in ``--rows``, shows it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers_common as pc  # noqa: E402

SCRIPT = Path(__file__).resolve()


# --- Child side: one row -------------------------------------------------------------------------


def child(spec: Dict[str, Any]) -> None:
    result: Dict[str, Any] = {"epochs": []}
    try:
        {"stoker": child_stoker, "mosaicml": child_mosaicml, "litdata": child_litdata,
         "webdataset": child_webdataset, "bound": child_bound}[spec["reader"]](spec, result)
    except BaseException as e:  # reported in the table, never dropped
        import traceback

        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
    Path(spec["result"]).write_text(json.dumps(result))


def _epochs(spec: Dict[str, Any], result: Dict[str, Any], make_iter: Any, unpack: Any,
            stats: Optional[Any] = None) -> None:
    """Run ``spec["epochs"]`` epochs, metering the proxy around each; epoch 1's order is saved
    for the mixing table."""
    import numpy as np

    meter = pc.ProxyMeter(spec["proxy_addr"], spec["proxy_pid"]) if spec.get("proxy_addr") else None
    for e in range(spec["epochs"]):
        if spec.get("barrier"):
            _barrier(spec, e)
        before = meter.snapshot() if meter else None
        s0 = stats() if stats else None
        perf = _perf_start(spec, e)
        ep = pc.consume(make_iter(), unpack)
        _perf_stop(perf)
        io = pc.delta(before, meter.snapshot()) if meter and before else None
        extra: Dict[str, Any] = {}
        if stats:
            s1 = stats()
            extra["stoker"] = {k: s1.get(k) for k in ("store_requests", "store_bytes", "cache_hit_rate",
                                                        "consumer_wait_fraction", "retries", "hedges",
                                                        "remote_requests", "remote_bytes", "disk_writes",
                                                        "lease_waits", "disk_behind")}
            for k in ("store_requests", "store_bytes", "remote_requests", "remote_bytes", "disk_writes",
                      "lease_waits", "disk_behind"):
                extra["stoker"][k] = (extra["stoker"][k] or 0) - (s0.get(k) or 0)
        result["epochs"].append(pc.epoch_record(ep, spec["samples"], io, **extra))
        if e == 0:
            np.save(Path(spec["work"]) / "order.npy", ep.ids)
            result["order"] = str(Path(spec["work"]) / "order.npy")


def _perf_start(spec: Dict[str, Any], epoch: int) -> Optional[Any]:
    """With ``--perf DIR``: a system-wide ``perf record`` (call graphs) around epoch 1 only, so the
    profile holds the cold epoch and nothing of the set-up; one file per row and round."""
    if not spec.get("perf") or epoch != 0:
        return None
    import subprocess

    out = Path(spec["perf"]) / f"{Path(spec['result']).parent.name}.data"
    proc = subprocess.Popen(["perf", "record", "-a", "--call-graph", "dwarf,16384", "-F", "499", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # perf's start-up, outside the measured epoch (a harness wait, not a sync)
    return proc


def _perf_stop(proc: Optional[Any]) -> None:
    if proc is not None:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def _barrier(spec: Dict[str, Any], epoch: int) -> None:
    """Wait until every rank of the node is ready for ``epoch`` (ranks of a job start each epoch
    together: their steps all-reduce). A file per rank; polled, as this is a benchmark's
    harness, not the thing measured."""
    d = Path(spec["barrier"])
    (d / f"e{epoch}.r{spec['rank']}").touch()
    while len(list(d.glob(f"e{epoch}.r*"))) < spec["world"]:
        time.sleep(0.002)


def child_stoker(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    import stoker

    t0 = time.perf_counter()
    loader = stoker.Loader(spec["uri"], batch_size=spec["batch"], shuffle=spec["shuffle"], seed=0,
                           decode={"cls": stoker.Int()}, **spec.get("options", {}))
    result["open_s"] = time.perf_counter() - t0
    result["info"] = {k: v for k, v in loader.dataset.info().items() if k != "uri"}
    _epochs(spec, result, lambda: iter(loader), pc.unpack_stoker(spec["size"]), stats=loader.stats)
    result["stats_keys"] = sorted(loader.stats().keys())


def child_bound(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    """The bound: the same tar shards read whole, each epoch, by ``stoker bench``'s bound worker
    (the store's fetch layer: parallel ranged reads, its concurrency limit and retries; no
    cache, sampler, index or batches), into memory and dropped. Every byte is counted; there
    are no samples to check, so an epoch is "every shard's bytes"."""
    import subprocess

    meter = pc.ProxyMeter(spec["proxy_addr"], spec["proxy_pid"]) if spec.get("proxy_addr") else None
    result["open_s"] = 0.0
    for _ in range(spec["epochs"]):
        before = meter.snapshot() if meter else None
        t_start = time.time()
        run = subprocess.run([str(pc._binary("stoker")), "bench", "--worker", "bound", spec["uri"], "--samples",
                              str(spec["samples"]), "--epochs", "1"], capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"the bound worker failed: {run.stderr.strip()[-500:]}")
        line = next(ln for ln in run.stdout.splitlines() if ln.startswith("result "))
        m = json.loads(line[len("result "):])
        io = pc.delta(before, meter.snapshot()) if meter and before else None
        n = spec["samples"]
        rec = {"seconds": m["seconds"], "first_batch_s": 0.0, "samples": n, "unique": n, "expected": n, "bad": 0,
               "samples_per_s": n / m["seconds"] if m["seconds"] > 0 else 0.0, "t_start": t_start,
               "t_end": time.time(), "bound_bytes": m["bytes"]}
        if io is not None:
            rec.update(io)
        result["epochs"].append(rec)
        result["open_s"] = max(result["open_s"], m["open_s"])


def child_mosaicml(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    t0 = time.perf_counter()
    limit = {"cache_limit": spec["cache_limit"]} if spec.get("cache_limit") else {}
    ds = StreamingDataset(remote=spec["uri"], local=str(Path(spec["work"]) / "mds-local"), shuffle=True,
                          shuffle_seed=1, batch_size=spec["batch"], **limit)
    if not spec.get("as_is"):
        # The boto3 client that fetched index.json here stays in the dataset, and forked DataLoader
        # workers inherit it: both then talk over the same keep-alive socket, so one waits out
        # the 60 s read timeout or a shard is written from another's response (IndexError
        # "Relative sample index ... is not present"). MosaicML's own clean_up() drops it, and
        # each worker makes its own client.
        for stream in ds.streams:
            stream._downloader.clean_up()
    dl = DataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"], collate_fn=pc.collate_samples)
    result["open_s"] = time.perf_counter() - t0
    _epochs(spec, result, lambda: iter(dl), pc.unpack_peer)


def child_litdata(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    pc.litdata_s3_path(boto3=spec.get("boto3", False))
    from litdata import StreamingDataLoader, StreamingDataset

    t0 = time.perf_counter()
    limit = {"max_cache_size": spec["cache_limit"]} if spec.get("cache_limit") else {}
    ds = StreamingDataset(spec["uri"], shuffle=True, seed=1, cache_dir=str(Path(spec["work"]) / "litdata-cache"),
                          **limit)
    dl = StreamingDataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"], collate_fn=pc.collate_samples)
    result["open_s"] = time.perf_counter() - t0
    _epochs(spec, result, lambda: iter(dl), pc.unpack_peer)


def child_webdataset(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    import webdataset as wds
    from torch.utils.data import DataLoader

    def collate(items: List[Dict[str, Any]]) -> Dict[str, Any]:
        return pc.collate_samples([{"data": s["bin"], "id": int(s["__key__"]), "label": int(s["cls"])} for s in items])

    t0 = time.perf_counter()
    ds = wds.WebDataset(spec["urls"], shardshuffle=100, seed=1, empty_check=False).shuffle(1000)
    dl = DataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"], collate_fn=collate)
    result["open_s"] = time.perf_counter() - t0
    _epochs(spec, result, lambda: iter(dl), pc.unpack_peer)


# --- Parent side ------------------------------------------------------------------------------------


def rows(args: argparse.Namespace) -> List[Dict[str, Any]]:
    out = [
        # What the link and the store layer allow: every other remote row is held to it (x bound).
        {"name": "bound", "label": "bound: the tar shards read whole (store fetch layer, no cache)", "reader": "bound",
         "format": "wds"},
        {"name": "stoker-shards", "label": 'Stoker `Loader(shuffle="shards")`, defaults', "reader": "stoker",
         "shuffle": "shards", "format": "wds"},
        {"name": "stoker-shards-disk", "label": 'Stoker `shuffle="shards"` + `disk_cache_dir`', "reader": "stoker",
         "shuffle": "shards", "format": "wds", "disk_cache": True},
        # A disk slower than the link: leave blocks out of the cache rather than wait for it.
        {"name": "stoker-shards-skip", "label": 'Stoker `shuffle="shards"`, `disk_cache_behind="skip"`',
         "reader": "stoker", "shuffle": "shards", "format": "wds", "options": {"disk_cache_behind": "skip"},
         "default": False},
        # No disk cache: what epoch 1 costs without the cache's block writes (each epoch reads the store).
        {"name": "stoker-shards-nocache", "label": 'Stoker `shuffle="shards"`, `disk_cache=False`', "reader": "stoker",
         "shuffle": "shards", "format": "wds", "disk_cache": False, "default": False},
        {"name": "stoker-global", "label": "Stoker `Loader(shuffle=True)`, defaults", "reader": "stoker",
         "shuffle": True, "format": "wds"},
        {"name": "stoker-global-disk", "label": "Stoker `shuffle=True` + `disk_cache_dir`", "reader": "stoker",
         "shuffle": True, "format": "wds", "disk_cache": True},
        # No disk cache: no block plan either, so every sample is its own ranged request unless
        # the loader's look-ahead finds neighbours; this is the row the in-flight bound is about.
        {"name": "stoker-global-nocache", "label": "Stoker `shuffle=True`, `disk_cache=False`", "reader": "stoker",
         "shuffle": True, "format": "wds", "disk_cache": False},
        # The same with the old fixed limit instead of the latency-sized one (`max_in_flight` auto).
        {"name": "stoker-global-nocache-64", "label": "Stoker `shuffle=True`, `disk_cache=False, max_in_flight=64`",
         "reader": "stoker", "shuffle": True, "format": "wds", "disk_cache": False, "options": {"max_in_flight": 64},
         "default": False},
        {"name": "mosaicml", "label": "MosaicML Streaming 0.13 (MDS, shuffle=True)", "reader": "mosaicml",
         "format": "mds", "peer": True},
        {"name": "mosaicml-as-is", "label": "MosaicML Streaming 0.13, parent's S3 client left to the workers",
         "reader": "mosaicml", "format": "mds", "peer": True, "as_is": True, "default": False},
        {"name": "litdata", "label": "LitData 0.2.76 (optimize chunks, shuffle=True; obstore path)", "reader": "litdata",
         "format": "litdata", "peer": True},
        {"name": "litdata-boto3", "label": "LitData 0.2.76 (same, boto3 path)", "reader": "litdata", "format": "litdata",
         "peer": True, "boto3": True},
    ]
    if args.rows:
        wanted = set(args.rows.split(","))
        unknown = wanted - {r["name"] for r in out}
        if unknown:
            sys.exit(f"unknown --rows {sorted(unknown)}; rows: {[r['name'] for r in out]}")
        return [r for r in out if r["name"] in wanted]
    return [r for r in out if r.get("default", True)]


def prepare(args: argparse.Namespace, work: Path, servers: pc.Servers, formats: Set[str]) -> Dict[str, Any]:
    """Write the samples in each format the rows read (tar shards always: webdataset's mixing
    pass reads them), upload each, index the tar shards. Each staged copy is deleted once
    uploaded (the disk holds the server's copy only); webdataset reads the tar shards from the
    server's directory (s3s-fs keeps each object as a plain file)."""
    ids = list(range(args.samples))
    shard_bytes = args.shard_mib * pc.MiB
    per_shard = max(1, shard_bytes // args.size)
    staged = work / "staged"
    writers = {
        "wds": lambda out: pc.write_tar(out, ids, args.size, per_shard),
        "mds": lambda out: pc.write_mds(out, ids, args.size, shard_bytes),
        "litdata": lambda out: pc.write_litdata(out, ids, args.size, shard_bytes),
    }
    bounds = {"wds": list(range(0, args.samples, per_shard)) + [args.samples]}
    write_s = upload_s = 0.0
    uploaded = {}
    for fmt in sorted(formats | {"wds"}):
        t0 = time.perf_counter()
        writers[fmt](staged / fmt)
        if fmt == "mds":
            bounds["mds"] = pc.shard_bounds_mds(staged / "mds")
        if fmt == "litdata":
            pc.check_litdata_order(staged / "litdata", [0, args.samples // 2, args.samples - 1])
            bounds["litdata"] = pc.shard_bounds_litdata(staged / "litdata")
        t1 = time.perf_counter()
        uploaded[fmt] = pc.upload_dir(servers.direct, staged / fmt, fmt)
        shutil.rmtree(staged / fmt)
        write_s += t1 - t0
        upload_s += time.perf_counter() - t1
    t0 = time.perf_counter()
    pc.stoker_index(f"s3://{pc.BUCKET}/wds", pc.s3_env(servers.direct))
    upload_s += time.perf_counter() - t0
    tars = sorted(str(p) for p in (work / "s3" / pc.BUCKET / "wds").glob("*.tar"))
    if len(tars) != len(bounds["wds"]) - 1:
        raise RuntimeError(f"expected {len(bounds['wds']) - 1} tar shards in the server's directory, found {len(tars)}")
    return {"write_s": write_s, "upload_s": upload_s, "uploaded": uploaded, "tars": tars, "bounds": bounds,
            "per_shard": per_shard}


def run_one(args: argparse.Namespace, row: Dict[str, Any], work: Path, servers: pc.Servers, env: Dict[str, str],
            prep: Dict[str, Any], rnd: int) -> Dict[str, Any]:
    """One row, once, in a fresh process with fresh cache directories."""
    rdir = pc.fresh_dir(work, f"row-{row['name']}-{rnd}")
    cache = pc.fresh_dir(rdir, "stoker-cache")
    spec: Dict[str, Any] = {
        "reader": row["reader"], "samples": args.samples, "size": args.size, "batch": args.batch,
        "workers": args.workers, "epochs": args.epochs, "proxy_addr": servers.proxy_addr,
        "proxy_pid": servers.proxy.pid if servers.proxy else 0,
        "perf": str(Path(args.perf).resolve()) if args.perf else None,
    }
    # With --cache-fraction, every reader's cache holds that share of the data (peers too).
    limit = int(args.cache_fraction * args.samples * args.size) if args.cache_fraction else None
    if row["reader"] == "bound":
        spec["uri"] = f"s3://{pc.BUCKET}/wds"
    elif row["reader"] == "stoker":
        spec["uri"] = f"s3://{pc.BUCKET}/wds"
        spec["shuffle"] = row["shuffle"]
        # Sized to hold the whole data set, so epoch 2 is the warm-cache epoch whatever the default
        # size is (a share of the disk's free space once the disk cache is on by default).
        cache_bytes = limit or 2 * args.samples * args.size + (256 << 20)
        spec["options"] = ({"disk_cache_dir": str(rdir / "disk-cache"), "disk_cache_bytes": cache_bytes}
                           if row.get("disk_cache") else {"disk_cache": False} if row.get("disk_cache") is False
                           else {"disk_cache_bytes": limit} if limit else {})
        spec["options"].update(row.get("options", {}))
    else:
        spec["uri"] = f"s3://{pc.BUCKET}/{row['format']}"
        spec["boto3"] = row.get("boto3", False)
        spec["as_is"] = row.get("as_is", False)
        spec["cache_limit"] = limit
        if limit and row["reader"] == "mosaicml":
            # MosaicML refuses a cache_limit under four times its largest shard (raw and zip).
            spec["cache_limit"] = max(limit, 4 * (args.shard_mib + 1) * pc.MiB)
    row_env = {**env, "STOKER_CACHE_DIR": str(cache), "LITDATA_CACHE_DIR": str(rdir / "litdata-cache"),
               "XDG_CACHE_HOME": str(rdir / "xdg-cache")}
    print(f"row {row['name']}" + (f" (round {rnd + 1})" if args.rounds > 1 else "") + " ...", flush=True)
    load = os.getloadavg()[0]
    if args.ranks > 1 and row["reader"] == "stoker":
        res = run_ranks(args, spec, row_env, rdir)
    else:
        res = pc.run_row(SCRIPT, spec, row_env, rdir, args.timeout)
    res["load_1m"] = load
    if res.get("order"):
        import numpy as np

        res["mixing"] = pc.mixing(np.load(res["order"]), prep["bounds"][row["format"]], args.batch)
    _print_row(res)
    if not args.keep:
        shutil.rmtree(rdir, ignore_errors=True)
    return res


def run_ranks(args: argparse.Namespace, spec: Dict[str, Any], env: Dict[str, str], rdir: Path) -> Dict[str, Any]:
    """A Stoker row as ``args.ranks`` processes on this node, as torchrun starts them (RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), sharing one disk cache directory and starting
    each epoch together; merged into one row: the node's samples/s (all ranks' samples over
    the span from the first start to the last end), its remote requests and bytes (summed over
    the ranks, from Stoker's counters), exactly once checked over the union of the ranks."""
    import threading

    import numpy as np

    n = args.ranks
    barrier = pc.fresh_dir(rdir, "barrier")
    results: List[Dict[str, Any]] = [{} for _ in range(n)]

    def one(r: int) -> None:
        rank_env = {**env, "RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n)}
        rank_spec = {**spec, "barrier": str(barrier), "rank": r, "world": n}
        results[r] = pc.run_row(SCRIPT, rank_spec, rank_env, pc.fresh_dir(rdir, f"rank-{r}"), args.timeout)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [r for r in results if r.get("error")]
    if failed:
        return failed[0]
    epochs = []
    for e in range(spec["epochs"]):
        per = [r["epochs"][e] for r in results]
        seconds = max(p["t_end"] for p in per) - min(p["t_start"] for p in per)
        samples = sum(p["samples"] for p in per)
        st = [p.get("stoker", {}) for p in per]
        epochs.append({
            "seconds": seconds, "first_batch_s": max(p["first_batch_s"] for p in per), "samples": samples,
            "unique": sum(p["unique"] for p in per), "expected": spec["samples"], "bad": sum(p["bad"] for p in per),
            "samples_per_s": samples / seconds if seconds > 0 else 0.0, "t_start": min(p["t_start"] for p in per),
            "t_end": max(p["t_end"] for p in per),
            "requests": sum(s.get("remote_requests", 0) for s in st), "bytes": sum(s.get("remote_bytes", 0) for s in st),
            "stoker": {k: sum(s.get(k, 0) or 0 for s in st) for k in ("remote_bytes", "disk_writes", "lease_waits")},
            "peak_rss": sum(p.get("peak_rss") or 0 for p in per), "peak_anon": sum(p.get("peak_anon") or 0 for p in per),
        })
    # Exactly once over the node: the union of the ranks' first epochs.
    ids = np.concatenate([np.load(r["order"]) for r in results])
    epochs[0]["unique"] = int(np.unique(ids).size)
    return {"epochs": epochs, "ranks": n, "open_s": max(r.get("open_s", 0) for r in results),
            "peak_rss": sum(r.get("peak_rss") or 0 for r in results),
            "peak_anon": sum(r.get("peak_anon") or 0 for r in results)}


def run(args: argparse.Namespace) -> Dict[str, Any]:
    m = pc.machine()
    work = Path(tempfile.mkdtemp(prefix="stoker-bench-remote-", dir=args.work_dir))
    servers = pc.Servers(work, args.latency_ms, args.link_mib_s).start()
    report: Dict[str, Any] = {"machine": m, "versions": pc.versions(), "args": vars(args), "rows": []}
    try:
        selected = rows(args)
        formats = {r["format"] for r in selected}
        print(f"preparing {args.samples:,} samples of {args.size:,} B ({args.shard_mib} MiB shards) "
              f"as {', '.join(sorted(formats | {'wds'}))} ...", flush=True)
        prep = prepare(args, work, servers, formats)
        report["prepare"] = {k: v for k, v in prep.items() if k not in ("tars",)}
        print(f"  written in {prep['write_s']:.1f} s, uploaded and indexed in {prep['upload_s']:.1f} s", flush=True)
        env = pc.s3_env(servers.through_proxy)
        runs: Dict[str, List[Dict[str, Any]]] = {r["name"]: [] for r in selected}
        for rnd in range(args.rounds):
            # Every other round runs the rows in reverse, so a drift in the machine's load does
            # not always fall on the same rows.
            for row in selected if rnd % 2 == 0 else selected[::-1]:
                runs[row["name"]].append(run_one(args, row, work, servers, env, prep, rnd))
        for row in selected:
            res = pc.aggregate(runs[row["name"]])
            res.update({k: row[k] for k in ("name", "label", "format")})
            res["peer"] = row.get("peer", False)
            report["rows"].append(res)
        # webdataset's buffer shuffle over the same shards, read locally: its order only.
        rdir = pc.fresh_dir(work, "row-webdataset")
        spec = {"reader": "webdataset", "samples": args.samples, "size": args.size, "batch": args.batch,
                "workers": args.workers, "epochs": 1, "urls": prep["tars"]}
        print("mixing pass: webdataset .shuffle(1000) ...", flush=True)
        res = pc.run_row(SCRIPT, spec, {}, rdir, args.timeout)
        res.update({"name": "webdataset", "label": "webdataset 1.0.2 `WebDataset(shardshuffle=100).shuffle(1000)`",
                    "format": "wds"})
        if res.get("order"):
            import numpy as np

            res["mixing"] = pc.mixing(np.load(res["order"]), prep["bounds"]["wds"], args.batch)
        report["mixing_only"] = [res]
        if not args.keep:
            shutil.rmtree(rdir, ignore_errors=True)
    finally:
        servers.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    m["load_end"] = os.getloadavg()
    return report


def _print_row(res: Dict[str, Any]) -> None:
    if res.get("error"):
        print(f"  FAILED: {res['error']}", flush=True)
        return
    for i, e in enumerate(res["epochs"], 1):
        print(f"  epoch {i}: {e['samples_per_s']:,.0f} samples/s ({e['samples']:,} samples, {e['unique']:,} unique,"
              f" {e['bad']} bad), {e.get('requests', 0):,} requests, {e.get('bytes', 0) / pc.MiB:,.0f} MiB"
              f"{'; stoker ' + json.dumps(e['stoker']) if 'stoker' in e else ''}", flush=True)


def render(report: Dict[str, Any]) -> str:
    a = report["args"]
    prep = report.get("prepare", {})
    out = [f"Remote epochs: {a['samples']:,} samples x {a['size']:,} B, {a['shard_mib']} MiB shards "
           f"({prep.get('per_shard', '?')} samples per tar shard), embedded S3 server (s3s-fs) + proxy adding "
           f"{a['latency_ms']} ms to every request"
           + (f" and carrying every body over one link of {a['link_mib_s']:,} MiB/s" if a.get("link_mib_s") else "")
           + f", batch {a['batch']}, peers through a DataLoader with "
           f"{a['workers']} workers; {a.get('epochs', 2)} shuffled epochs per row, each row a fresh process with cold "
           "caches" + (f", every reader's cache limited to {a['cache_fraction']:.0%} of the data"
                       if a.get("cache_fraction") else "")
           + (f"; each Stoker row is {a['ranks']} rank processes sharing one disk cache, epochs started "
              "together, samples/s for the node" if a.get("ranks", 1) > 1 else "")
           + (f"; medians of {a['rounds']} rounds (range)." if a["rounds"] > 1 else ".")
           + " `load 1m`: the machine's 1-minute load average when the row started.", ""]
    epochs = a.get("epochs", 2)
    bound = _bound(report)
    header = ["reader"] + [f"epoch {k} samples/s (x bound)" for k in range(1, epochs + 1)] + [
        "e1 first batch s", "e1 requests", "e1 MiB", "later requests", "later MiB", "peak RSS MiB",
        "peak anon RSS MiB", "load 1m", "exactly once, right bytes"]
    body = []
    for r in report["rows"]:
        if r.get("error"):
            body.append([r["label"]] + ["failed"] * epochs + ["", "", "", "", "", "", "",
                                                               f"{r.get('load_1m', 0):.1f}", pc.row_notes(r) or r["error"]])
            continue
        eps = (r["epochs"] + [{}] * epochs)[:epochs]
        cells = []
        for k, e in enumerate(eps):
            b = bound[k] if bound and k < len(bound) else None
            cells.append(f"{pc.rate_cell(e)} ({e['samples_per_s'] / b:.2f}x)" if e and b else pc.rate_cell(e) if e
                         else "")
        e1, later = eps[0], [e for e in eps[1:] if e]
        body.append([r["label"]] + cells + [
            f"{e1.get('first_batch_s', 0):.2f}", pc.fmt_int(e1.get("requests")), pc.fmt_mib(e1.get("bytes")),
            pc.fmt_int(sum(e.get("requests", 0) for e in later) if later else None),
            pc.fmt_mib(sum(e.get("bytes", 0) for e in later) if later else None), fmt(r.get("peak_rss")),
            fmt(r.get("peak_anon")), f"{r.get('load_1m', 0):.1f}", pc.row_notes(r) or "yes",
        ])
    out.append(pc.table(header, body))
    out.append("")
    out += ratios(report)
    out.append("")
    out.append("Mixing (epoch 1 delivery order; d = |pos(i+1) - pos(i)| in storage order; a uniform shuffle of "
               f"N samples gives median d ~ 0.29 N = {0.29 * a['samples']:,.0f}):")
    out.append("")
    header = ["reader", "median d", "p10 d", "p90 d", "adjacent (d<=1)", "same shard", "shards per batch",
              "samples per shard (mean)"]
    body = []
    mixed = [r for r in report["rows"] if r["name"] in ("stoker-shards", "stoker-global", "mosaicml", "litdata")]
    for r in mixed + report.get("mixing_only", []):
        mx = r.get("mixing")
        if not mx:
            body.append([r["label"], "failed" if r.get("error") else "no order", "", "", "", "", "",
                         r.get("error", "")])
            continue
        body.append([r["label"], pc.fmt_int(mx["median"]), pc.fmt_int(mx["p10"]), pc.fmt_int(mx["p90"]),
                     f"{mx['adjacent']:.1%}", f"{mx['same_shard']:.1%}", f"{mx['shards_per_batch']:.1f}",
                     pc.fmt_int(mx["samples_per_shard"])])
    out.append(pc.table(header, body))
    out.append("")
    out.append(pc.machine_line(report["machine"]))
    v = report["versions"]
    out.append("versions: " + ", ".join(f"{k} {x}" for k, x in v.items()))
    return "\n".join(out)


def fmt(b: Optional[int]) -> str:
    return "" if not b else f"{b / pc.MiB:,.0f}"


def _bound(report: Dict[str, Any]) -> Optional[List[float]]:
    """The bound row's samples/s per epoch, when it ran."""
    b = next((r for r in report["rows"] if r["name"] == "bound" and not r.get("error")), None)
    return [e["samples_per_s"] for e in b["epochs"]] if b else None


def ratios(report: Dict[str, Any]) -> List[str]:
    epochs = report["args"].get("epochs", 2)
    small = bool(report["args"].get("cache_fraction"))
    ok = {r["name"]: r for r in report["rows"] if not r.get("error") and len(r["epochs"]) == epochs}
    peers = [r for r in ok.values() if r.get("peer")]
    bound = _bound(report)
    lines = []
    for e in range(epochs):
        if bound:
            goal = 0.7 if small else 0.8
            for name in ("stoker-shards", "stoker-shards-disk", "stoker-global"):
                if name in ok:
                    s = ok[name]["epochs"][e]["samples_per_s"]
                    lines.append(f"- {ok[name]['label']} epoch {e + 1} / bound epoch {e + 1} ({bound[e]:,.0f}/s): "
                                 f"**{s / bound[e]:.2f}x**" + (f" (goal >= {goal}x)" if e == 0 or small else ""))
        if not peers:
            continue
        goal = 1.5 if e == 0 or small else 1.2
        best = max(peers, key=lambda r: r["epochs"][e]["samples_per_s"])
        bv = best["epochs"][e]["samples_per_s"]
        for name in ("stoker-shards", "stoker-shards-disk"):
            if name in ok:
                s = ok[name]["epochs"][e]["samples_per_s"]
                lines.append(f"- {ok[name]['label']} epoch {e + 1} / best peer epoch {e + 1} ({best['label']}, "
                             f"{bv:,.0f}/s): **{s / bv:.2f}x** (goal >= {goal}x)")
    ranks = report["args"].get("ranks", 1)
    if ranks > 1:
        # The bytes stored: the tar shards as uploaded (samples, headers, padding).
        data = report.get("prepare", {}).get("uploaded", {}).get("wds", [0, 0])[1] or (
            report["args"]["samples"] * report["args"]["size"])
        for name, r in ok.items():
            if name.startswith("stoker") and r.get("ranks"):
                shares = ", ".join(f"epoch {k + 1} {e.get('bytes', 0) / data:.2f}x" for k, e in enumerate(r["epochs"]))
                lines.append(f"- {r['label']}, {ranks} ranks sharing the node's disk cache: remote bytes over the "
                             f"tar shards' size: {shares} (goal <= 1.1x with the cache on)")
    if not peers:
        lines.append("ratios: no peer row finished")
    # The row whose requests are one a sample (no block cache): what the in-flight bound is about.
    g = ok.get("stoker-global-nocache")
    if g:
        lat = report["args"]["latency_ms"] / 1000
        e1 = g["epochs"][0]
        req_s = e1["requests"] / e1["seconds"] if e1.get("requests") else 0
        inflight = 64 / lat
        lines.append(f"- Stoker `shuffle=True`, `disk_cache=False` epoch 1: {e1['samples_per_s']:,.0f} samples/s, {req_s:,.0f} requests/s "
                     f"against the in-flight bound max_in_flight / latency = 64 / {lat * 1000:.0f} ms = "
                     f"{inflight:,.0f}/s (**{e1['samples_per_s'] / inflight:.2f}x** in samples)")
    return lines


def _not_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (no limit) or more, got {value}")
    return value


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=64 << 10, help="bytes per sample (default 65536)")
    ap.add_argument("--latency-ms", type=int, default=25, help="added by the proxy to every request")
    ap.add_argument("--link-mib-s", type=_not_negative, default=0,
                    help="the proxy carries every forwarded response body over one link of this many MiB/s (default 0: "
                         "no limit, the bound is then what the cores allow the server, proxy and reader together)")
    ap.add_argument("--shard-mib", type=int, default=64,
                    help="shard size for every format (MDS size_limit, LitData chunk_bytes, tar shard)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2, help="shuffled epochs per row (default 2)")
    ap.add_argument("--cache-fraction", type=float, default=0.0,
                    help="every reader's cache holds this share of the data (Stoker disk_cache_bytes, MosaicML "
                         "cache_limit, LitData max_cache_size); 0: Stoker's holds it all, the peers' defaults")
    ap.add_argument("--ranks", type=int, default=1,
                    help="run each Stoker row as this many rank processes on this node sharing one disk cache "
                         "(RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE set as torchrun does)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="DataLoader workers for the peers")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 512 samples in 4 MiB shards")
    ap.add_argument("--rows", help="comma-separated rows to run (names as in --json; `mosaicml-as-is` only when named)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every row this many times (every other round in reverse order); medians reported")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per row")
    ap.add_argument("--json", help="also write the full report here")
    ap.add_argument("--work-dir", help="where the temporary data goes (default: the system temp dir)")
    ap.add_argument("--perf", help="record a system-wide perf profile of each row's epoch 1 into this directory")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if args.quick:
        args.samples, args.shard_mib = 512, 4
    if args.size < 16:
        ap.error("--size must be at least 16 bytes (the id is in the first 8)")
    if args.epochs < 1 or not 0.0 <= args.cache_fraction <= 4.0:
        ap.error("--epochs must be at least 1 and --cache-fraction within 0..4")
    report = run(args)
    text = render(report)
    print()
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
