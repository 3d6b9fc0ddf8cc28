"""Stoker inside PyTorch's real DataLoader, and stoker.Loader: every sample exactly once, the
right bytes, fork and spawn workers, resume across processes, ranks under torchrun."""

import io
import json
import os
import tarfile
import subprocess
import sys

import numpy
import pytest
import torch
from torch.utils.data import DataLoader

import stoker
import stoker.torch
from conftest import N, keep, payload, value


def index_of(sample):
    return int(sample["__key__"]) if isinstance(sample, dict) else None


@pytest.mark.parametrize("layout", ["files", "tar", "lmdb", "s3-tar", "s3-files"])
@pytest.mark.parametrize("workers,context", [(0, None), (2, "fork"), (4, "fork"), (2, "spawn"), (4, "spawn")])
def test_dataloader_every_sample_once(data, s3, layout, workers, context):
    uri = s3(layout[3:]) if layout.startswith("s3-") else str(data / ("bucket/" + layout if layout != "lmdb" else "lmdb"))
    ds = stoker.open(uri)
    assert len(ds) == N
    dl = DataLoader(ds, batch_size=7, shuffle=True, num_workers=workers, multiprocessing_context=context, collate_fn=keep)
    got = sorted(value(s) for b in dl for s in b)
    assert got == sorted(payload(i) for i in range(N))
    # The samples are the right ones for their index, not just the right multiset.
    for i in (0, 17, N - 1):
        assert value(ds[i]) == payload(i)
    assert value(ds[-1]) == payload(N - 1)


def test_iterable_dataset_splits_by_worker_without_repeats(data):
    ds = stoker.torch.IterableDataset(str(data / "bucket/tar"), shuffle=True, seed=3)
    dl = DataLoader(ds, batch_size=None, num_workers=3, multiprocessing_context="fork")
    keys = [s["__key__"] for s in dl]
    assert sorted(keys) == [f"{i:05d}" for i in range(N)]


def test_loader_batches_zero_copy_tensors(data):
    loader = stoker.Loader(str(data / "bucket/tar"), batch_size=8, shuffle=True, seed=5)
    seen = []
    for batch in loader:
        bins, offsets = batch["bin"]  # variable length: (data, offsets)
        assert bins.dtype == torch.uint8 and offsets.dtype == torch.int64
        for row, idx in enumerate(batch["__index__"]):
            assert bytes(bins[offsets[row] : offsets[row + 1]].numpy()) == payload(idx)
        seen += batch["__index__"]
    assert sorted(seen) == list(range(N))
    stats = loader.stats()
    assert stats["samples"] == N and "consumer_wait_fraction" in stats
    lmdb = stoker.Loader(str(data / "lmdb"), batch_size=4, output="numpy")
    first = next(iter(lmdb))
    assert isinstance(first["data"][0], numpy.ndarray)
    assert stoker.open(str(data / "lmdb"))[0] == {"__key__": "00000", "data": payload(0)}


def test_field_types_are_fixed_for_the_run(tmp_path):
    # Equal-length raw values stay (data, offsets) unless declared: the type must not depend
    # on whether a batch's values happen to share a length (labels "7" and "12").
    def shard(short=None):
        with tarfile.open(tmp_path / "s.tar", "w") as tf:
            for i in range(10):
                for ext, body in (("bin", b"short" if i == short else bytes([i]) * 16), ("cls", str(i * 3).encode())):
                    info = tarfile.TarInfo(f"{i:03d}.{ext}")
                    info.size = len(body)
                    tf.addfile(info, io.BytesIO(body))

    shard()
    for batch in stoker.Loader(str(tmp_path), batch_size=4):
        data, offsets = batch["bin"]
        assert data.dtype == torch.uint8 and data.dim() == 1 and offsets.dtype == torch.int64
    spec = {"bin": stoker.Bytes(shape=(16,)), "cls": stoker.Int()}
    shapes = []
    for batch in stoker.Loader(str(tmp_path), batch_size=4, decode=spec):
        t, y = batch["bin"], batch["cls"]
        assert t.dtype == torch.uint8 and y.dtype == torch.int64
        assert t[:, 0].tolist() == [i for i in batch["__index__"]]
        assert y.tolist() == [3 * i for i in batch["__index__"]]
        shapes.append((tuple(t.shape), tuple(y.shape)))
    assert shapes == [((4, 16), (4,)), ((4, 16), (4,)), ((2, 16), (2,))]
    numpy_batch = next(iter(stoker.Loader(str(tmp_path), batch_size=4, decode=spec, output="numpy")))
    assert numpy_batch["cls"].dtype == numpy.int64 and numpy_batch["bin"].shape == (4, 16)
    # A value of another length than declared: an error naming the sample.
    shard(short=3)
    with pytest.raises(stoker.DecodeError, match="003"):
        list(stoker.Loader(str(tmp_path), batch_size=4, decode=spec))
    with pytest.raises(stoker.InvalidInputError, match="decode"):
        stoker.Loader(str(tmp_path), batch_size=4, decode={"bin": "image"})


RESUME = r"""
import json, sys, stoker
uri, state_path, mode = sys.argv[1:4]
loader = stoker.Loader(uri, batch_size=5, shuffle=True, seed=9)
if mode == "first":
    out = []
    for i, batch in enumerate(loader):
        out += batch["__index__"]
        if i == 4:
            json.dump(loader.state_dict(), open(state_path, "w"))
            break
else:
    loader.load_state_dict(json.load(open(state_path)))
    out = [j for b in loader for j in b["__index__"]]
print(json.dumps(out))
"""


def test_resume_in_a_new_process(data, tmp_path):
    uri, state = str(data / "bucket/tar"), str(tmp_path / "state.json")
    run = lambda mode: json.loads(subprocess.check_output([sys.executable, "-c", RESUME, uri, state, mode], timeout=300))
    first, rest = run("first"), run("rest")
    assert len(first) == 25
    assert sorted(first + rest) == list(range(N)), "the union is the epoch exactly once"


TORCHRUN = r"""
import json, os, sys, torch.distributed as dist, stoker
dist.init_process_group("gloo")
loader = stoker.Loader(sys.argv[1], batch_size=4, shuffle=True, seed=1)
mine = [j for b in loader for j in b["__index__"]]
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, mine)
if dist.get_rank() == 0:
    print(json.dumps(everyone))
dist.destroy_process_group()
"""


def test_torchrun_four_ranks_partition_the_epoch(data, tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(TORCHRUN)
    out = subprocess.check_output(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", str(script), str(data / "bucket/tar")],
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    parts = json.loads(out.decode().strip().splitlines()[-1])
    assert len(parts) == 4 and len({len(p) for p in parts}) == 1, "equal lengths per rank"
    flat = [i for p in parts for i in p]
    assert set(flat) == set(range(N)), "together the whole epoch"
    assert len(flat) - len(set(flat)) < 4, "only the wrap padding repeats"


def test_errors_are_stoker_exceptions(data):
    with pytest.raises(stoker.NotFoundError, match="nope"):
        stoker.open("/nope")
    with pytest.raises(stoker.InvalidInputError, match="layout"):
        stoker.open(str(data / "bucket/tar"), layout="zip")
    with pytest.raises(IndexError):
        stoker.open(str(data / "lmdb"))[N]
    with pytest.raises(stoker.CudaUnavailableError):
        stoker.Loader(str(data / "lmdb"), batch_size=2, device="cuda")
    assert issubclass(stoker.NotFoundError, stoker.StokerError)


HANG = r"""
import faulthandler, signal, sys, stoker
# SIGUSR1 prints every thread's Python stack: the test asks for it if Ctrl-C goes unanswered.
faulthandler.register(signal.SIGUSR1)
# A shell's background job inherits SIGINT ignored, and Python then leaves it ignored: this
# child answers Ctrl-C however the suite was started.
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    stoker.open(f"http://127.0.0.1:{sys.argv[1]}/data/shard-{{0..1}}.tar", timeout_ms=600000, attempts=1)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
"""


def test_a_blocked_call_answers_ctrl_c():
    import select
    import signal
    import socket
    import time

    # A server that takes connections and never answers. The child's connection to it says
    # the child is inside the native call (past `stoker.open`'s Python part, torch's import
    # included, which takes seconds on a loaded machine).
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        srv.settimeout(120)
        port = srv.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-c", HANG, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        conn, _ = srv.accept()
        with conn:
            started = time.monotonic()
            proc.send_signal(signal.SIGINT)
            # The answer is the child's "interrupted" line (its exit after it, torch's teardown
            # included, can take seconds on a loaded machine and is not what is measured).
            answered = select.select([proc.stdout], [], [], 20)[0]
            took = time.monotonic() - started
    if not answered:
        proc.send_signal(signal.SIGUSR1)  # where it waits: every thread's Python stack
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"Ctrl-C unanswered after 20 s; stdout {out!r}; its stacks:\n{err}")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "interrupted" in out, (proc.returncode, out)
    assert took < 5, f"Ctrl-C answered after {took:.1f} s: the GIL-free wait checks for it every 100 ms"
