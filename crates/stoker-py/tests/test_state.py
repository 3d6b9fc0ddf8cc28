"""A Loader's state_dict() as training loops take it: after a `break` with a transform's
batches still in flight, at an epoch's end before the next set_epoch(), and loaded into a
loader it does not fit; and arguments a Loader must refuse rather than act on wrongly."""

import json

import pytest

import stoker
from conftest import N


def indices(batch):
    return [int(i) for i in batch["__index__"]]


def test_a_break_with_a_transform_resumes_after_the_last_batch_yielded(data):
    def make():
        return stoker.Loader(
            str(data / "bucket/tar"), batch_size=4, output="numpy", shuffle=True, seed=3,
            transform=lambda s: int(s["__index__"]), collate_fn=list, prefetch=4,
        )

    first, seen = make(), []
    for step, batch in enumerate(first):
        seen += batch
        if step == 2:
            break
    state = first.state_dict()
    assert state["loader"]["sampler"]["consumed"] == len(seen) == 12, "batches held by the pool are not counted"
    second = make()
    second.load_state_dict(json.loads(json.dumps(state)))
    rest = [i for b in second for i in b]
    assert sorted(seen + rest) == list(range(N)), "the rest of the epoch, nothing skipped or repeated"
    # The loop that broke goes on with its next epoch, as without a transform: whole, no error.
    first.set_epoch(1)
    assert sorted(i for b in first for i in b) == list(range(N))


def test_a_state_taken_at_an_epochs_end_resumes_at_the_next_epoch(data):
    uri = str(data / "bucket/tar")

    def make():
        return stoker.Loader(uri, batch_size=8, output="numpy", shuffle=True, seed=5)

    whole = make()
    whole.set_epoch(0)
    assert sum(len(indices(b)) for b in whole) == N
    state = whole.state_dict()
    assert state["epoch"] == 1 and state["loader"]["sampler"]["epoch"] == 1, state
    want = [indices(b) for b in make_epoch(make(), 1)]

    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # the loop's next epoch, as a training loop resumes
    assert [indices(b) for b in resumed] == want, "epoch 1 whole, not an empty epoch 0"

    # A state kept at the end of its epoch (as earlier versions wrote them) is read the same way.
    old = {"epoch": 0, "loader": {**state["loader"], "sampler": {**state["loader"]["sampler"], "epoch": 0, "consumed": N}}}
    resumed = make()
    resumed.load_state_dict(old)
    assert [indices(b) for b in resumed] == want

    # An epoch asked for that is not the state's is an error, not another epoch read or skipped.
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(0)
    with pytest.raises(stoker.InvalidInputError, match=r"set_epoch\(0\).*epoch 1"):
        next(iter(resumed))


def make_epoch(loader, epoch):
    loader.set_epoch(epoch)
    return iter(loader)


def test_a_state_for_another_order_or_past_its_end_is_refused(data):
    uri = str(data / "bucket/tar")
    shuffled = stoker.Loader(uri, batch_size=8, output="numpy", shuffle=True, seed=7)
    it = iter(shuffled)
    next(it)
    state = shuffled.state_dict()
    for other in (dict(shuffle=False), dict(shuffle=True, seed=8), dict(shuffle="shards", seed=7)):
        loader = stoker.Loader(uri, batch_size=8, output="numpy", **other)
        with pytest.raises(stoker.InvalidInputError, match="order"):
            loader.load_state_dict(state)
    # Another dataset of as many samples (files, not tar shards): its state is not this one's.
    with pytest.raises(stoker.InvalidInputError, match="tar, 3 shards"):
        stoker.Loader(str(data / "bucket/files"), batch_size=8, output="numpy", shuffle=True, seed=7).load_state_dict(state)
    past = {**state, "loader": {**state["loader"], "sampler": {**state["loader"]["sampler"], "consumed": 10**7}}}
    with pytest.raises(stoker.InvalidInputError, match="consumed"):
        stoker.Loader(uri, batch_size=8, output="numpy", shuffle=True, seed=7).load_state_dict(past)


def test_a_loader_refuses_what_it_would_act_on_wrongly(data):
    uri = str(data / "bucket/tar")
    # It reads a dataset's source, not its __getitem__: the transform would be skipped.
    ds = stoker.open(uri, transform=lambda s: s)
    with pytest.raises(stoker.InvalidInputError, match="transform="):
        stoker.Loader(ds, batch_size=4, output="numpy")
    # A declared shape is allocated batch-size times before decoding: past any sample, refused
    # (2**45 bytes aborted the process; 2**62 x 4 elements overflowed).
    for spec in (stoker.Bytes(shape=[2**45]), stoker.Bytes(dtype="float32", shape=[2**62, 4])):
        with pytest.raises(stoker.InvalidInputError, match="bytes a sample"):
            stoker.Loader(uri, batch_size=8, output="numpy", decode={"bin": spec})
