"""What the side-by-side peer benchmarks (bench_remote.py, bench_mix.py) share: the embedded S3
server behind the latency proxy, the samples and each peer's writer, one child process per row
with its memory watched from outside, and the machine line.

Every sample is ``size`` random bytes whose first 8 bytes are its id (little-endian int64), with
the label ``id % 1000``; every reader gets the id back from the bytes, so each row checks that
it delivered every sample exactly once with the right payload.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"
AK, SK, REGION, BUCKET = "bench", "bench-secret", "us-east-1", "data"
LABELS = 1000
MiB = 1 << 20


# --- Samples and writers ---------------------------------------------------------------------


def payload(i: int, size: int) -> bytes:
    """Sample ``i``: its id in the first 8 bytes, then random bytes fixed by ``i``."""
    import numpy as np

    return i.to_bytes(8, "little") + np.random.default_rng(i).bytes(size - 8)


def label(i: int) -> int:
    return i % LABELS


def write_tar(out: Path, ids: Sequence[int], size: int, per_shard: int) -> List[Path]:
    """WebDataset shards written by ``webdataset.TarWriter``: ``%08d.bin`` + ``%08d.cls``."""
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    shards = []
    for s in range(0, len(ids), per_shard):
        path = out / f"shard-{s // per_shard:06d}.tar"
        with wds.TarWriter(str(path)) as w:
            for i in ids[s : s + per_shard]:
                w.write({"__key__": f"{i:08d}", "bin": payload(i, size), "cls": str(label(i)).encode()})
        shards.append(path)
    return shards


def write_mds(out: Path, ids: Sequence[int], size: int, shard_bytes: int) -> None:
    """MosaicML Streaming's own writer, ``MDSWriter``, uncompressed."""
    from streaming import MDSWriter

    columns = {"id": "int", "label": "int", "data": "bytes"}
    with MDSWriter(out=str(out), columns=columns, size_limit=shard_bytes) as w:
        for i in ids:
            w.write({"id": i, "label": label(i), "data": payload(i, size)})


def _litdata_item(arg: Tuple[int, int]) -> Dict[str, Any]:
    i, size = arg
    return {"id": i, "label": label(i), "data": payload(i, size)}


def write_litdata(out: Path, ids: Sequence[int], size: int, shard_bytes: int) -> None:
    """LitData's own writer, ``litdata.optimize``; one worker, so chunks hold the ids in order."""
    import litdata

    litdata.optimize(
        fn=_litdata_item,
        inputs=[(i, size) for i in ids],
        output_dir=str(out),
        chunk_bytes=shard_bytes,
        num_workers=1,
        mode="overwrite",
    )


def shard_bounds_mds(local: Path) -> List[int]:
    """First sample id of each MDS shard, and the total (from its index.json)."""
    index = json.loads((local / "index.json").read_text())
    return _cumulative([s["samples"] for s in index["shards"]])


def shard_bounds_litdata(local: Path) -> List[int]:
    index = json.loads((local / "index.json").read_text())
    return _cumulative([c["chunk_size"] for c in index["chunks"]])


def _cumulative(counts: Sequence[int]) -> List[int]:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def litdata_s3_path(boto3: bool) -> None:
    """Pick LitData's S3 client before any dataset is made (DataLoader workers fork with it).

    LitData 0.2.76 fetches chunks with obstore when it is installed, else with boto3. Its obstore
    store is built with fixed client options that lack ``allow_http`` (so ``AWS_ALLOW_HTTP``
    is not read), and a plain-HTTP endpoint such as the embedded server fails with "BadScheme";
    real S3 is HTTPS. ``boto3=False`` adds ``allow_http`` to those options (the default path,
    as it runs against real S3); ``boto3=True`` hides obstore, so chunks come through boto3.
    """
    import litdata.streaming.downloader as downloader

    if boto3:
        downloader._OBSTORE_AVAILABLE = False  # type: ignore[attr-defined]
    else:
        opts = dict(downloader._OBSTORE_CLIENT_OPTIONS)  # type: ignore[attr-defined]
        downloader._OBSTORE_CLIENT_OPTIONS = {**opts, "allow_http": True}  # type: ignore[attr-defined]


def check_litdata_order(local: Path, probes: Sequence[int]) -> None:
    """LitData's storage order must be the id order (the mixing metrics read positions as ids)."""
    from litdata import StreamingDataset

    ds = StreamingDataset(str(local), shuffle=False)
    for j in probes:
        got = int(ds[j]["id"])
        if got != j:
            raise RuntimeError(f"litdata.optimize stored sample {got} at position {j}: order assumption broken")


# --- Servers -----------------------------------------------------------------------------------


def _binary(name: str) -> Path:
    path = RELEASE / name
    if not path.is_file():
        sys.exit(f"{path} not found: run `bash integration/peers_setup.sh` (it builds the release binaries)")
    return path


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the benchmark dies, however it dies (Linux)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _start_announcing(cmd: List[str], log: Path) -> Tuple[subprocess.Popen, str]:
    """Start a server that prints ``listening on ADDR`` once bound; return it and ADDR."""
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=_die_with_parent)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"{cmd[0]} did not start: {line!r}; log:\n{log.read_text()}")
    return proc, line.split()[-1]


@dataclass
class Servers:
    """The embedded S3 server (s3s-fs, bodies in 1 MiB reads) and the fault proxy in front of it
    adding ``latency_ms`` to every request and, with ``link_mib_s``, carrying every response
    body over one shared link of that rate. Uploads go to the server directly; readers go
    through the proxy."""

    root: Path
    latency_ms: int
    link_mib_s: int = 0
    server: Optional[subprocess.Popen] = None
    proxy: Optional[subprocess.Popen] = None
    server_addr: str = ""
    proxy_addr: str = ""

    def start(self) -> "Servers":
        data = self.root / "s3"
        data.mkdir(parents=True, exist_ok=True)
        self.server, self.server_addr = _start_announcing(
            [str(_binary("s3_server")), "--root", str(data), "--access-key", AK, "--secret-key", SK,
             "--region", REGION, "--bucket", BUCKET],
            self.root / "s3_server.log",
        )
        self.proxy, self.proxy_addr = _start_announcing(
            [str(_binary("fault_proxy")), "--upstream", self.server_addr, "--latency-ms", str(self.latency_ms),
             "--link-mib-s", str(self.link_mib_s)],
            self.root / "fault_proxy.log",
        )
        return self

    def stop(self) -> None:
        for proc in (self.proxy, self.server):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    @property
    def direct(self) -> str:
        return f"http://{self.server_addr}"

    @property
    def through_proxy(self) -> str:
        return f"http://{self.proxy_addr}"

    def meter(self) -> "ProxyMeter":
        assert self.proxy is not None
        return ProxyMeter(self.proxy_addr, self.proxy.pid)


def s3_env(endpoint: str) -> Dict[str, str]:
    """Credentials, region and endpoint the way each reader documents them: boto3 and Stoker read
    ``AWS_ENDPOINT_URL``, MosaicML Streaming ``S3_ENDPOINT_URL``; ``AWS_ALLOW_HTTP`` lets
    object_store-based clients (Stoker, LitData's obstore path) use a plain-HTTP endpoint."""
    return {
        "AWS_ACCESS_KEY_ID": AK,
        "AWS_SECRET_ACCESS_KEY": SK,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL": endpoint,
        "S3_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
    }


def upload_dir(endpoint: str, local: Path, prefix: str) -> Tuple[int, int]:
    """Every file under ``local`` to ``s3://data/prefix/`` through the S3 API (so the server
    records ETags instead of hashing objects on every GET). Returns (objects, bytes)."""
    import boto3
    from concurrent.futures import ThreadPoolExecutor

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=AK, aws_secret_access_key=SK,
                      region_name=REGION)
    files = sorted(p for p in local.rglob("*") if p.is_file())

    def put(p: Path) -> int:
        body = p.read_bytes()
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{p.relative_to(local).as_posix()}", Body=body)
        return len(body)

    with ThreadPoolExecutor(4) as pool:
        sizes = list(pool.map(put, files))
    return len(files), sum(sizes)


def stoker_index(uri: str, env: Dict[str, str]) -> None:
    """``stoker index``: tar sidecar indexes and the manifest, as a user prepares a dataset."""
    run = subprocess.run([str(_binary("stoker")), "index", uri], env={**os.environ, **env},
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"stoker index {uri} failed:\n{run.stdout}\n{run.stderr}")


@dataclass
class ProxyMeter:
    """Requests (the proxy's counter) and bytes sent to clients (the proxy process's ``wchar``:
    every response, headers and bodies, plus the small requests it forwards upstream)."""

    addr: str
    pid: int

    def snapshot(self) -> Dict[str, int]:
        with urllib.request.urlopen(f"http://{self.addr}/__proxy/stats", timeout=10) as r:
            stats = json.load(r)
        io = dict(line.split(": ") for line in Path(f"/proc/{self.pid}/io").read_text().splitlines() if line)
        return {"requests": int(stats["requests"]), "bytes": int(io["wchar"])}


def delta(a: Dict[str, int], b: Dict[str, int]) -> Dict[str, int]:
    return {k: b[k] - a[k] for k in a}


# --- Rows: one child process each --------------------------------------------------------------


def _tree(pid: int) -> List[int]:
    """``pid`` and its descendants, from ``/proc/PID/task/TID/children`` (cheap: no scan of
    every process, so it can run 10 times a second)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass  # gone meanwhile
    return out


def _statm(pid: int) -> Tuple[int, int]:
    """(RSS, RSS less file-backed and shared-memory pages) of one process, in bytes."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            fields = f.read().split()
    except OSError:
        return 0, 0
    page = os.sysconf("SC_PAGE_SIZE")
    rss, shared = int(fields[1]) * page, int(fields[2]) * page
    return rss, rss - shared


@dataclass
class MemoryWatch:
    """Samples the process tree of ``pid`` from outside (the measured process runs no extra
    thread), 10 times a second: the sum of RSS, and the sum of anonymous RSS (RSS less file-backed
    and shared-memory pages, so the libraries forked workers map, torch's among them, are not
    counted once per worker). Only cheap reads (``/proc/PID/statm``, ``.../children``) are made.
    PSS would be fairer still, but reading it walks the page tables under the process's mmap
    lock: ~20 ms a read here, enough to slow what is measured."""

    pid: int
    samples: List[Tuple[float, int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None

    def start(self) -> "MemoryWatch":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = anon = 0
            for p in _tree(self.pid):
                r, a = _statm(p)
                rss += r
                anon += a
            self.samples.append((time.time(), rss, anon))
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def peak(self, start: float = 0.0, end: float = float("inf")) -> Tuple[int, int]:
        inside = [(r, a) for t, r, a in self.samples if start <= t <= end] or [(0, 0)]
        return max(r for r, _ in inside), max(a for _, a in inside)


def run_row(script: Path, spec: Dict[str, Any], env: Dict[str, str], work: Path, timeout: float) -> Dict[str, Any]:
    """Run one row as ``python script --child SPEC`` in a fresh process; the child writes its
    result as JSON to ``spec["result"]``. Failures come back as ``{"error": reason}``."""
    result_path = work / "result.json"
    spec = {**spec, "result": str(result_path), "work": str(work)}
    log = work / "child.log"
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(script), "--child", json.dumps(spec)],
                                env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, cwd=str(work))
        watch = MemoryWatch(proc.pid).start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
        finally:
            watch.stop()
    text = log.read_text(errors="replace")
    if rc != 0 or not result_path.exists():
        why = "timed out after %.0f s" % timeout if rc is None else f"exit {rc}"
        return {"error": f"{why}: {_last_error(text)}", "log_tail": text[-4000:], "wall_s": time.time() - t0}
    result = json.loads(result_path.read_text())
    result["peak_rss"], result["peak_anon"] = watch.peak()
    for e in result.get("epochs", []):
        e["peak_rss"], e["peak_anon"] = watch.peak(e["t_start"], e["t_end"])
    result["wall_s"] = time.time() - t0
    if result.get("error"):
        result["log_tail"] = text[-4000:]
    return result


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln or "Exception" in ln:
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


def fresh_dir(parent: Path, name: str) -> Path:
    path = parent / name
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


# --- The consumer loop a child runs --------------------------------------------------------------


@dataclass
class Epoch:
    """One epoch as the consumer saw it."""

    seconds: float
    first_batch_s: float
    ids: Any  # numpy int64, delivery order
    bad: int  # samples whose payload did not match their id or label
    t_start: float
    t_end: float


def consume(batches: Iterator[Any], unpack: Callable[[Any], Tuple[Any, Any, Any]]) -> Epoch:
    """Drain one epoch. ``unpack(batch)`` gives (ids from the payload bytes, ids as the reader
    labelled them, labels), all int64 tensors; mismatches are counted, never ignored."""
    import numpy as np

    t_start = time.time()
    t0 = time.perf_counter()
    first = None
    parts = []
    bad = 0
    for batch in batches:
        if first is None:
            first = time.perf_counter() - t0
        from_bytes, claimed, labels = unpack(batch)
        bad += int((from_bytes != claimed).sum()) + int((labels != from_bytes % LABELS).sum())
        parts.append(from_bytes.numpy().copy())
    seconds = time.perf_counter() - t0
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return Epoch(seconds, first or 0.0, ids, bad, t_start, time.time())


def ids_from_rows(data: Any) -> Any:
    """The id in the first 8 bytes of each row of a ``[B, size]`` uint8 tensor."""
    return data[:, :8].contiguous().view(-1).view(__import__("torch").int64)


def collate_samples(items: List[Dict[str, Any]]) -> Dict[str, Any]:
    """A DataLoader collate for the peers' dict samples: one ``[B, size]`` uint8 tensor (the
    batch a training step takes), ids and labels. LitData hands ``bytes`` fields over as
    memoryviews; ``np.frombuffer`` takes both."""
    import numpy as np
    import torch

    size = len(items[0]["data"])
    data = np.empty((len(items), size), dtype=np.uint8)
    for j, it in enumerate(items):
        data[j] = np.frombuffer(it["data"], dtype=np.uint8)
    return {
        "data": torch.from_numpy(data),
        "id": torch.tensor([int(it["id"]) for it in items], dtype=torch.int64),
        "label": torch.tensor([int(it["label"]) for it in items], dtype=torch.int64),
    }


def unpack_peer(batch: Dict[str, Any]) -> Tuple[Any, Any, Any]:
    return ids_from_rows(batch["data"]), batch["id"], batch["label"]


def unpack_stoker(size: int) -> Callable[[Dict[str, Any]], Tuple[Any, Any, Any]]:
    import torch

    def unpack(batch: Dict[str, Any]) -> Tuple[Any, Any, Any]:
        data, offsets = batch["bin"]  # every value is `size` bytes: one [B, size] view, no copy
        rows = data.view(-1, size)
        claimed = torch.tensor([int(k.rsplit("/", 1)[-1]) for k in batch["__key__"]], dtype=torch.int64)
        return ids_from_rows(rows), claimed, batch["cls"]

    return unpack


def epoch_record(e: Epoch, n_expected: Optional[int], io: Optional[Dict[str, int]] = None, **extra: Any) -> Dict[str, Any]:
    import numpy as np

    unique = int(np.unique(e.ids).size)
    rec = {
        "seconds": e.seconds,
        "first_batch_s": e.first_batch_s,
        "samples": int(e.ids.size),
        "unique": unique,
        "expected": n_expected,
        "bad": e.bad,
        "samples_per_s": e.ids.size / e.seconds if e.seconds > 0 else 0.0,
        "t_start": e.t_start,
        "t_end": e.t_end,
    }
    if io is not None:
        rec.update(io)
    rec.update(extra)
    return rec


def aggregate(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One row's result over several rounds: each number the median of the runs that finished,
    with ``samples_per_s`` also as ``[min, max]`` (``range``); runs that failed are listed in
    ``failed_runs``; the first finished run's other fields (its delivery order among them) are
    kept. A row with no finished run is that first failure."""
    import statistics

    done = [r for r in runs if not r.get("error")]
    failed = [r["error"] for r in runs if r.get("error")]
    if not done:
        return {**runs[0], "failed_runs": failed, "rounds": len(runs)}
    out = dict(done[0])
    n_epochs = min(len(r["epochs"]) for r in done)
    epochs = []
    for k in range(n_epochs):
        e = dict(done[0]["epochs"][k])
        for key, value in e.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                e[key] = statistics.median(r["epochs"][k][key] for r in done)
        rates = [r["epochs"][k]["samples_per_s"] for r in done]
        e["range"] = [min(rates), max(rates)]
        e["issues"] = sorted({note for r in done for note in _epoch_issues(r["epochs"][k])})
        epochs.append(e)
    out["epochs"] = epochs
    for key in ("peak_rss", "peak_anon", "load_1m", "open_s"):
        values = [r[key] for r in done if r.get(key) is not None]
        if values:
            out[key] = statistics.median(values)
    out["failed_runs"] = failed
    out["rounds"] = len(runs)
    return out


def _epoch_issues(e: Dict[str, Any]) -> List[str]:
    notes = []
    if e.get("bad"):
        notes.append(f"{e['bad']} bad payloads")
    if e.get("unique") != e.get("samples"):
        notes.append(f"{e['samples'] - e['unique']:,} repeated")
    if e.get("expected") is not None and e.get("unique") != e.get("expected"):
        notes.append(f"{e['unique']:,} distinct of {e['expected']:,}")
    return notes


def rate_cell(e: Dict[str, Any]) -> str:
    """samples/s, with the range over rounds when there were several."""
    lo, hi = e.get("range", [None, None])
    if lo is None or lo == hi:
        return fmt_int(e["samples_per_s"])
    return f"{e['samples_per_s']:,.0f} ({lo:,.0f}–{hi:,.0f})"


def row_notes(r: Dict[str, Any]) -> str:
    """Exactly-once and payload problems of any epoch, and failed rounds."""
    notes = []
    for k, e in enumerate(r.get("epochs", []), 1):
        notes += [f"e{k}: {n}" for n in e.get("issues", _epoch_issues(e))]
    if r.get("failed_runs"):
        notes.append(f"{len(r['failed_runs'])} of {r.get('rounds', '?')} runs failed: {r['failed_runs'][0]}")
    return "; ".join(notes)


# --- Mixing ---------------------------------------------------------------------------------------


def mixing(ids: Any, bounds: Sequence[int], batch: int) -> Dict[str, Any]:
    """How far apart, in storage order, consecutive samples of an epoch are: |pos(i+1) - pos(i)|
    (median, p10, p90), the share of adjacent pairs (|d| <= 1), the share of pairs from the same
    shard, and the distinct shards per batch. ``bounds``: each shard's first position, then the
    total."""
    import numpy as np

    ids = np.asarray(ids, dtype=np.int64)
    if ids.size < 2:
        return {}
    d = np.abs(np.diff(ids))
    shard = np.searchsorted(np.asarray(bounds), ids, side="right") - 1
    per_batch = [np.unique(shard[s : s + batch]).size for s in range(0, ids.size, batch)]
    return {
        "median": float(np.median(d)),
        "p10": float(np.percentile(d, 10)),
        "p90": float(np.percentile(d, 90)),
        "adjacent": float(np.mean(d <= 1)),
        "same_shard": float(np.mean(shard[1:] == shard[:-1])),
        "shards_per_batch": float(np.mean(per_batch)),
        "samples_per_shard": float(np.mean(np.diff(bounds))),
        "shards": len(bounds) - 1,
    }


# --- Reporting ------------------------------------------------------------------------------------


def machine() -> Dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"cores": os.cpu_count(), "cpu": model or platform.processor(), "mem_gib": mem / (1 << 30),
            "python": platform.python_version(), "load_start": os.getloadavg()}


def versions() -> Dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name in ("stoker", "torch", "mosaicml-streaming", "litdata", "webdataset", "obstore", "boto3"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "missing"
    return out


def machine_line(m: Dict[str, Any]) -> str:
    ls, le = m["load_start"], m.get("load_end", (0, 0, 0))
    return (f"machine: {m['cores']} cores ({m['cpu']}), {m['mem_gib']:.0f} GiB, Python {m['python']}; "
            f"load average {ls[0]:.2f}/{ls[1]:.2f}/{ls[2]:.2f} at start, {le[0]:.2f}/{le[1]:.2f}/{le[2]:.2f} at end")


def fmt_int(x: Optional[float]) -> str:
    return "" if x is None else f"{x:,.0f}"


def fmt_mib(b: Optional[float]) -> str:
    return "" if b is None else f"{b / MiB:,.0f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
