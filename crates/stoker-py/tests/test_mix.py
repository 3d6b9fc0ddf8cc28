"""stoker.mix: an S3 tar source (embedded S3 server), an LMDB written by py-lmdb and a local
directory of files, mixed by weight and read through the Loader in a real PyTorch loop."""

import pickle

import pytest
import stoker
import torch
from conftest import N, payload

# 60 samples each; tar weighs most, so it runs out first: an epoch of 120.
WANT = {"s3-tar": 60, "lmdb": 36, "files": 24}


def sources(data, s3):
    return {
        s3("tar"): {"weight": 0.5, "name": "s3-tar"},
        str(data / "lmdb"): {"weight": 0.3, "name": "lmdb", "field": "bin"},
        str(data / "bucket" / "files"): {"weight": 0.2, "name": "files"},
    }


def rows(batch):
    """(source, key, bin bytes, cls bytes) of every sample of a torch batch."""
    data, offsets = batch["bin"]
    cdata, coffsets = batch["cls"]
    out = []
    for i, key in enumerate(batch["__key__"]):
        b = bytes(data[offsets[i] : offsets[i + 1]].numpy())
        c = bytes(cdata[coffsets[i] : coffsets[i + 1]].numpy())
        out.append((batch["__source__"][i], key, b, c))
    return out


def test_mix_through_a_pytorch_loop(data, s3):
    ds = stoker.mix(sources(data, s3), fill_missing={"cls": "-1"})
    assert ds.info()["layout"] == "mix" and len(ds) == 3 * N
    loader = stoker.Loader(ds, batch_size=16, shuffle=True, seed=3)
    assert len(loader) == 8
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    seen = {}
    per_source_loss = {name: 0.0 for name in WANT}
    for batch in loader:
        got = rows(batch)
        for source, key, b, c in got:
            assert b == payload(int(key)), f"{source} {key}: wrong bytes"
            assert c == (str(int(key)).encode() if source == "s3-tar" else b"-1"), (source, key, c)
            assert (source, key) not in seen, f"{source} {key} delivered twice"
            seen[(source, key)] = True
        # A training step whose loss is split per source by the __source__ column.
        _, offsets = batch["bin"]
        x = (offsets[1:] - offsets[:-1]).float().unsqueeze(1) / 1000.0
        losses = (model(x) - 1.0).pow(2).squeeze(1)
        for name in WANT:
            mask = torch.tensor([s == name for s in batch["__source__"]])
            per_source_loss[name] += float(losses[mask].sum().detach())
        opt.zero_grad()
        losses.mean().backward()
        opt.step()
    counts = {name: sum(1 for s, _ in seen if s == name) for name in WANT}
    assert counts == WANT
    assert all(v > 0 for v in per_source_loss.values())

    stats = loader.stats()
    by_name = {s["name"]: s for s in stats["sources"]}
    for name, want in WANT.items():
        s = by_name[name]
        assert s["samples"] == want and s["per_epoch"] == want, s
        keys = [int(k) for src, k in seen if src == name]
        cls = sum(len(str(k)) for k in keys) if name == "s3-tar" else 2 * want
        assert s["bytes"] == sum(len(payload(k)) for k in keys) + cls, s
        assert s["reads"] > 0 and s["read_wait_s"] > 0
    assert by_name["s3-tar"]["store_requests"] > 0


def test_mix_resumes_mid_epoch_in_a_new_loader(data, s3):
    def make():
        ds = stoker.mix(sources(data, s3), fill_missing={"cls": "-1"})
        return stoker.Loader(ds, batch_size=16, shuffle=True, seed=9)

    full = [(s, k) for b in make() for s, k, _, _ in rows(b)]
    first = make()
    it = iter(first)
    head = [(s, k) for _ in range(3) for s, k, _, _ in rows(next(it))]
    state = first.state_dict()
    assert state["loader"]["sampler"]["consumed"] == 48 and state["loader"]["sampler"]["mix"]
    second = make()
    second.load_state_dict(pickle.loads(pickle.dumps(state)))
    tail = [(s, k) for b in second for s, k, _, _ in rows(b)]
    assert head + tail == full


def test_missing_fields_are_named_unless_filled(data, s3):
    with pytest.raises(stoker.InvalidInputError, match=r"`lmdb`.*`cls`|`cls`.*`lmdb`"):
        stoker.mix(sources(data, s3))
    # Filled with empty bytes; and the list form with datasets and per-source options.
    ds = stoker.mix(
        [
            (stoker.open(s3("tar")), 1, {"name": "t"}),
            (str(data / "lmdb"), 1, {"name": "l", "field": "bin"}),
        ],
        fill_missing=True,
        epoch_length=30,
    )
    batch = next(iter(stoker.Loader(ds, batch_size=30, shuffle=True)))
    got = rows(batch)
    assert sorted(s for s, *_ in got) == ["l"] * 15 + ["t"] * 15
    assert all(c == b"" for s, _, _, c in got if s == "l")
    # Pickles as its spec (DataLoader workers and spawn reopen it).
    again = pickle.loads(pickle.dumps(ds))
    assert len(again) == len(ds) and again[0]["__source__"] == b"t"


def test_bad_mixes_are_refused(data):
    with pytest.raises(stoker.InvalidInputError, match="weight"):
        stoker.mix({str(data / "lmdb"): "heavy"})
    with pytest.raises(stoker.InvalidInputError, match="epoch_length"):
        stoker.mix({str(data / "lmdb"): 1, str(data / "bucket" / "files"): 1}, epoch_length=1000)
