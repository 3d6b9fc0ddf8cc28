"""Write HDF5 files with h5py and print what Stoker must read from them.

    python write_hdf5.py mixed OUTDIR
    python write_hdf5.py latest OUTDIR

`mixed`: a-00000.h5 (37 rows) and b.hdf5 (23 rows), h5py's default file format, with one
dataset per case of the field convention, stored every way h5py stores them:
  image   variable-length uint8 (encoded bytes), chunked, gzip     -> the bytes
  label   int64, contiguous                                        -> decimal text
  score   float32, chunked, shuffle + gzip                         -> shortest round-trip text
  weight  big-endian float64, contiguous                           -> shortest round-trip text
  flag    bool                                                     -> 1 / 0
  emb     float32 (N, 8), chunked (4, 8), gzip                     -> .npy <f4 (8,)
  pixels  uint8 (N, 6, 5, 3), chunked, lzf                         -> .npy |u1 (6, 5, 3)
  meta/ids big-endian int16 (N, 3), in a group                     -> .npy <i2 (3,), field meta.ids
  name    variable-length UTF-8 strings                            -> the UTF-8 bytes
  code    fixed-length S8, null-padded                             -> the bytes before the padding
  audio   variable-length float32 sequences                        -> .npy <f4 (len,)
plus what is not a per-sample dataset and is left out: a scalar `version`, and `classes` (10
strings, a first dimension of its own).
`latest`: c.h5 with libver="latest" (version 2 superblock, v2 object headers, link messages,
chunks indexed by a fixed array, an extensible array and a v2 B-tree): label, emb, image, grid,
and the samples' keys in a `__key__` dataset of strings.

Prints [{"key": "a-00000/000000000", "fields": [[name, hex], ...]}, ...] in Stoker's order.

    python write_hdf5.py claims OUTDIR

`claims`: d.h5, whose one dataset claims a billion rows and holds none (what a lying header
looks like to a reader).

    python write_hdf5.py gzip OUTDIR

`gzip`: g.h5, 400 rows of `data` (16 KiB of random uint8 a row, chunks of 8 rows, gzip) and
`label` (int64, contiguous): 50 compressed chunks of 128 KiB, more than a 1 MiB decoded-chunk
memory holds (for the test that a shuffled pass decodes each chunk once).

    python write_hdf5.py badkeys OUTDIR

`badkeys`: q.h5, whose `__key__` dataset holds byte strings that are not UTF-8 (b"k\\xff",
b"k\\xfe"), one with a backslash, and a plain one; prints the keys Stoker gives them.

    python write_hdf5.py external OUTDIR

`external`: e.h5, with `label` in the file, `data` kept in raw.bin beside it (HDF5 external
storage), and `linked`, an external link to a dataset of other.hdf.

    python write_hdf5.py chunks FILE DATASET

prints where the chunks of DATASET lie in FILE: [[byte offset, stored size], ...] (for the tests
that damage one).
"""
import io
import json
import os
import sys

import h5py
import numpy as np


def npy(a):
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a))
    return buf.getvalue()


def f_text(v):
    # Shortest text that reads back to the same float (Rust's float Display).
    return np.format_float_positional(v, unique=True, trim="-").encode()


def mixed(path, stem, n, seed):
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, rng.integers(50, 900), dtype=np.uint8) for _ in range(n)]
    label = rng.integers(-(2**40), 2**40, n, dtype=np.int64)
    score = rng.random(n, dtype=np.float32) * 100
    weight = rng.random(n) / 3
    flag = rng.random(n) < 0.5
    emb = rng.standard_normal((n, 8), dtype=np.float32)
    pixels = (rng.integers(0, 3, (n, 6, 5, 3)) * 60).astype(np.uint8)  # compressible: LZF has work
    ids = rng.integers(-30000, 30000, (n, 3), dtype=np.int16)
    names = ["sample %d é%s" % (i, "x" * (i % 7)) for i in range(n)]
    codes = [("c%d" % (i * 7919 % 100000)).encode() for i in range(n)]
    audio = [rng.standard_normal(rng.integers(0, 20), dtype=np.float32) for _ in range(n)]
    with h5py.File(path, "w") as f:
        d = f.create_dataset("image", (n,), dtype=h5py.vlen_dtype(np.uint8), chunks=(8,), compression="gzip")
        for i, im in enumerate(images):
            d[i] = im
        f.create_dataset("label", data=label)
        f.create_dataset("score", data=score, chunks=(5,), shuffle=True, compression="gzip")
        f.create_dataset("weight", data=weight.astype(">f8"))
        f.create_dataset("flag", data=flag)
        f.create_dataset("emb", data=emb, chunks=(4, 8), compression="gzip", compression_opts=6)
        f.create_dataset("pixels", data=pixels, chunks=(3, 6, 5, 3), compression="lzf")
        f.create_group("meta").create_dataset("ids", data=ids.astype(">i2"))
        f.create_dataset("name", data=names, dtype=h5py.string_dtype("utf-8"))
        f.create_dataset("code", data=np.array(codes, dtype="S8"))
        a = f.create_dataset("audio", (n,), dtype=h5py.vlen_dtype(np.float32))
        for i, x in enumerate(audio):
            a[i] = x
        f.create_dataset("version", data=3)
        f.create_dataset("classes", data=["class %d" % k for k in range(10)], dtype=h5py.string_dtype())
    out = []
    for i in range(n):
        fields = {
            "image": images[i].tobytes(),
            "label": str(label[i]).encode(),
            "score": f_text(score[i]),
            "weight": f_text(weight[i]),
            "flag": b"1" if flag[i] else b"0",
            "emb": npy(emb[i]),
            "pixels": npy(pixels[i]),
            "meta.ids": npy(ids[i].astype("<i2")),
            "name": names[i].encode(),
            "code": codes[i],
            "audio": npy(audio[i]),
        }
        out.append({"key": "%s/%09d" % (stem, i), "fields": [[k, v.hex()] for k, v in sorted(fields.items())]})
    return out


def latest(path, stem, n, seed):
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 1000, n, dtype=np.int32)
    emb = rng.standard_normal((n, 4), dtype=np.float32)
    images = [rng.integers(0, 256, rng.integers(10, 300), dtype=np.uint8).tobytes() for _ in range(n)]
    with h5py.File(path, "w", libver="latest") as f:
        # Fixed-size chunked: a fixed array index; resizable along one axis: an extensible
        # array; along two: a version 2 B-tree.
        f.create_dataset("label", data=label, chunks=(16,), compression="gzip")
        e = f.create_dataset("emb", (n, 4), dtype=np.float32, chunks=(7, 4), maxshape=(None, 4))
        e[:] = emb
        im = f.create_dataset("image", (n,), dtype=h5py.vlen_dtype(np.uint8), chunks=(9,), maxshape=(None,))
        for i, b in enumerate(images):
            im[i] = np.frombuffer(b, dtype=np.uint8)
        g = f.create_dataset("grid", (n, 2), dtype=np.uint8, chunks=(5, 1), maxshape=(None, None))
        g[:] = np.arange(2 * n, dtype=np.uint8).reshape(n, 2)
        keys = ["%s/row-%d-of-%d" % (stem, i, n) for i in range(n)]
        f.create_dataset("__key__", data=keys, dtype=h5py.string_dtype())
    out = []
    for i in range(n):
        fields = {
            "label": str(label[i]).encode(),
            "emb": npy(emb[i]),
            "image": images[i],
            "grid": npy(np.arange(2 * n, dtype=np.uint8).reshape(n, 2)[i]),
        }
        out.append({"key": keys[i], "fields": [[k, v.hex()] for k, v in sorted(fields.items())]})
    return out


def main():
    if sys.argv[1] == "chunks":
        with h5py.File(sys.argv[2], "r") as f:
            d = f[sys.argv[3]].id
            json.dump([[c.byte_offset, c.size] for c in map(d.get_chunk_info, range(d.get_num_chunks()))], sys.stdout)
        return
    kind, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    if kind == "mixed":
        rows = mixed(os.path.join(outdir, "a-00000.h5"), "a-00000", 37, 1)
        rows += mixed(os.path.join(outdir, "b.hdf5"), "b", 23, 2)
    elif kind == "claims":
        # A billion rows claimed and none written (chunks never allocated): a few KB of file.
        with h5py.File(os.path.join(outdir, "d.h5"), "w") as f:
            f.create_dataset("label", (10**9,), dtype=np.int64, chunks=(1024,))
        rows = []
    elif kind == "gzip":
        rng = np.random.default_rng(7)
        n = 400
        data = rng.integers(0, 256, (n, 16384), dtype=np.uint8)
        with h5py.File(os.path.join(outdir, "g.h5"), "w") as f:
            f.create_dataset("data", data=data, chunks=(8, 16384), compression="gzip")
            f.create_dataset("label", data=np.arange(n, dtype=np.int64))
        rows = [{"key": "g/%09d" % i, "fields": [["data", npy(data[i]).hex()], ["label", str(i).encode().hex()]]}
                for i in range(n)]
    elif kind == "clash":
        # A group's dataset and a root dataset whose names join the same way.
        with h5py.File(os.path.join(outdir, "k.h5"), "w") as f:
            f["meta/ids"] = np.arange(5)
            f["meta.ids"] = np.arange(5) + 100
        rows = []
    elif kind == "fill":
        # One row of 512 MB never written (its value the fill value): 1.4 KB of file.
        with h5py.File(os.path.join(outdir, "f.h5"), "w") as f:
            f.create_dataset("x", shape=(1, 64_000_000), dtype="f8")
        rows = []
    elif kind == "links":
        # Fifteen groups, each linking the next four ways (hard links, no cycle): 19 KB whose
        # paths to the last group number 4^14.
        with h5py.File(os.path.join(outdir, "l.h5"), "w") as f:
            f["x"] = np.arange(5)
            gs = [f.create_group("g%d" % i) for i in range(15)]
            for i in range(14):
                for k in range(4):
                    gs[i]["l%d" % k] = gs[i + 1]
        rows = []
    elif kind == "bigchunk":
        # Rows of 20 MB in chunks of one row, zeros under gzip: 40 KB of file.
        with h5py.File(os.path.join(outdir, "z.h5"), "w") as f:
            f.create_dataset("data", (2, 20_000_000), dtype=np.uint8, chunks=(1, 20_000_000), compression="gzip",
                             data=np.zeros((2, 20_000_000), np.uint8))
        rows = []
    elif kind == "badkeys":
        # Keys of bytes that are not UTF-8, two differing only there, and one with a backslash.
        keys = [b"k\xff", b"k\xfe", b"a\\b", b"plain"]
        with h5py.File(os.path.join(outdir, "q.h5"), "w") as f:
            f.create_dataset("__key__", data=np.array(keys, dtype="S8"))
            f.create_dataset("label", data=np.arange(4, dtype=np.int64))
        shown = ["k\\xff", "k\\xfe", "a\\\\b", "plain"]
        rows = [{"key": k, "fields": [["label", str(i).encode().hex()]]} for i, k in enumerate(shown)]
    elif kind == "external":
        # `label` inside the file; `data`'s values in raw.bin beside it (external storage).
        raw = os.path.join(outdir, "raw.bin")
        np.arange(12, dtype=np.int64).tofile(raw)
        with h5py.File(os.path.join(outdir, "e.h5"), "w") as f:
            f.create_dataset("label", data=np.arange(12, dtype=np.int64))
            f.create_dataset("data", (12,), dtype=np.int64, external=[("raw.bin", 0, 96)])
            f["linked"] = h5py.ExternalLink("other.hdf", "/x")
        with h5py.File(os.path.join(outdir, "other.hdf"), "w") as f:
            f["x"] = np.arange(12)
        rows = []
    elif kind == "selfcheck":
        # A chunked dataset (h5py's default v1 B-tree index) and a label beside it: the test
        # damages the dataspace or the chunk index.
        img = (np.arange(8 * 16 * 16) % 251 + 1).astype(np.uint8).reshape(8, 16, 16)
        with h5py.File(os.path.join(outdir, "s.h5"), "w") as f:
            f.create_dataset("image", data=img, chunks=(2, 16, 16), compression="gzip")
            f.create_dataset("label", data=np.arange(8, dtype=np.int64))
        rows = []
    elif kind == "latest":
        rows = latest(os.path.join(outdir, "c.h5"), "c", 61, 3)
    else:
        raise SystemExit("unknown kind " + kind)
    json.dump(rows, sys.stdout)


if __name__ == "__main__":
    main()
