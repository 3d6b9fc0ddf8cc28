"""Exceptions follow the error's kind: a missing object raises NotFoundError whether or not the
read went through the block cache's shared fetch, and a step that raised is the cause."""

import io
import tarfile

import pytest

import stoker


def _shards(root, n: int = 2, per: int = 3) -> None:
    root.mkdir(parents=True)
    for s in range(n):
        with tarfile.open(root / f"shard-{s}.tar", "w") as tf:
            for i in range(per):
                data = f"sample {s}-{i}".encode()
                info = tarfile.TarInfo(f"k{s}{i}.txt")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def test_a_missing_shard_is_not_found_with_or_without_the_cache(data, s3) -> None:
    _shards(data / "bucket" / "errors-tar")
    cached = stoker.open(s3("errors-tar"), cache_bytes=1 << 20, disk_cache=False)
    direct = stoker.open(s3("errors-tar"), cache_bytes=0, disk_cache=False)
    assert len(cached) == len(direct) == 6
    (data / "bucket" / "errors-tar" / "shard-1.tar").unlink()
    for ds in (cached, direct):
        with pytest.raises(stoker.NotFoundError, match="shard-1.tar"):
            ds[4]
        with pytest.raises(stoker.NotFoundError, match="shard-1.tar"):
            ds.get_many([3, 4, 5])
        assert ds[0]["txt"] == b"sample 0-0"


def test_a_step_that_raised_is_the_cause(data) -> None:
    class Boom(Exception):
        pass

    def step() -> None:
        raise Boom("out of memory in my model")

    with pytest.raises(stoker.StokerError, match="out of memory in my model") as e:
        stoker.diagnose(data / "bucket" / "tar", batch_size=8, step=step, samples=16, seconds=5)
    assert not isinstance(e.value, (stoker.InvalidInputError, stoker.RemoteError)), repr(e.value)
    assert isinstance(e.value.__cause__, Boom), repr(e.value.__cause__)


@pytest.mark.parametrize("bad", [float("nan"), 1.5, float("inf"), True, "2", None, 0, 2**64])
def test_transform_threads_must_be_a_whole_number_in_range(data, bad) -> None:
    # NaN passed `< 1` and hung the pool; 1.5 and True were taken as counts.
    with pytest.raises(stoker.InvalidInputError, match="transform_threads"):
        stoker.Loader(data / "bucket" / "tar", batch_size=4, transform=lambda s: s, transform_threads=bad)


def test_a_misspelt_argument_beside_an_open_dataset_is_refused(data) -> None:
    # Source options go to stoker.open(): beside an opened dataset they were dropped silently,
    # and a misspelt argument (suffle=True) read the data in storage order.
    ds = stoker.open(data / "bucket" / "tar")
    with pytest.raises(stoker.InvalidInputError, match="'suffle'.*stoker.open"):
        stoker.Loader(ds, batch_size=4, suffle=True)
    with pytest.raises(stoker.InvalidInputError, match="'cache_bytes'"):
        stoker.Loader(ds, batch_size=4, cache_bytes=1 << 20)
    # With a URI the loader opens, an unknown option is the source's error, naming it.
    with pytest.raises(stoker.InvalidInputError, match="suffle"):
        stoker.Loader(data / "bucket" / "tar", batch_size=4, suffle=True)
    # skip_errors with an open dataset is the loader's own policy, not a source option.
    assert sum(len(b["__key__"]) for b in stoker.Loader(ds, batch_size=4, skip_errors=True)) == len(ds)


def test_a_state_that_is_not_a_loaders_is_refused_not_a_fresh_start(data) -> None:
    loader = stoker.Loader(data / "bucket" / "tar", batch_size=4, shuffle=True)
    for bad in ({}, {"epoch": 0, "batch": 3, "documents": 9}, {"epoch": "x", "loader": None}, [1, 2],
                {"epoch": True, "loader": None}, {"epoch": 1, "loader": [1]}):
        with pytest.raises(stoker.InvalidInputError, match="state"):
            loader.load_state_dict(bad)  # type: ignore[arg-type]
    import numpy

    loader.load_state_dict({"epoch": numpy.int64(2), "loader": None})  # an epoch's start is a state
    assert loader.state_dict()["epoch"] == 2


def test_collate_fn_without_a_transform_is_refused(data) -> None:
    # It would never run: batches are built in Rust without a transform.
    with pytest.raises(stoker.InvalidInputError, match="collate_fn"):
        stoker.Loader(data / "bucket" / "tar", batch_size=4, collate_fn=list)


def test_a_sample_python_cannot_hold_is_a_memory_error_not_a_panic(tmp_path) -> None:
    # Python's bytes for a 64 MB sample under an address-space limit with 40 MB to spare:
    # PyBytes::new panicked on the failed allocation (a PanicException, "pointer is null").
    import subprocess
    import sys

    (tmp_path / "big.bin").write_bytes(bytes(64 << 20))
    script = f"""
import resource, stoker
ds = stoker.open({str(tmp_path)!r}, layout="objects")
assert len(ds[0]["bin"]) == 64 << 20
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (40 << 20), resource.RLIM_INFINITY))
try:
    ds.get_many([0])
except MemoryError:
    print("MemoryError")
except stoker.StokerError as e:  # the read's own allocation failed first: an error too
    print("StokerError" if "allocate" in str(e) else repr(e))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    # Not a PanicException (not caught above: a traceback and no line), nor an abort.
    assert out.returncode == 0 and out.stdout.strip() in ("MemoryError", "StokerError"), out.stdout + out.stderr[-2000:]


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: stoker.Image(1.5), "size"),
        (lambda: stoker.Image((224, "x")), "size"),
        (lambda: stoker.Image(True), "size"),
        (lambda: stoker.Image((1, 2, 3)), "size"),
        (lambda: stoker.Image(224, flip="yes"), "flip"),
        (lambda: stoker.Image(224, mean=[float("nan")] * 3, std=[1, 1, 1]), "mean"),
        (lambda: stoker.Image(224, crop="center", resize=256.5), "resize"),
        (lambda: stoker.Image(224, grayscale=float("inf")), "grayscale"),
        (lambda: stoker.Tokens("tokenizer.json", seq_len=1.5), "seq_len"),
        (lambda: stoker.Tokens("tokenizer.json", seq_len=64, truncate="no"), "truncate"),
        (lambda: stoker.Bytes(shape=[2.5]), "shape"),
        (lambda: stoker.Npy(shape=["3"]), "shape"),
    ],
)
def test_decode_specs_refuse_values_they_would_have_coerced(make, name) -> None:
    # seq_len=1.5 was 1, truncate="no" was True, size=1.5 failed deep inside with an unpacking error.
    with pytest.raises(stoker.InvalidInputError, match=name):
        make()
    # numpy's integers and bools are what they say.
    import numpy

    assert stoker.Tokens("t.json", seq_len=numpy.int64(64), truncate=numpy.bool_(False)).spec["seq_len"] == 64
    assert stoker.Image(numpy.int32(32)).spec["size"] == [32, 32]
    assert stoker.Image(numpy.array([24, 32])).spec["size"] == [24, 32]
    assert stoker.Image([24, 32]).spec["size"] == [24, 32]


@pytest.mark.parametrize("opts", [{"concurrency": "x"}, {"concurrency": 1.5}, {"cache_bytes": -1}, {"disk_cache": "no"},
                                  {"concurrency": float("nan")}, {"hedge_ms": float("inf")}])
def test_an_option_of_the_wrong_type_is_named(data, opts) -> None:
    (name,) = opts
    with pytest.raises(stoker.InvalidInputError, match=name) as e:
        stoker.open(data / "bucket" / "tar", **opts)
    assert "column" not in str(e.value), str(e.value)


@pytest.mark.parametrize("kw", [{"batch_size": 2**70}, {"batch_size": -1}, {"batch_size": 1.5}, {"seed": -1},
                                {"prefetch": 2**64}, {"max_bytes_in_flight": -5}, {"world_size": "2"}])
def test_a_count_out_of_range_names_its_argument(data, kw) -> None:
    # The extension's conversion said "int too big to convert", naming nothing.
    args = {"batch_size": 4, **kw}
    (name,) = kw
    with pytest.raises(stoker.InvalidInputError, match=name):
        stoker.Loader(data / "bucket" / "tar", **args)
    if name in ("seed", "prefetch", "world_size"):
        with pytest.raises(stoker.InvalidInputError, match=name):
            stoker.TokenLoader(data / "bucket" / "tar", seq_len=8, global_batch=2, **kw)
