"""One secret planted in every place a Python user can put it (keyword options, the URI's
query, an endpoint's userinfo, the environment, a mix) never shows in what Python gives
back: ``uri``, ``options``, ``repr``, ``str``, ``vars``, ``info()``, ``stats()``, exception
text. Pickles do carry it (a spawned worker must open the source), and a spawned process
opens the source from one."""

import io
import json
import multiprocessing
import os
import pickle
import socket
import subprocess
import tarfile

import pytest

import stoker

SECRET = "py-planted-secret-5521"
USER = "py-planted-user-7740"
NUMBER = 552112345678


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The embedded S3 server over a bucket of two tar shards, its secret key the planted
    secret; yields its endpoint."""
    root = tmp_path_factory.mktemp("secrets")
    shards = root / "bucket" / "tar"
    shards.mkdir(parents=True)
    for s in range(2):
        with tarfile.open(shards / f"shard-{s}.tar", "w") as tf:
            for i in range(4):
                data = f"sample {s}-{i}".encode()
                info = tarfile.TarInfo(f"k{s}{i}.txt")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    binary = os.environ.get("STOKER_S3_SERVER")
    assert binary and os.path.exists(binary), "set STOKER_S3_SERVER (integration/test.sh builds and sets it)"
    proc = subprocess.Popen(
        [binary, "--root", str(root), "--access-key", "ak", "--secret-key", SECRET, "--addr", f"127.0.0.1:{_free_port()}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on "), line
    yield "http://" + line.split()[-1]
    proc.terminate()
    proc.wait(timeout=10)


def _assert_clean(what, text):
    for s in (SECRET, USER, str(NUMBER)):
        assert s not in text, f"{what} shows {s!r}: {text}"


def _everything_shown(ds):
    """Every way a dataset shows itself, and what reading it through a Loader reports."""
    loader = stoker.Loader(ds, batch_size=3, output="numpy")
    keys = [k for batch in loader for k in batch["__key__"]]
    assert len(keys) == len(ds) == 8
    return {
        "uri": ds.uri,
        "options": repr(ds.options),
        "repr": repr(ds),
        "str": str(ds),
        "vars": repr(vars(ds)),
        "info": repr(ds.info()),
        "damage": repr(ds.damage()),
        "stats": json.dumps(loader.stats(), default=str),
        "loader vars": repr(vars(loader)),
    }


def _opened_in_a_spawned_process(ds):
    return len(ds), ds[0]["txt"]


def _check(ds):
    for what, text in _everything_shown(ds).items():
        _assert_clean(what, text)
    # The pickle carries the credentials (documented): a spawned process opens the source.
    assert SECRET.encode() in pickle.dumps(ds)
    again = pickle.loads(pickle.dumps(ds))
    assert len(again) == 8 and again[0] == ds[0]
    _assert_clean("unpickled repr and vars", repr(again) + repr(vars(again)) + again.uri + repr(again.options))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_opened_in_a_spawned_process, (ds,)) == (8, ds[0]["txt"])


def test_keyword_options(server, tmp_path):
    ds = stoker.open(
        "s3://bucket/tar", endpoint=server, access_key_id="ak", secret_access_key=SECRET, session_token=SECRET,
        disk_cache_dir=tmp_path,
    )
    assert ds.options["secret_access_key"] == "***" and ds.options["endpoint"] == server
    _check(ds)


def test_uri_query_and_endpoint_userinfo(server, tmp_path):
    userinfo = server.replace("http://", f"http://{USER}:{SECRET}@")
    ds = stoker.open(f"s3://bucket/tar?endpoint={server}&access_key_id=ak&secret_access_key={SECRET}", disk_cache=False)
    assert ds.uri.startswith("s3://bucket/tar?") and "secret_access_key=***" in ds.uri
    _check(ds)
    ds = stoker.open("s3://bucket/tar", endpoint=userinfo, access_key_id="ak", secret_access_key=SECRET, disk_cache=False)
    assert ds.options["endpoint"] == server.replace("http://", "http://***@")
    _check(ds)


def test_environment(server, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ak")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    ds = stoker.open("s3://bucket/tar", endpoint=server, disk_cache=False)
    for what, text in _everything_shown(ds).items():
        _assert_clean(what, text)
    closed = f"http://{USER}:{SECRET}@127.0.0.1:{_free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    with pytest.raises(stoker.StokerError) as e:
        stoker.open("s3://bucket/tar", attempts=1, disk_cache=False)
    _assert_clean("exception with AWS_ENDPOINT_URL", str(e.value) + repr(e.value))


def test_mixes(server, tmp_path):
    opts = {"endpoint": server, "access_key_id": "ak", "secret_access_key": SECRET, "disk_cache": False}
    ds = stoker.mix({"s3://bucket/tar": {"weight": 1, "name": "web", **opts}})
    _assert_clean("mix uri", ds.uri)
    for what, text in _everything_shown(ds).items():
        _assert_clean(f"mix {what}", text)
    # A dataset with credentials joins a mix with them.
    one = stoker.open("s3://bucket/tar", **opts)
    query = f"s3://bucket/tar?endpoint={server}&access_key_id=ak&secret_access_key={SECRET}"
    both = stoker.mix([(one, 1, {"name": "a"}), (query, 1, {"name": "b"})])
    _assert_clean("mix of datasets", both.uri + repr(both.options) + repr(vars(both)) + repr(both))
    assert len(both) == 16
    assert SECRET.encode() in pickle.dumps(both)
    # Mistakes made in Python, and mix files that do not parse.
    with pytest.raises(stoker.InvalidInputError) as e:
        stoker.mix({f"s3://bucket/tar?secret_access_key={SECRET}": "heavy"})
    _assert_clean("bad weight", str(e.value))
    with pytest.raises(stoker.InvalidInputError) as e:
        stoker.mix([(f"s3://bucket/tar?endpoint=http://{USER}:{SECRET}@h&x=1",)])
    _assert_clean("bad mix entry", str(e.value))
    # As a JSON or YAML config gives them: lists, and a wrong one shown without its options.
    with pytest.raises(stoker.InvalidInputError) as e:
        stoker.mix([["s3://bucket/tar", 1, {"secret_access_key": SECRET}, "extra"]])
    _assert_clean("bad mix list", str(e.value))
    listed = stoker.mix([["s3://bucket/tar", 1, {**opts, "name": "a"}]])
    assert len(listed) == 8
    # A source without a scheme: its options, and an endpoint's user info, are redacted too.
    spec = {"sources": [{"uri": f"/p/x.tar?session_token={SECRET}", "weight": 1,
                         "options": {"endpoint": f"{USER}:{SECRET}@h:9000"}}]}
    shown = stoker._stoker.redact("mix:" + json.dumps(spec))
    _assert_clean("scheme-less mix", shown)
    assert "/p/x.tar" in shown
    for i, text in enumerate(
        [
            f'[[sources]]\nuri = "s3://bucket/tar"\nweight = 1\noptions = {{ secret_access_key = "{SECRET}" junk }}\n',
            f'[[sources]]\nuri = "s3://bucket/tar"\nweight = 1\noptions = {{ secret_access_key = {NUMBER} }}\n',
        ]
    ):
        path = tmp_path / f"bad{i}.mix.toml"
        path.write_text(text)
        with pytest.raises(stoker.InvalidInputError) as e:
            stoker.open(path)
        _assert_clean(f"mix file {i}", str(e.value))


def test_exceptions(server):
    closed = f"http://{USER}:{SECRET}@127.0.0.1:{_free_port()}"
    cases = [
        dict(endpoint=server, access_key_id="ak", secret_access_key=SECRET + "-wrong", attempts=1),
        dict(endpoint=closed, access_key_id="ak", secret_access_key=SECRET, attempts=1),
        dict(endpoint=f"http://{USER}:pl/{SECRET}@h:1", access_key_id="ak", secret_access_key=SECRET),
        dict(endpoint=server, access_key_id="ak", secret_access_key=NUMBER),
        dict(endpoint=server, secret_access_key=SECRET, colour="red"),
    ]
    for options in cases:
        with pytest.raises(stoker.StokerError) as e:
            stoker.open("s3://bucket/tar", disk_cache=False, **options)
        _assert_clean(f"exception for {sorted(options)}", str(e.value) + repr(e.value))
    with pytest.raises(stoker.StokerError) as e:
        stoker.Loader(f"s3://bucket/nope?endpoint={closed}&secret_access_key={SECRET}&attempts=1", batch_size=2)
    _assert_clean("Loader exception", str(e.value))


def test_torch_iterable_dataset(server):
    pytest.importorskip("torch")
    from stoker.torch import IterableDataset

    ds = IterableDataset("s3://bucket/tar", endpoint=server, access_key_id="ak", secret_access_key=SECRET)
    _assert_clean("IterableDataset", ds.uri + repr(ds.options) + repr(vars(ds)) + repr(ds))
    again = pickle.loads(pickle.dumps(ds))
    assert len(list(again)) == 8
