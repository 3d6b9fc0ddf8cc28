"""Saved states, mixes and options damaged or mistyped by the user's own code or files: each a
clear error naming what is wrong, never a resume that repeats or skips samples, a panic, an
unbounded read or a secret shown."""

import copy
import json

import pytest

import stoker


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    stoker.demo(str(d), images=64, documents=200)
    return d


def keys(loader):
    return [k for b in loader for k in b["__key__"]]


def started(uri, batches=2, **kw):
    loader = stoker.Loader(uri, batch_size=16, shuffle=True, seed=1, **kw)
    it = iter(loader)
    seen = [k for _, b in zip(range(batches), it) for k in b["__key__"]]
    return loader, seen


def test_a_loader_state_emptied_or_at_odds_with_itself_is_refused(demo):
    run, seen = started(str(demo / "images"))
    state = run.state_dict()
    fresh = lambda: stoker.Loader(str(demo / "images"), batch_size=16, shuffle=True, seed=1)  # noqa: E731
    # {"loader": {}} is no state a loader writes: it would restart the epoch.
    with pytest.raises(stoker.InvalidInputError, match="sampler"):
        fresh().load_state_dict({"epoch": 0, "loader": {}})
    # The epoch is the sampler's, copied out: two that differ are damage, either way round.
    for outer, inner in [(3, 0), (0, 3)]:
        bad = copy.deepcopy(state)
        bad["epoch"], bad["loader"]["sampler"]["epoch"] = outer, inner
        with pytest.raises(stoker.InvalidInputError, match="not its sampler's"):
            fresh().load_state_dict(bad)
    # Nested a thousand deep, or a description of megabytes: refused in a few words.
    deep: list = []
    for _ in range(1000):
        deep = [deep]
    bad = copy.deepcopy(state)
    bad["loader"]["note"] = deep
    with pytest.raises(stoker.InvalidInputError, match="deeper than"):
        fresh().load_state_dict(bad)
    bad = copy.deepcopy(state)
    bad["loader"]["source"] = "x" * (4 << 20)
    with pytest.raises(stoker.InvalidInputError) as e:
        fresh().load_state_dict(bad)
    assert len(str(e.value)) < 2000
    # A refused state leaves the loader as it was; the real one resumes exactly.
    again = fresh()
    with pytest.raises(stoker.InvalidInputError):
        again.load_state_dict({"epoch": 0, "loader": {}})
    again.load_state_dict(state)
    rest = keys(again)
    assert not set(seen) & set(rest) and len(seen) + len(rest) == 64


def test_epochs_out_of_range_name_the_call(demo):
    loader = stoker.Loader(str(demo / "images"), batch_size=16)
    for epoch in (-1, 2**64, 1.5, "1"):
        with pytest.raises(stoker.InvalidInputError, match="set_epoch"):
            loader.set_epoch(epoch)
    tokens = stoker.TokenLoader(str(demo / "text"), seq_len=32, global_batch=4,
                                tokenizer=str(demo / "tokenizer.json"), output="numpy")
    with pytest.raises(stoker.InvalidInputError, match="set_epoch"):
        tokens.set_epoch(-1)
    # The last epoch there is: the one after it is an error, not an overflow.
    loader.set_epoch(2**64 - 1)
    sum(1 for _ in loader)
    with pytest.raises(stoker.InvalidInputError, match="the last"):
        next(iter(loader))


def test_a_token_state_past_its_epochs_end_is_refused(demo):
    kw = dict(seq_len=32, global_batch=4, tokenizer=str(demo / "tokenizer.json"), eos="<|endoftext|>", output="numpy")
    run = stoker.TokenLoader(str(demo / "text"), **kw)
    it = iter(run)
    next(it)
    state, n = run.state_dict(), len(run)
    for batch in (n + 1, 10**6, 2**63):
        resumed = stoker.TokenLoader(str(demo / "text"), **kw)
        with pytest.raises(stoker.InvalidInputError, match=f"which has {n}"):
            resumed.load_state_dict(dict(state, batch=batch))
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(stoker.InvalidInputError, match="deeper than"):
        stoker.TokenLoader(str(demo / "text"), **kw).load_state_dict(dict(state, note=deep))


def test_a_mix_state_does_not_resume_the_same_sources_in_another_order(demo):
    a, b = str(demo / "images/train-0000.tar"), str(demo / "images/train-0001.tar")
    run = stoker.Loader(stoker.mix({a: 1, b: 3}), batch_size=4, shuffle=True, seed=3)
    next(iter(run))
    state = run.state_dict()
    assert state["loader"]["mix_sources"] == [a, b]
    swapped = stoker.Loader(stoker.mix({b: 1, a: 3}), batch_size=4, shuffle=True, seed=3)
    with pytest.raises(stoker.InvalidInputError, match="in that order"):
        swapped.load_state_dict(state)
    p0, p1 = str(demo / "text/part-0000.jsonl"), str(demo / "text/part-0001.jsonl")
    kw = dict(seq_len=32, global_batch=4, tokenizer=str(demo / "tokenizer.json"), eos="<|endoftext|>", output="numpy")
    ref = stoker.TokenLoader(stoker.mix({p0: 0.8, p1: 0.2}, weight_by="tokens"), **kw)
    next(iter(ref))
    state = ref.state_dict()
    other = stoker.TokenLoader(stoker.mix({p1: 0.2, p0: 0.8}, weight_by="tokens"), **kw)
    with pytest.raises(stoker.InvalidInputError, match="in that order"):
        other.load_state_dict(state)


@pytest.mark.parametrize("kw, name", [
    ({"replacement": "no"}, "replacement"),
    ({"fill_missing": "false"}, "fill_missing"),
    ({"epoch_length": 1.5}, "epoch_length"),
    ({"epoch_length": "5"}, "epoch_length"),
    ({"epoch_length": -1}, "epoch_length"),
])
def test_mix_flags_and_lengths_are_not_coerced(demo, kw, name):
    a, b = str(demo / "images/train-0000.tar"), str(demo / "images/train-0001.tar")
    with pytest.raises(stoker.InvalidInputError, match=name):
        stoker.mix({a: 1, b: 1}, **kw)


def test_a_weight_past_a_floats_range_is_named(demo):
    a = str(demo / "images/train-0000.tar")
    with pytest.raises(stoker.InvalidInputError, match="weight"):
        stoker.mix({a: 10**400})


def test_remote_options_out_of_range_name_the_option_before_any_request(demo):
    s3 = "s3://bucket/x-{0..1}.tar"
    creds = {"access_key_id": "a", "secret_access_key": "hunter2", "attempts": 1}
    for how in ({"max_in_flight": 2**62}, {}):
        uri = s3 if how else s3 + "?max_in_flight=4611686018427387904"
        with pytest.raises(stoker.InvalidInputError, match="max_in_flight"):
            stoker.open(uri, endpoint="http://127.0.0.1:9", **creds, **how)
    with pytest.raises(stoker.InvalidInputError, match="option `concurrency`"):
        stoker.open(s3 + "?concurrency=abc", endpoint="http://127.0.0.1:9", **creds)
    with pytest.raises(stoker.InvalidInputError, match="endpoint") as e:
        stoker.open(s3, endpoint="http://[admin@127.0.0.1:9000", **creds)
    assert "hunter2" not in str(e.value)
    with pytest.raises(stoker.StokerError, match="ca_certificate") as e:
        stoker.open(s3, endpoint="https://127.0.0.1:9", ca_certificate="/dev/zero", **creds)
    assert "not a regular file" in str(e.value)


def test_a_secret_after_a_hash_is_not_shown():
    secret = "wJalrXUtnFEMI0K7MDENG0bPxRfiCYEXAMPLEKEY"
    with pytest.raises(stoker.StokerError) as e:
        stoker.open(f"s3://bucket/prefix/train-{{0000..0001}}.tar#secret_access_key={secret}")
    assert secret not in str(e.value) and secret not in repr(e.value)
    assert json.dumps(secret) not in json.dumps(str(e.value))
