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
