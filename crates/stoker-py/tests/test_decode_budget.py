"""Huge images cost a Python exception, never the interpreter: a 16-bit RGBA PNG whose
working memory is more than the decode threads' budget allows, or whose bytes are more than
``max_pixels`` allows, raises ``stoker.DecodeError`` (a ``StokerError``) naming the option
to raise; within the budget it decodes. (No torch: ``output="numpy"``.)"""

import io
import struct
import tarfile
import zlib

import numpy
import pytest

import stoker

SIDE = 2000  # 16-bit RGBA: 32 MB of codec output, 12 MB of RGB, from about 60 KB
MIB = 1 << 20


def flat_rgba16_png(side: int, rgba) -> bytes:
    """One colour; rows after the first filtered `Up`, so all zeros: a small file."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    first = b"\x00" + struct.pack(">4H", *rgba) * side
    rest = b"\x02" + bytes(8 * side)
    z = zlib.compressobj(9)
    idat = z.compress(first) + b"".join(z.compress(rest) for _ in range(side - 1)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 16, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("huge")
    body = flat_rgba16_png(SIDE, (0x1234, 0x5678, 0x9ABC, 0xFFFF))
    assert len(body) < 200_000
    with tarfile.open(root / "train-000.tar", "w") as tf:
        for i in range(4):
            info = tarfile.TarInfo(f"{i:04d}.png")
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    return root


def loader(root, **kw):
    image = kw.pop("image", {})
    spec = {"png": stoker.Image(16, crop="squash", **image)}
    return stoker.Loader(str(root), batch_size=4, decode=spec, output="numpy", decode_threads=4, **kw)


def test_within_the_budget_every_image_decodes(root):
    batch = next(iter(loader(root, decode_memory_bytes=256 * MIB)))
    px = batch["png"]
    assert px.shape == (4, 16, 16, 3)
    # PIL keeps the high byte of 16-bit samples.
    assert (px == numpy.array([0x12, 0x56, 0x9A], dtype=numpy.uint8)).all()


def test_an_image_over_the_budget_is_a_decode_error(root):
    with pytest.raises(stoker.DecodeError, match="decode_memory_bytes") as e:
        next(iter(loader(root, decode_memory_bytes=32 * MIB)))
    assert isinstance(e.value, stoker.StokerError)
    assert "2000x2000" in str(e.value) and "0000" in str(e.value)


def test_max_pixels_counts_16_bit_rgba_by_bytes(root):
    # 4 M pixels, but 32 MB of samples: as much as 10.7 M pixels of 8-bit RGB.
    with pytest.raises(stoker.DecodeError, match="max_pixels=5000000"):
        next(iter(loader(root, image={"max_pixels": 5_000_000})))
    assert next(iter(loader(root, image={"max_pixels": 11_000_000})))["png"].shape == (4, 16, 16, 3)


def test_a_zero_budget_is_refused(root):
    with pytest.raises(stoker.InvalidInputError, match="decode_memory_bytes"):
        loader(root, decode_memory_bytes=0)
