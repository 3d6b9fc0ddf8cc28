"""Fixtures: the same samples as files, WebDataset tar shards, an LMDB written by py-lmdb,
and (through the embedded S3 server) an S3 bucket."""

import io
import os
import socket
import subprocess
import tarfile
import time

import pytest

N = 60


def payload(i: int) -> bytes:
    # Varying lengths, so columns are not dense.
    return bytes((i * 31 + j) % 251 for j in range(100 + i * 7))


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
