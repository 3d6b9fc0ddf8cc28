"""Damage under the skip policy, from Python: what is lost is said once, as a warning, and is
in ``Dataset.damage()`` and ``Loader.stats()``; everything else is delivered intact."""

import io
import tarfile
import warnings

import pytest
import stoker


def write_shard(path, first, n):
    """A tar shard of ``n`` samples (``.bin`` members), keys from ``first``; returns the payloads."""
    out = {}
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(first, first + n):
            data = bytes((i * 13 + j) % 256 for j in range(700 + i))
            info = tarfile.TarInfo(f"{i:05d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            out[f"{i:05d}"] = data
    return out


def member_header_offset(path, name):
    with tarfile.open(path) as tar:
        return next(m.offset for m in tar.getmembers() if m.name == name)


@pytest.fixture
def damaged(tmp_path):
    """Shards s-0 (intact), s-1 (the header of its third member overwritten), s-2 missing,
    s-3 (intact), named by a brace pattern."""
    want = {}
    want.update(write_shard(tmp_path / "s-0.tar", 0, 5))
    want.update(write_shard(tmp_path / "s-1.tar", 5, 5))
    want.update(write_shard(tmp_path / "s-3.tar", 10, 5))
    at = member_header_offset(tmp_path / "s-1.tar", "00007.bin")
    raw = bytearray((tmp_path / "s-1.tar").read_bytes())
    raw[at : at + 512] = bytes((i * 37 + 11) % 256 for i in range(512))
    (tmp_path / "s-1.tar").write_bytes(bytes(raw))
    del want["00007"]
    return f"{tmp_path}/s-{{0..3}}.tar", want


def test_without_skip_the_open_fails_naming_the_shard(damaged):
    uri, _ = damaged
    with pytest.raises(stoker.StokerError) as e:
        stoker.open(uri)
    assert "s-1.tar" in str(e.value) or "s-2.tar" in str(e.value)


def test_skip_warns_once_and_delivers_everything_else(damaged):
    uri, want = damaged
    with pytest.warns(stoker.DamageWarning) as caught:
        ds = stoker.open(uri, on_damage="skip")
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "s-1.tar" in text and "s-2.tar" in text, text
    damage = ds.damage()
    assert sorted(d["shard"].rsplit("/", 1)[-1] for d in damage) == ["s-1.tar", "s-2.tar"]
    missing = next(d for d in damage if d["shard"].endswith("s-2.tar"))
    assert missing["samples_lost"] is None and missing["cause"] == "unreadable_shard", missing

    got = {ds[i]["__key__"]: ds[i]["bin"] for i in range(len(ds))}
    assert got == want

    with pytest.warns(stoker.DamageWarning):
        loader = stoker.Loader(uri, batch_size=4, shuffle=True, seed=3, skip_errors=True)
    keys = [k for batch in loader for k in batch["__key__"]]
    assert sorted(keys) == sorted(want)
    stats = loader.stats()
    assert len(stats["damage"]) == 2, stats["damage"]


def test_an_intact_dataset_opens_without_a_warning(tmp_path):
    write_shard(tmp_path / "s-0.tar", 0, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = stoker.open(str(tmp_path), on_damage="skip")
    assert ds.damage() == [] and len(ds) == 3
