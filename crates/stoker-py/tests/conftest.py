"""Fixtures: the same samples as files, WebDataset tar shards, an LMDB written by py-lmdb,
and (through the embedded S3 server) an S3 bucket."""

import atexit
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from typing import Dict, Tuple

import pytest

# Remote sources cache blocks on disk by default, in the user's cache directory: the tests
# must neither read nor write ~/.cache, and no test may see the entries of an earlier run.
_CACHE = tempfile.mkdtemp(prefix="stoker-test-cache-")
os.environ["STOKER_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

N = 60


def payload(i: int) -> bytes:
    # Varying lengths, so columns are not dense.
    return bytes((i * 31 + j) % 251 for j in range(100 + i * 7))


def keep(batch):
    """A DataLoader collate_fn that leaves the batch as the list of samples."""
    return batch


def value(sample):
    """A sample's payload: the ``bin`` field (files, tar) or LMDB's one field, ``data``."""
    assert isinstance(sample, dict) and "__key__" in sample, f"samples are webdataset-style dicts: {sample!r}"
    return sample["bin"] if "bin" in sample else sample["data"]


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    files = root / "bucket" / "files"
    files.mkdir(parents=True)
    for i in range(N):
        (files / f"{i:05d}.bin").write_bytes(payload(i))
    shards = root / "bucket" / "tar"
    shards.mkdir()
    for s in range(3):
        with tarfile.open(shards / f"shard-{s}.tar", "w", format=tarfile.PAX_FORMAT) as tf:
            for i in range(s * N // 3, (s + 1) * N // 3):
                for ext, data in (("bin", payload(i)), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"{i:05d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    import lmdb

    env = lmdb.open(str(root / "lmdb"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(N):
            txn.put(f"{i:05d}".encode(), payload(i))
    env.close()
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3(data):
    """The embedded S3 server over data/bucket; yields the s3:// URI prefix with options."""
    binary = os.environ.get("STOKER_S3_SERVER")
    assert binary and os.path.exists(binary), "set STOKER_S3_SERVER (integration/test.sh builds and sets it)"
    proc = subprocess.Popen(
        [binary, "--root", str(data), "--access-key", "ak", "--secret-key", "sk", "--addr", f"127.0.0.1:{_free_port()}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on "), line
    endpoint = "http://" + line.split()[-1]
    yield lambda path: f"s3://bucket/{path}?endpoint={endpoint}&access_key_id=ak&secret_access_key=sk"
    proc.terminate()
    proc.wait(timeout=10)


# --- GCS (fake-gcs-server), Azure (Azurite) and plain HTTP servers over the same samples. ---

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _tool(env_var: str, fallback: str) -> str:
    """`$env_var`, else where integration/setup.sh installs it; missing is a failure, not a skip."""
    path = os.environ.get(env_var) or os.path.join(ROOT, fallback)
    assert os.path.isfile(path), f"{path} not found: run integration/setup.sh (it installs it), or set {env_var}"
    return path


def _answers(port: int, path: str):
    """The HTTP status of GET path on a loopback port, or None while nothing answers."""
    import http.client

    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None


def _start(name: str, log_dir, command, ready) -> Tuple[subprocess.Popen, int]:
    """Start `command(port)` on a free loopback port and wait (at most 30 s) until `ready(port)`.
    A port found free can be taken before the server binds it: a server that exits is retried."""
    log_path = os.path.join(str(log_dir), f"{name}.log")
    for _ in range(3):
        port = _free_port()
        log = open(log_path, "w")
        proc = subprocess.Popen(command(port), stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=str(log_dir))
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if ready(port):
                return proc, port
            time.sleep(0.05)  # polling a server coming up; nothing to wait on instead
        proc.kill()
        proc.wait()
    raise AssertionError(f"{name} did not start; its log:\n" + open(log_path).read())


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def gcs(data, tmp_path_factory):
    """fake-gcs-server holding bucket `bucket` (data/bucket: files/, tar/); yields a function
    path -> gs:// URI with a service account that points object_store at it."""
    import urllib.parse

    root = tmp_path_factory.mktemp("gcs")
    shutil.copytree(data / "bucket", root / "buckets" / "bucket")  # the server loads it at start
    binary = _tool("STOKER_FAKE_GCS", ".venv/bin/fake-gcs-server")

    def command(port):
        return [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                # object_store speaks the XML API, which the server routes by this Host header.
                "-public-host", f"127.0.0.1:{port}", "-backend", "memory", "-log-level", "warn",
                "-data", str(root / "buckets")]

    proc, port = _start("fake-gcs-server", root, command, lambda p: _answers(p, "/storage/v1/b") == 200)
    account = root / "service-account.json"
    account.write_text(json.dumps({
        "gcs_base_url": f"http://127.0.0.1:{port}", "disable_oauth": True,
        "client_email": "stoker-test@example.invalid", "private_key": "unused", "private_key_id": "unused",
    }))
    sa = urllib.parse.quote(str(account), safe="")
    yield lambda path: f"gs://bucket/{path}?allow_http=true&service_account={sa}"
    _stop(proc)


AZ_ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, documented by Microsoft).
AZ_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _azure_put(port: int, path: str, query: Dict[str, str], body: bytes, headers: Dict[str, str]) -> None:
    """A SharedKey-signed PUT to Azurite (path-style: /account/container[/blob])."""
    import base64
    import email.utils
    import hashlib
    import hmac
    import http.client
    import urllib.parse

    ms = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-08-06", **headers}
    canonical_headers = "".join(f"{k}:{ms[k]}\n" for k in sorted(ms))
    resource = f"/{AZ_ACCOUNT}{path}" + "".join(f"\n{k}:{query[k]}" for k in sorted(query))
    length = str(len(body)) if body else ""
    to_sign = "PUT\n\n\n" + length + "\n" + "\n" * 7 + "\n" + canonical_headers + resource
    sig = base64.b64encode(hmac.new(base64.b64decode(AZ_KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    url = urllib.parse.quote(path) + ("?" + urllib.parse.urlencode(query) if query else "")
    conn.request("PUT", url, body=body, headers={**ms, "Content-Length": str(len(body)),
                                                 "Authorization": f"SharedKey {AZ_ACCOUNT}:{sig}"})
    resp = conn.getresponse()
    assert resp.status == 201, f"PUT {path} to Azurite: HTTP {resp.status}: {resp.read()[:500]!r}"


@pytest.fixture(scope="session")
def azure(data, tmp_path_factory):
    """Azurite with container `data` holding data/bucket (files/, tar/); yields path -> az:// URI
    in emulator mode."""
    import urllib.parse

    root = tmp_path_factory.mktemp("azurite")
    binary = _tool("STOKER_AZURITE", "integration/node_modules/.bin/azurite-blob")

    def command(port):
        return [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                "--skipApiVersionCheck", "--disableTelemetry", "--loose", "--silent"]

    proc, port = _start("azurite", root, command, lambda p: _answers(p, f"/{AZ_ACCOUNT}?comp=list") is not None)
    _azure_put(port, f"/{AZ_ACCOUNT}/data", {"restype": "container"}, b"", {})
    for sub in ("files", "tar"):
        for name in sorted(os.listdir(data / "bucket" / sub)):
            body = (data / "bucket" / sub / name).read_bytes()
            _azure_put(port, f"/{AZ_ACCOUNT}/data/{sub}/{name}", {}, body, {"x-ms-blob-type": "BlockBlob"})
    endpoint = urllib.parse.quote(f"http://127.0.0.1:{port}/{AZ_ACCOUNT}", safe="")
    key = urllib.parse.quote(AZ_KEY, safe="")
    yield lambda path: f"az://data/{path}?use_emulator=true&endpoint={endpoint}&access_key={key}"
    _stop(proc)


@pytest.fixture(scope="session")
def http(data):
    """The embedded S3 server without credentials: a plain HTTP server (GET/HEAD with ranges)
    over data/; yields path -> http:// URI (tar shards by brace pattern, no listing)."""
    binary = os.environ.get("STOKER_S3_SERVER")
    assert binary and os.path.exists(binary), "set STOKER_S3_SERVER (integration/test.sh builds and sets it)"
    proc = subprocess.Popen([binary, "--root", str(data), "--addr", f"127.0.0.1:{_free_port()}"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on "), line
    endpoint = "http://" + line.split()[-1]
    yield lambda path: f"{endpoint}/bucket/{path}"
    _stop(proc)


@pytest.fixture
def token_mix(tmp_path):
    """``make(docs_each)``: two token corpora of ``docs_each`` uint16 documents each (ids from 0
    under ``a``, from 30000 under ``b``), written by Stoker's own writer, mixed 50/50 by tokens."""

    def make(docs_each: int):
        import numpy

        import stoker
        from stoker import _stoker

        for name, base in (("a", 0), ("b", 30000)):
            docs = [numpy.arange(base + i * 50, base + i * 50 + 30 + i, dtype="<u2").tobytes() for i in range(docs_each)]
            _stoker.ShardWriter(str(tmp_path / name), "{}").write_tokens("part", "uint16", docs)
        return stoker.mix({str(tmp_path / "a"): 0.5, str(tmp_path / "b"): 0.5}, weight_by="tokens")

    return make
