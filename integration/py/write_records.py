"""Write MosaicML Streaming (MDS) shards and LitData chunks with their real writers, and print
what they hold.

    python write_records.py mds OUTDIR           # MDSWriter, several column encodings, sha1 + xxh64 hashes
    python write_records.py mds-zstd OUTDIR      # the same, compression="zstd"
    python write_records.py mds-gz OUTDIR        # the same, compression="gz"
    python write_records.py litdata OUTDIR       # litdata.optimize, dict samples
    python write_records.py litdata-zstd OUTDIR  # the same, compression="zstd" (in-file zstd frames)
    python write_records.py litdata-rows OUTDIR  # flat dicts of str/bytes/int/float: LitData stores them as an Arrow footer

Prints the expected samples as JSON: [{"key": ..., "fields": [[name, hex], ...]}, ...] in the
order Stoker returns them (shard order, then order in the shard), values by Stoker's
convention: bytes and strings as stored, numbers as decimal / shortest round-trip text, arrays
as .npy bytes (numpy.save), JSON as its text, images as their encoded bytes.
"""
import io
import json
import os
import sys
from pathlib import Path

import numpy as np

N = 40


def payload(i, n):
    return bytes((i * 31 + j * 7) % 256 for j in range(n))


def npy(arr):
    b = io.BytesIO()
    np.save(b, np.ascontiguousarray(arr), allow_pickle=False)
    return b.getvalue()


def float_text(x, dtype=np.float64):
    return np.format_float_positional(dtype(x), unique=True, trim="-")


def mds_sample(i):
    return {
        "__key__": f"sample{i:04d}",
        "jpg": payload(i, 200 + (i * 577) % 3000),
        "cls": i * 7 - 100,
        "score": i / 8 - 2.0,
        "txt": f"caption {i} ünï",
        "arr": np.arange(4, dtype=np.float32) + i,
        "varr": np.arange(i % 5 + 1, dtype=np.int16).reshape(1, -1) * (i + 1),
        "meta": {"i": i, "tags": ["a", "b"][: i % 3]},
        "u8": i % 256,
        "half": np.float16(i / 4),
    }


MDS_COLUMNS = {"__key__": "str", "jpg": "bytes", "cls": "int", "score": "float64", "txt": "str",
               "arr": "ndarray:float32:4", "varr": "ndarray", "meta": "json", "u8": "uint8", "half": "float16"}


def mds_expected(out):
    from streaming.base.format.mds.encodings import mds_encode

    # Fields come in the index's column order (MDSWriter sorts the columns by name).
    order = json.loads((Path(out) / "index.json").read_text())["shards"][0]["column_names"]
    samples = []
    for i in range(N):
        s = mds_sample(i)
        fields = [
            ["jpg", s["jpg"]],
            ["cls", str(s["cls"]).encode()],
            ["score", float_text(s["score"]).encode()],
            ["txt", s["txt"].encode()],
            ["arr", npy(s["arr"])],
            ["varr", npy(s["varr"])],
            ["meta", mds_encode("json", s["meta"])],
            ["u8", str(s["u8"]).encode()],
            ["half", float_text(s["half"], np.float16).encode()],
        ]
        fields.sort(key=lambda f: order.index(f[0]))
        samples.append({"key": s["__key__"], "fields": [[k, v.hex()] for k, v in fields]})
    return samples


def write_mds(out, compression):
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns=MDS_COLUMNS, compression=compression, hashes=["sha1", "xxh64"],
                   size_limit=1 << 14) as w:
        for i in range(N):
            w.write(mds_sample(i))
    index = json.loads((Path(out) / "index.json").read_text())
    assert len(index["shards"]) >= 3, "small shards, so there are several"
    return mds_expected(out)


def lit_item(i):
    return {
        "__key__": f"item{i:04d}",
        "jpg": payload(i, 100 + (i * 331) % 2000),
        "cls": i * 3 - 10,
        "score": i / 4 - 1.0,
        "arr": (np.arange(6, dtype=np.float32).reshape(2, 3) + i),
        "ok": i % 2 == 0,
    }


def lit_row(i):
    item = lit_item(i)
    del item["arr"]
    return item


def write_litdata(out, compression, rows=False):
    import litdata

    kwargs = {"compression": compression} if compression else {}
    litdata.optimize(fn=lit_row if rows else lit_item, inputs=list(range(N)), output_dir=str(out), chunk_bytes="16KB", num_workers=1,
                     mode="overwrite", **kwargs)
    # The order LitData itself reads them back in (chunk order), checked against what was written.
    ds = litdata.StreamingDataset(str(out))
    samples = []
    for k in range(len(ds)):
        item = ds[k]
        i = int(item["__key__"][4:])
        want = lit_item(i)
        assert bytes(item["jpg"]) == want["jpg"]
        fields = [
            ["jpg", want["jpg"]],
            ["cls", str(want["cls"]).encode()],
            ["score", float_text(want["score"]).encode()],
            ["arr", npy(want["arr"])],
            ["ok", b"1" if want["ok"] else b"0"],
        ]
        if rows:
            fields = [f for f in fields if f[0] != "arr"]
        samples.append({"key": want["__key__"], "fields": [[n, v.hex()] for n, v in fields]})
    return samples


def main():
    kind, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    # The writers (and LitData's worker processes) print progress on stdout: send the file
    # descriptor to stderr while they run, so stdout holds only the JSON.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        samples = write(kind, out)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    json.dump(samples, sys.stdout)


def write(kind, out):
    if kind.startswith("mds"):
        compression = {"mds": None, "mds-zstd": "zstd", "mds-gz": "gz"}[kind]
        return write_mds(out, compression)
    if kind == "litdata-rows":
        out_rows = write_litdata(out, None, rows=True)
        data = (out / "chunk-0-0.bin").read_bytes()
        assert data.endswith(b"LDARW01\0"), "LitData stored these rows as an Arrow footer"
        return out_rows
    return write_litdata(out, {"litdata": None, "litdata-zstd": "zstd"}[kind])


if __name__ == "__main__":
    main()
