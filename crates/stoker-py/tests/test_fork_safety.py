"""Fork safety: PyTorch's DataLoader with fork workers (4) over every backend, 3 epochs, with
the source already used in the parent before the workers fork (its runtime and connection pool
exist, and in the hardest case a stoker.Loader is prefetching on them at fork time). Every
epoch must deliver every sample exactly once with its bytes; nothing may hang or crash.

Guards against a hang: the DataLoader's own `timeout` for each batch, and a watchdog that
dumps every thread's stack and ends the run if a test exceeds its time."""

import collections
import faulthandler
import os
import signal
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader

import stoker
from conftest import N, keep, payload, value

# 4 workers on a 2-core machine is the point here, not a mistake.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")

EPOCHS = 3
BATCH_TIMEOUT_S = 60  # DataLoader: a worker that delivers nothing for this long is an error
TEST_TIMEOUT_S = 240  # watchdog for the whole test (covers the parent and worker shutdown)


@pytest.fixture(autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(TEST_TIMEOUT_S, exit=True, file=sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()


class Indexed(torch.utils.data.Dataset):
    """(index, sample) so each delivery can be checked against what that index must hold."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return i, self.ds[i]


def uri_for(backend, data, s3, gcs, azure, http):
    local = {"files": data / "bucket/files", "tar": data / "bucket/tar", "lmdb": data / "lmdb"}
    if backend in local:
        return str(local[backend])
    remote, layout = backend.split("-")
    if remote == "http":
        return http("tar/shard-{0..2}.tar")  # no listing over plain HTTP: a brace pattern
    return {"s3": s3, "gcs": gcs, "azure": azure}[remote](layout)


def check_epoch(dl, epoch):
    seen = collections.Counter()
    for batch in dl:
        for i, sample in batch:
            assert value(sample) == payload(i), f"epoch {epoch}: sample {i} has wrong bytes"
            if isinstance(sample, dict):
                assert sample["__key__"] == f"{i:05d}", f"epoch {epoch}: sample {i} has key {sample['__key__']}"
            seen[i] += 1
    assert sorted(seen) == list(range(N)), f"epoch {epoch}: missing {sorted(set(range(N)) - set(seen))}"
    assert max(seen.values()) == 1, f"epoch {epoch}: repeated {[i for i, n in seen.items() if n > 1]}"


BACKENDS = ["files", "tar", "lmdb", "s3-tar", "s3-files", "gcs-tar", "azure-tar", "http-tar"]


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh-workers", "persistent-workers"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_workers_after_the_parent_used_the_source(backend, persistent, data, s3, gcs, azure, http):
    ds = stoker.open(uri_for(backend, data, s3, gcs, azure, http))
    assert len(ds) == N
    # The parent reads first: its runtime, connection pool (remote) or LMDB handle exist when
    # the workers fork.
    assert value(ds[0]) == payload(0)
    assert [value(s) for s in ds.get_many([5, 1, 7])] == [payload(5), payload(1), payload(7)]
    dl = DataLoader(
        Indexed(ds),
        batch_size=7,
        shuffle=True,
        num_workers=4,
        multiprocessing_context="fork",
        persistent_workers=persistent,
        timeout=BATCH_TIMEOUT_S,
        collate_fn=keep,
    )
    for epoch in range(EPOCHS):
        check_epoch(dl, epoch)
        # And between epochs, so fresh workers fork from a parent that used it again.
        assert value(ds[epoch + 10]) == payload(epoch + 10)
    # The parent's source still works after its children came and went.
    assert value(ds[N - 1]) == payload(N - 1)


@pytest.mark.parametrize("backend", ["s3-tar", "lmdb"])
def test_fork_while_a_loader_is_prefetching_in_the_parent(backend, data, s3, gcs, azure, http):
    # The hard case: the parent's runtime threads are mid-fetch (holding whatever locks they
    # hold) at the moment the workers fork. The children must not inherit a stuck runtime.
    uri = uri_for(backend, data, s3, gcs, azure, http)
    loader = stoker.Loader(uri, batch_size=4, shuffle=True, seed=2, prefetch=8)
    running = iter(loader)
    first = next(running)  # the producer now prefetches the next batches
    ds = stoker.open(uri)
    assert value(ds[3]) == payload(3)
    dl = DataLoader(
        Indexed(ds),
        batch_size=5,
        shuffle=True,
        num_workers=4,
        multiprocessing_context="fork",
        timeout=BATCH_TIMEOUT_S,
        collate_fn=keep,
    )
    for epoch in range(EPOCHS):
        check_epoch(dl, epoch)
    # The parent's loader, forked around three times, finishes its epoch exactly once.
    rest = [i for b in running for i in b["__index__"]]
    assert sorted(first["__index__"] + rest) == list(range(N))


def _in_child(queue, fn):
    try:
        queue.put(("ok", fn()))
    except BaseException as e:  # reported to the parent, which fails the test with it
        queue.put(("error", f"{type(e).__name__}: {e}"))


def run_forked(fn):
    """fn() in a forked child; its result, or the test fails (error, crash or hang)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_in_child, args=(queue, fn))
    proc.start()
    try:
        status, result = queue.get(timeout=TEST_TIMEOUT_S / 2)
    except Exception:
        proc.kill()
        raise AssertionError(f"the forked child gave no answer (exit code {proc.exitcode}): hung or crashed")
    proc.join(timeout=30)
    assert proc.exitcode == 0, f"the child exited {proc.exitcode}"
    assert status == "ok", result
    return result


@pytest.mark.parametrize("backend", ["s3-tar", "tar"])
def test_a_loader_made_before_fork_works_in_the_child(backend, data, s3, gcs, azure, http):
    # A Loader built (and iterating) in the parent is copied into a forked child, e.g. inside
    # a dataset object handed to DataLoader workers. Its producers ran on the parent's runtime,
    # which does not exist in the child: the child must not wait on it forever.
    uri = uri_for(backend, data, s3, gcs, azure, http)
    loader = stoker.Loader(uri, batch_size=4, shuffle=True, seed=3, output="numpy")
    running = iter(loader)
    first = next(running)

    def child():
        # Continuing the parent's iteration is a clear error...
        try:
            next(running)
            continued = "no error"
        except stoker.StokerError as e:
            continued = str(e)
        # ...and a new iteration is the next epoch, whole, as it would be in the parent.
        epoch = [int(i) for b in loader for i in b["__index__"]]
        return continued, epoch, loader.epoch

    continued, epoch, which = run_forked(child)
    assert "before a fork" in continued, continued
    assert sorted(epoch) == list(range(N)) and which == 1
    # The parent's own iteration is untouched by the child.
    rest = [int(i) for b in running for i in b["__index__"]]
    assert sorted([int(i) for i in first["__index__"]] + rest) == list(range(N))


def test_a_state_loaded_before_fork_resumes_in_the_child(data, s3):
    uri = s3("tar")
    done = stoker.Loader(uri, batch_size=5, shuffle=True, seed=4, output="numpy")
    it = iter(done)
    head = [int(i) for _ in range(3) for i in next(it)["__index__"]]
    loader = stoker.Loader(uri, batch_size=5, shuffle=True, seed=4, output="numpy")
    loader.load_state_dict(done.state_dict())
    tail = run_forked(lambda: [int(i) for b in loader for i in b["__index__"]])
    assert len(head) == 15 and sorted(head + tail) == list(range(N))


def _wait_for_children(pids, limit_s):
    """Each child's exit code, or None for one still running after `limit_s` (then killed)."""
    deadline = time.monotonic() + limit_s
    codes = {}
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if len(codes) < len(pids):
            if time.monotonic() > deadline:
                for pid in set(pids) - set(codes):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    codes[pid] = None
                break
            time.sleep(0.02)
    return [codes[p] for p in pids]


def test_workers_forked_straight_after_cold_reads_do_not_wait_for_the_parent(data, http, tmp_path, monkeypatch):
    # Cold reads store their blocks on disk behind them, on the parent's threads and under the
    # node's fetch lease for each block; DataLoader forks its workers a moment later. A child
    # copies those writes' books and the lease's file descriptor but not the threads: it once
    # waited 30 s for the parent's writes (dropping the parent's source when it opened its
    # own) or 60 s for a lease its own copy kept held. Healthy, each reads its share in well
    # under a second; 20 s is a hang.
    for round_ in range(5):
        monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / f"cache-{round_}"))
        ds = stoker.open(http("tar/shard-{0..2}.tar"))
        assert [value(s) for s in ds.get_many(list(range(0, N, 3)))] == [payload(i) for i in range(0, N, 3)]
        pids = []
        for w in range(4):
            pid = os.fork()
            if pid == 0:
                ok = all(value(ds[i]) == payload(i) for i in range(w, N, 4))
                os._exit(0 if ok else 1)
            pids.append(pid)
        codes = _wait_for_children(pids, 20)
        assert codes == [0, 0, 0, 0], f"round {round_}: children ended {codes} (None: still reading after 20 s)"


def test_a_shard_being_written_before_fork_stays_the_parents(tmp_path, s3):
    # A shard stream's temporary file or upload is its writer's: a forked child may not add
    # to it or finish it, and dropping its copy must not give it up (which deleted the
    # parent's temporary file). The child's own shards go through a writer opened again.
    import pyarrow as pa
    from stoker import _stoker

    def rows(keys):
        return pa.array(keys), [("bin", pa.array([k.encode() for k in keys], pa.binary()))]

    def at(dest, name):
        path, _, query = dest.partition("?")
        return f"{path.rstrip('/')}/{name}" + (f"?{query}" if query else "")

    for dest in [str(tmp_path / "out"), s3("written")]:
        writer = _stoker.ShardWriter(dest, "{}")
        held = [writer.shard("parent.tar")]
        held[0].add(*rows(["p0", "p1"]))

        def child():
            stream = held.pop()
            try:
                stream.add(*rows(["c0"]))
                refused = "no error"
            except stoker.StokerError as e:
                refused = str(e)
            del stream  # the child's only reference: dropped here
            own = writer.shard("child.tar")
            own.add(*rows(["c0", "c1", "c2"]))
            return refused, own.finish()["samples"]

        refused, child_samples = run_forked(child)
        assert "before a fork" in refused, refused
        assert child_samples == 3
        held[0].add(*rows(["p2"]))
        assert held[0].finish()["samples"] == 3
        assert sorted(s["__key__"] for s in stoker.open(at(dest, "parent.tar"))) == ["p0", "p1", "p2"]
        assert len(stoker.open(at(dest, "child.tar"))) == 3


def test_a_token_loader_in_a_forked_child_goes_on_as_the_parent_would(tmp_path):
    # A state loaded and not yet started in the parent is the child's start too; one the
    # parent has since used is not resumed again in a child forked later.
    import numpy
    from stoker import _stoker

    docs = [numpy.arange(i * 50, i * 50 + 40 + i, dtype="<u2").tobytes() for i in range(60)]
    _stoker.ShardWriter(str(tmp_path / "tok"), "{}").write_tokens("part", "uint16", docs)

    def make():
        return stoker.TokenLoader(str(tmp_path / "tok"), seq_len=16, global_batch=2, shuffle=True, output="numpy")

    def ids(loader):
        return [b["input_ids"].tolist() for b in loader]

    first = make()
    running = iter(first)
    head = [next(running)["input_ids"].tolist() for _ in range(3)]
    loader = make()
    loader.load_state_dict(first.state_dict())
    rest = run_forked(lambda: ids(loader))
    assert head + rest == ids(make())
    assert ids(loader) == rest  # the parent's own resume, which uses the state
    # The same epoch again (`set_epoch`, as with a DistributedSampler): whole, in the parent
    # and in a child forked now.
    epoch = loader.epoch
    loader.set_epoch(epoch)
    later = run_forked(lambda: ids(loader))
    loader.set_epoch(epoch)
    again = ids(loader)
    assert len(again) == len(head) + len(rest)
    assert later == again, "the child resumed a state its parent had already used"


def test_a_token_mix_in_a_forked_child_takes_the_weights_in_force(token_mix):
    # Weights changed and used in the parent: its next epoch draws by them, and so does a
    # child forked now (not by the weights the loader was made with).
    mixed = token_mix(40)
    loader = stoker.TokenLoader(mixed, seq_len=16, global_batch=2, shuffle=True, seed=5, output="numpy")
    loader.set_weights([0.9, 0.1])
    assert sum(1 for _ in loader) > 0  # epoch 0, drawn 90/10

    def ids():
        return [b["input_ids"].tolist() for b in loader]

    child = run_forked(ids)
    parent = ids()
    assert child == parent, "the child drew its epoch by other weights than the parent"
