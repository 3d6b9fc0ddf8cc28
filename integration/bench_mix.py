#!/usr/bin/env python3
"""A 50/50 mix of a local source and a remote one (issue 15): ``stoker.mix`` through
``stoker.Loader`` against LitData's ``CombinedStreamingDataset`` on the same samples and weights,
each against its own sources read alone in the same run.

    bash integration/peers_setup.sh
    .venv-peers/bin/python integration/bench_mix.py [--samples 10000 --size 65536 --latency-ms 25] [--quick] [--json out.json]

``--samples`` per source. The local source holds ids [0, N) on the local disk, the remote one ids
[N, 2N) on the embedded S3 server (s3s-fs) behind the fault proxy adding ``--latency-ms`` to every
request: for Stoker as WebDataset tar shards (``webdataset.TarWriter``, indexed by ``stoker index``),
for LitData as ``litdata.optimize`` chunks, the same shard size. Stoker reads with
``shuffle=True`` (a mix interleaves sources sample by sample; the shard shuffle does not apply to
it), LitData with ``shuffle=True`` through ``StreamingDataLoader`` with one worker per core. Each
row runs two epochs in its own process with fresh caches. A mix should run as fast as its
slowest source's share allows: the table gives each mix's ratio to min(local / 0.5, remote / 0.5)
of the same reader (issue 15's target for Stoker: >= 0.8), and the realised share of each source.
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


# --- Child side: one row -------------------------------------------------------------------------


def child(spec: Dict[str, Any]) -> None:
    result: Dict[str, Any] = {"epochs": []}
    try:
        {"stoker": child_stoker, "litdata": child_litdata}[spec["reader"]](spec, result)
    except BaseException as e:  # reported in the table, never dropped
        import traceback

        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
    Path(spec["result"]).write_text(json.dumps(result))


def _epochs(spec: Dict[str, Any], result: Dict[str, Any], make_iter: Any, unpack: Any,
            stats: Optional[Any] = None) -> None:
    import numpy as np

    meter = pc.ProxyMeter(spec["proxy_addr"], spec["proxy_pid"])
    n = spec["samples"]
    for e in range(spec["epochs"]):
        before = meter.snapshot()
        ep = pc.consume(make_iter(), unpack)
        io = pc.delta(before, meter.snapshot())
        local = int((ep.ids < n).sum())
        extra: Dict[str, Any] = {"local": local, "remote": int(ep.ids.size) - local}
        if stats:
            extra["sources"] = stats().get("sources")
        result["epochs"].append(pc.epoch_record(ep, spec.get("expected"), io, **extra))
        if e == 0:
            np.save(Path(spec["work"]) / "order.npy", ep.ids)


def child_stoker(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    import stoker

    t0 = time.perf_counter()
    src: Any = stoker.mix(spec["mix"]) if spec.get("mix") else spec["uri"]
    loader = stoker.Loader(src, batch_size=spec["batch"], shuffle=True, seed=0, decode={"cls": stoker.Int()})
    result["open_s"] = time.perf_counter() - t0
    _epochs(spec, result, lambda: iter(loader), pc.unpack_stoker(spec["size"]),
            stats=loader.stats if spec.get("mix") else None)


def child_litdata(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    pc.litdata_s3_path(boto3=spec.get("boto3", False))
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset

    t0 = time.perf_counter()
    work = Path(spec["work"])
    datasets = [StreamingDataset(uri, shuffle=True, seed=1, cache_dir=str(work / f"litdata-cache-{k}"))
                for k, uri in enumerate(spec["uris"])]
    if len(datasets) == 1:
        ds: Any = datasets[0]
    else:
        # With weights LitData stops at the first exhausted source (iterate_over_all must be False).
        ds = CombinedStreamingDataset(datasets, seed=1, weights=spec["weights"], iterate_over_all=False)
    dl = StreamingDataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"], collate_fn=pc.collate_samples)
    result["open_s"] = time.perf_counter() - t0
    _epochs(spec, result, lambda: iter(dl), pc.unpack_peer)


# --- Parent side ------------------------------------------------------------------------------------


def prepare(args: argparse.Namespace, work: Path, servers: pc.Servers) -> Dict[str, Any]:
    n = args.samples
    shard_bytes = args.shard_mib * pc.MiB
    per_shard = max(1, shard_bytes // args.size)
    local, staged = work / "local", work / "staged"
    t0 = time.perf_counter()
    pc.write_tar(local / "wds", range(0, n), args.size, per_shard)
    pc.write_litdata(local / "litdata", range(0, n), args.size, shard_bytes)
    pc.write_tar(staged / "wds", range(n, 2 * n), args.size, per_shard)
    pc.write_litdata(staged / "litdata", range(n, 2 * n), args.size, shard_bytes)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for fmt in ("wds", "litdata"):
        pc.upload_dir(servers.direct, staged / fmt, f"{fmt}-remote")
    pc.stoker_index(f"s3://{pc.BUCKET}/wds-remote", pc.s3_env(servers.direct))
    pc.stoker_index(str(local / "wds"), {})
    shutil.rmtree(staged)
    return {"write_s": write_s, "upload_s": time.perf_counter() - t0, "per_shard": per_shard,
            "local_wds": str(local / "wds"), "local_litdata": str(local / "litdata")}


ROWS = ["stoker-local", "stoker-remote", "stoker-mix", "litdata-local", "litdata-remote", "litdata-combined"]


def run_one(args: argparse.Namespace, name: str, spec: Dict[str, Any], work: Path, env: Dict[str, str],
            rnd: int) -> Dict[str, Any]:
    """One row, once, in a fresh process with fresh cache directories."""
    rdir = pc.fresh_dir(work, f"row-{name}-{rnd}")
    row_env = {**env, "STOKER_CACHE_DIR": str(rdir / "stoker-cache"),
               "LITDATA_CACHE_DIR": str(rdir / "litdata-cache"), "XDG_CACHE_HOME": str(rdir / "xdg-cache")}
    print(f"row {name}" + (f" (round {rnd + 1})" if args.rounds > 1 else "") + " ...", flush=True)
    load = os.getloadavg()[0]
    res = pc.run_row(SCRIPT, spec, row_env, rdir, args.timeout)
    res["load_1m"] = load
    if res.get("error"):
        print(f"  FAILED: {res['error']}", flush=True)
    for i, e in enumerate(res.get("epochs", []), 1):
        print(f"  epoch {i}: {e['samples_per_s']:,.0f} samples/s ({e['samples']:,} samples, "
              f"{e['unique']:,} unique, {e['bad']} bad; local {e['local']:,}, remote {e['remote']:,}), "
              f"{e['requests']:,} requests", flush=True)
    if not args.keep:
        shutil.rmtree(rdir, ignore_errors=True)
    return res


def run(args: argparse.Namespace) -> Dict[str, Any]:
    m = pc.machine()
    work = Path(tempfile.mkdtemp(prefix="stoker-bench-mix-", dir=args.work_dir))
    servers = pc.Servers(work, args.latency_ms).start()
    report: Dict[str, Any] = {"machine": m, "versions": pc.versions(), "args": vars(args), "rows": []}
    n = args.samples
    try:
        print(f"preparing 2 x {n:,} samples of {args.size:,} B ({args.shard_mib} MiB shards) ...", flush=True)
        prep = prepare(args, work, servers)
        report["prepare"] = prep
        print(f"  written in {prep['write_s']:.1f} s, uploaded and indexed in {prep['upload_s']:.1f} s", flush=True)
        remote_wds = f"s3://{pc.BUCKET}/wds-remote"
        remote_lit = f"s3://{pc.BUCKET}/litdata-remote"
        specs: Dict[str, Dict[str, Any]] = {
            "stoker-local": {"reader": "stoker", "uri": prep["local_wds"], "expected": n},
            "stoker-remote": {"reader": "stoker", "uri": remote_wds, "expected": n},
            "stoker-mix": {"reader": "stoker", "mix": {prep["local_wds"]: 0.5, remote_wds: 0.5}, "expected": 2 * n},
            "litdata-local": {"reader": "litdata", "uris": [prep["local_litdata"]], "expected": n},
            "litdata-remote": {"reader": "litdata", "uris": [remote_lit], "expected": n, "boto3": args.litdata_boto3},
            "litdata-combined": {"reader": "litdata", "uris": [prep["local_litdata"], remote_lit],
                                 "weights": [0.5, 0.5], "expected": None, "boto3": args.litdata_boto3},
        }
        env = pc.s3_env(servers.through_proxy)
        names = args.rows.split(",") if args.rows else ROWS
        unknown = [x for x in names if x not in specs]
        if unknown:
            sys.exit(f"unknown rows {unknown}; rows: {ROWS}")
        runs: Dict[str, List[Dict[str, Any]]] = {x: [] for x in names}
        for rnd in range(args.rounds):
            # Every other round in reverse, so a drift in the machine's load does not always fall
            # on the same rows.
            for name in names if rnd % 2 == 0 else names[::-1]:
                spec = {**specs[name], "samples": n, "size": args.size, "batch": args.batch,
                        "workers": args.workers, "epochs": 2, "proxy_addr": servers.proxy_addr,
                        "proxy_pid": servers.proxy.pid if servers.proxy else 0}
                runs[name].append(run_one(args, name, spec, work, env, rnd))
        for name in names:
            report["rows"].append({**pc.aggregate(runs[name]), "name": name})
    finally:
        servers.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    m["load_end"] = os.getloadavg()
    return report


def render(report: Dict[str, Any]) -> str:
    a = report["args"]
    rows = {r["name"]: r for r in report["rows"]}
    lit_path = "boto3" if a["litdata_boto3"] else "obstore"
    out = [f"Mix: 50/50 of a local source ({a['samples']:,} samples on disk) and a remote one ({a['samples']:,} "
           f"samples on the embedded S3 server + {a['latency_ms']} ms a request), {a['size']:,} B samples, "
           f"{a['shard_mib']} MiB shards, batch {a['batch']}, shuffle=True; LitData through StreamingDataLoader with "
           f"{a['workers']} workers ({lit_path} for S3). Each row: a fresh process, cold caches, two epochs"
           + (f"; medians of {a['rounds']} rounds (range)." if a["rounds"] > 1 else ".")
           + " `load 1m`: the machine's 1-minute load average when the row started.", ""]
    header = ["reader", "source", "epoch 1 samples/s", "epoch 2 samples/s", "samples / epoch (local + remote)",
              "mix / min(local/0.5, remote/0.5)", "e1 requests", "peak RSS MiB", "load 1m", "notes"]
    body = []
    for reader, label in (("stoker", "Stoker `Loader`"), ("litdata", "LitData 0.2.76")):
        for kind in ("local", "remote", "mix" if reader == "stoker" else "combined"):
            r = rows.get(f"{reader}-{kind}")
            if r is None:
                continue
            what = {"local": "local alone", "remote": "remote alone",
                    "mix": "`stoker.mix({local: 0.5, remote: 0.5})`",
                    "combined": "`CombinedStreamingDataset(weights=[0.5, 0.5])`"}[kind]
            load = f"{r.get('load_1m', 0):.1f}"
            if r.get("error"):
                body.append([label, what, "failed", "failed", "", "", "", "", load, pc.row_notes(r) or r["error"]])
                continue
            e = r["epochs"]
            ratio = []
            if kind in ("mix", "combined"):
                loc, rem = rows.get(f"{reader}-local"), rows.get(f"{reader}-remote")
                for k in range(len(e)):
                    if loc and rem and not loc.get("error") and not rem.get("error"):
                        bound = min(loc["epochs"][k]["samples_per_s"] / 0.5, rem["epochs"][k]["samples_per_s"] / 0.5)
                        ratio.append(f"e{k + 1}: **{e[k]['samples_per_s'] / bound:.2f}x** (bound {bound:,.0f}/s)")
            x = e[0]
            counts = (f"{x['samples']:,.0f} ({x['local']:,.0f} + {x['remote']:,.0f}, "
                      f"{x['local'] / max(x['samples'], 1):.1%} local)" if kind in ("mix", "combined")
                      else f"{x['samples']:,.0f}")
            notes = [pc.row_notes(r)] if pc.row_notes(r) else []
            if kind == "combined":
                notes.append("stops at the first exhausted source (weights need iterate_over_all=False)")
            body.append([label, what, pc.rate_cell(e[0]), pc.rate_cell(e[1]) if len(e) > 1 else "", counts,
                         "; ".join(ratio), pc.fmt_int(e[0].get("requests")),
                         "" if not r.get("peak_rss") else f"{r['peak_rss'] / pc.MiB:,.0f}", load,
                         "; ".join(notes) or "exactly once, right bytes"])
    out.append(pc.table(header, body))
    out.append("")
    out.append(pc.machine_line(report["machine"]))
    out.append("versions: " + ", ".join(f"{k} {x}" for k, x in report["versions"].items()))
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10_000, help="samples per source (default 10000)")
    ap.add_argument("--size", type=int, default=64 << 10, help="bytes per sample (default 65536)")
    ap.add_argument("--latency-ms", type=int, default=25, help="added by the proxy to every request")
    ap.add_argument("--shard-mib", type=int, default=64, help="shard size for both formats")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="DataLoader workers for LitData")
    ap.add_argument("--litdata-boto3", action="store_true", help="LitData's boto3 path instead of obstore for S3")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 256 samples a source in 4 MiB shards")
    ap.add_argument("--rows", help=f"comma-separated subset of {','.join(ROWS)}")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every row this many times (every other round in reverse order); medians reported")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per row")
    ap.add_argument("--json", help="also write the full report here")
    ap.add_argument("--work-dir", help="where the temporary data goes (default: the system temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if args.quick:
        args.samples, args.shard_mib = 256, 4
    report = run(args)
    print()
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
