"""Write test fixtures with the tools real users write them with, and print what they hold.

    python make_fixtures.py tarfile OUT.tar   # Python's tarfile, PAX format (as webdataset's ShardWriter)
    python make_fixtures.py lmdb OUTDIR       # py-lmdb, default unnamed database

Prints the expected samples as JSON: [{"key": ..., "fields": [[name, hex], ...]}, ...] in
the order a reader must return them.
"""
import io
import json
import os
import sys
import tarfile


def payload(i, n):
    return bytes((i * 31 + j * 7) % 256 for j in range(n))


def write_tarfile(out):
    # Long directory names (> 100 bytes) and non-ASCII names force PAX headers.
    deep = "/".join(["d" * 40] * 4)
    samples = []
    for i in range(12):
        if i % 3 == 0:
            key = f"{deep}/sample{i:04d}"
        elif i % 3 == 1:
            key = f"ünïcödé/{i:04d}"
        else:
            key = f"plain{i:04d}"
        fields = [("jpg", payload(i, 100 + i * 37)), ("cls", str(i).encode()), ("seg.png", payload(i + 1, 3))]
        samples.append((key, fields))
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tf:
        for key, fields in samples:
            for ext, data in fields:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 1_700_000_000
                tf.addfile(info, io.BytesIO(data))
    return [{"key": k, "fields": [[e, d.hex()] for e, d in f]} for k, f in samples]


def write_lmdb(outdir):
    import lmdb

    os.makedirs(outdir, exist_ok=True)
    env = lmdb.open(outdir, map_size=64 << 20)
    items = {}
    for i in range(40):
        # Insertion order differs from key order on purpose: readers must use key order.
        key = f"key-{(i * 17) % 40:05d}".encode()
        items[key] = payload(i, 1 + i * 53)
    with env.begin(write=True) as txn:
        for k, v in items.items():
            txn.put(k, v)
    env.close()
    return [{"key": k.decode(), "fields": [["data", items[k].hex()]]} for k in sorted(items)]


if __name__ == "__main__":
    kind, out = sys.argv[1], sys.argv[2]
    samples = {"tarfile": write_tarfile, "lmdb": write_lmdb}[kind](out)
    json.dump(samples, sys.stdout)
