"""``shuffle="shards"``: the shard shuffle over tar shards on S3 (the embedded server), read a
window of shards ahead; exactly once, deterministic per (seed, epoch), resumable in a new
process, rank-partitioned, through torch's DataLoader, and few requests."""

import json
import subprocess
import sys

import pytest
from torch.utils.data import DataLoader

import stoker
import stoker.torch
from conftest import N, payload

PER_SHARD = N // 3  # conftest writes 3 shards


def indices(loader, max_batches=None):
    out = []
    for b, batch in enumerate(loader):
        if max_batches is not None and b == max_batches:
            break
        bins, offsets = batch["bin"]
        for row, i in enumerate(batch["__index__"]):
            assert bytes(bins[offsets[row] : offsets[row + 1]].numpy()) == payload(i)
        out += batch["__index__"]
    return out


def test_shard_shuffle_over_s3_is_exactly_once_deterministic_and_windowed(s3):
    # Without the disk cache (on by default), which earlier tests on the same objects have
    # filled: a warm cache serves reads as block-file spans, and the request count below is
    # about what the read-ahead asks of the remote store.
    uri = s3("tar") + "&disk_cache=false"
    loader = stoker.Loader(uri, batch_size=4, shuffle="shards", shuffle_window=2, seed=3)
    before = loader.stats()["store_requests"]
    first = indices(loader)
    requests = loader.stats()["store_requests"] - before
    assert sorted(first) == list(range(N))
    # A window of 2 shards: the first 2 * PER_SHARD samples come from exactly 2 shards.
    assert len({i // PER_SHARD for i in first[: 2 * PER_SHARD]}) == 2
    assert indices(stoker.Loader(uri, batch_size=7, shuffle="shards", shuffle_window=2, seed=3)) == first
    second = indices(loader)  # the next epoch
    assert sorted(second) == list(range(N)) and second != first
    # Each shard read ahead in one request, against about one per batch and shard otherwise.
    assert requests <= 3, requests
    per_sample = stoker.Loader(uri, batch_size=4, shuffle=True, seed=3)
    before = per_sample.stats()["store_requests"]
    indices(per_sample)
    assert per_sample.stats()["store_requests"] - before > 3 * requests


RESUME = r"""
import json, sys, stoker
uri, state_path, mode = sys.argv[1:4]
loader = stoker.Loader(uri, batch_size=5, shuffle="shards", shuffle_window=2, seed=9)
if mode == "first":
    out = []
    for i, batch in enumerate(loader):
        out += batch["__index__"]
        if i == 4:
            json.dump(loader.state_dict(), open(state_path, "w"))
            break
elif mode == "rest":
    loader.load_state_dict(json.load(open(state_path)))
    out = [j for b in loader for j in b["__index__"]]
else:
    out = [j for b in loader for j in b["__index__"]]
print(json.dumps(out))
"""


def test_shard_shuffle_resumes_in_a_new_process(s3, tmp_path):
    uri, state = s3("tar"), str(tmp_path / "state.json")
    run = lambda mode: json.loads(subprocess.check_output([sys.executable, "-c", RESUME, uri, state, mode], timeout=300))
    first, rest, whole = run("first"), run("rest"), run("whole")
    assert len(first) == 25
    assert first + rest == whole, "the resumed run continues the same epoch order"
    assert sorted(whole) == list(range(N))


def test_shard_shuffle_partitions_ranks_and_dataloader_workers(s3):
    uri = s3("tar")
    ranks = [indices(stoker.Loader(uri, batch_size=4, shuffle="shards", seed=1, rank=r, world_size=2)) for r in (0, 1)]
    assert not set(ranks[0]) & set(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == list(range(N))
    ds = stoker.torch.IterableDataset(uri, shuffle="shards", shuffle_window=2, seed=4)
    dl = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    assert sorted(s["__key__"] for s in dl) == [f"{i:05d}" for i in range(N)]


def test_bad_shuffle_values_name_the_choices(data, s3):
    uri = s3("tar")
    with pytest.raises(ValueError, match=r'True .*False .*"shards"'):
        stoker.Loader(uri, batch_size=4, shuffle="random")
    with pytest.raises(ValueError, match="shards"):
        stoker.Loader(uri, batch_size=4, shuffle=1)
    with pytest.raises(ValueError, match="at least 1"):
        stoker.Loader(uri, batch_size=4, shuffle="shards", shuffle_window=0)
    with pytest.raises(ValueError, match="shuffle_window applies"):
        stoker.Loader(uri, batch_size=4, shuffle=True, shuffle_window=2)
    # Files and LMDB have no shards: a clear error, not a silent per-sample shuffle.
    for path in ("bucket/files", "lmdb"):
        with pytest.raises(stoker.InvalidInputError, match="not made of shards"):
            stoker.Loader(str(data / path), batch_size=4, shuffle="shards")
    assert sorted(indices(stoker.Loader(str(data / "bucket/tar"), batch_size=4, shuffle="shards"))) == list(range(N))


def test_a_loader_walking_shards_takes_bigger_cache_blocks(s3, tmp_path):
    """Storage order and the shard shuffle read shards front to back: such a Loader opens its
    source with 8 MiB cache blocks unless told otherwise; a shuffle of all samples keeps the
    default. Every sample still arrives, through the disk cache, and a second Loader with the
    other block size on the same cache directory reads right too."""
    opts = {"disk_cache_dir": str(tmp_path / "cache")}
    walking = stoker.Loader(s3("tar"), batch_size=8, shuffle="shards", **opts)
    assert walking.dataset.options["cache_block"] == 8 << 20
    assert stoker.Loader(s3("tar"), batch_size=8, shuffle=False, **opts).dataset.options["cache_block"] == 8 << 20
    told = stoker.Loader(s3("tar"), batch_size=8, shuffle="shards", cache_block=4096, **opts)
    assert told.dataset.options["cache_block"] == 4096
    each = stoker.Loader(s3("tar"), batch_size=8, shuffle=True, **opts)
    assert "cache_block" not in each.dataset.options
    for loader in (walking, each, told, walking):
        assert sorted(indices(loader)) == list(range(N))
    for loader in (walking, each, told):
        assert loader.stats()["cache_corrupt"] == 0


def test_diagnose_takes_the_shard_shuffle(s3):
    report = stoker.diagnose(s3("tar"), batch_size=8, shuffle="shards", shuffle_window=2, samples=40, seconds=5)
    assert len(report["steps"]) == 5 and all(s["samples_per_s"] > 0 for s in report["steps"]), report["text"]
    with pytest.raises(ValueError, match="shuffle"):
        stoker.diagnose(s3("tar"), batch_size=8, shuffle="window")
