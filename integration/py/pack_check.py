"""Read what `stoker pack` wrote with the libraries users read it with, or make LMDB fixtures.

    pack_check.py read-tar DIR    every sample of DIR/*.tar (sorted) via webdataset
    pack_check.py read-lmdb DIR   every record of DIR/data.mdb via py-lmdb
    pack_check.py make-lmdb DIR   write records given on stdin as JSON [[key, hex], ...]

Reads print JSON: [{"key": ..., "fields": [[name, hex], ...]}, ...] in reading order.
"""

import glob
import json
import os
import sys


def read_tar(path):
    import webdataset as wds

    urls = sorted(glob.glob(os.path.join(path, "*.tar")))
    if not urls:
        sys.exit(f"no .tar shards in {path}")
    out = []
    # No decoding: the bytes as stored. shardshuffle=False keeps shard order.
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        fields = [[k, v.hex()] for k, v in sample.items() if not k.startswith("__")]
        out.append({"key": sample["__key__"], "fields": fields})
    return out


def read_lmdb(path):
    import lmdb

    env = lmdb.open(path, readonly=True, lock=False, subdir=True)
    with env.begin() as txn:
        out = [{"key": k.decode(), "fields": [["data", v.hex()]]} for k, v in txn.cursor()]
    env.close()
    return out


def make_lmdb(path):
    import lmdb

    records = json.load(sys.stdin)
    env = lmdb.open(path, map_size=64 << 20)
    with env.begin(write=True) as txn:
        for key, hexval in records:
            txn.put(key.encode(), bytes.fromhex(hexval))
    env.close()
    return []


if __name__ == "__main__":
    cmd, path = sys.argv[1], sys.argv[2]
    fn = {"read-tar": read_tar, "read-lmdb": read_lmdb, "make-lmdb": make_lmdb}[cmd]
    json.dump(fn(path), sys.stdout)
