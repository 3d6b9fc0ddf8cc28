"""A corpus of small hostile files: each must cost an error, within seconds and a few hundred
MiB, never the process. Written with the standard library only, so every test suite (Rust,
CLI, Python) can make it.

    python hostile.py OUTDIR    # prints a JSON list: {"name", "path", "kind", "options"}

`path` is relative to OUTDIR; `kind` is the ErrorKind expected (`corrupt`, `invalid_input`);
`options` a query string to open it with.
"""

import gzip
import io
import json
import struct
import sys
import tarfile
from pathlib import Path

from thrift_compact import R, get, read_footer, write_struct, write_with_footer


def mds_shard(items):
    """An uncompressed MDS shard of `items` (bytes) in one `bytes` column."""
    payload = [struct.pack("<I", len(i)) + i for i in items]
    header = 4 + 4 * (len(items) + 1)
    offsets = [header]
    for p in payload:
        offsets.append(offsets[-1] + len(p))
    return struct.pack("<I", len(items)) + b"".join(struct.pack("<I", o) for o in offsets) + b"".join(payload)


def mds_index(samples, raw_bytes, compression=None, zip_name=None, zip_bytes=None):
    shard = {
        "column_encodings": ["bytes"],
        "column_names": ["x"],
        "column_sizes": [None],
        "compression": compression,
        "format": "mds",
        "hashes": [],
        "raw_data": {"basename": "shard.00000.mds", "hashes": {}},
        "samples": samples,
        "size_limit": 1 << 26,
        "version": 2,
        "zip_data": None,
    }
    if raw_bytes is not None:
        shard["raw_data"]["bytes"] = raw_bytes
    if zip_name:
        shard["zip_data"] = {"basename": zip_name, "bytes": zip_bytes, "hashes": {}}
    return {"version": 2, "shards": [shard]}


def gzip_bomb(prefix, zeros):
    """`prefix` then `zeros` zero bytes, gzip-compressed (about 1 KB per MiB)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as g:
        g.write(prefix)
        chunk = b"\0" * (1 << 24)
        for _ in range(zeros >> 24):
            g.write(chunk)
    return buf.getvalue()


def write(out):
    cases = []

    def case(name, kind, options=""):
        cases.append({"name": name, "path": name, "kind": kind, "options": options})
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    items = [b"aaa", b"bbbb", b"cc"]
    raw = mds_shard(items)

    # 10^15 samples in a shard of a few bytes: refused before anything is sized by the count.
    d = case("mds_count", "corrupt")
    (d / "shard.00000.mds").write_bytes(raw)
    (d / "index.json").write_text(json.dumps(mds_index(10**15, len(raw))))

    # The same count with no size in the index: the offset table it implies is past the end.
    d = case("mds_count_unsized", "corrupt")
    (d / "shard.00000.mds").write_bytes(raw)
    (d / "index.json").write_text(json.dumps(mds_index(10**15, None)))

    # A gzip bomb (768 MiB of zeros after the shard) whose index claims 1000 bytes.
    bomb = gzip_bomb(raw, 768 << 20)
    d = case("mds_gz_bomb_claimed", "corrupt")
    (d / "shard.00000.mds.gz").write_bytes(bomb)
    (d / "index.json").write_text(json.dumps(mds_index(3, 1000, "gz", "shard.00000.mds.gz", len(bomb))))

    # The same bomb with no claim, read with decoded_bytes=64MiB: stopped at the budget.
    d = case("mds_gz_bomb_unclaimed", "invalid_input", "decoded_bytes=67108864")
    (d / "shard.00000.mds.gz").write_bytes(bomb)
    (d / "index.json").write_text(json.dumps(mds_index(3, None, "gz", "shard.00000.mds.gz", len(bomb))))

    # An index of 30,000 shard entries (8 MB) whose shards are not there: parsing it must
    # cost about twice its size, not a JSON tree of it (8x).
    d = case("mds_huge_index", "not_found")
    entry = json.dumps(mds_index(1000, 1 << 26)["shards"][0])
    with open(d / "index.json", "w") as f:
        f.write('{"version": 2, "shards": [')
        f.write(",".join(entry.replace("shard.00000.mds", f"shard.{i:07d}.mds") for i in range(30_000)))
        f.write("]}")

    # LitData: a chunk of a few bytes whose index claims 10^15 items.
    d = case("litdata_count", "corrupt")
    chunk = mds_shard(items)
    (d / "chunk-0-0.bin").write_bytes(chunk)
    index = {
        "chunks": [{"chunk_bytes": len(chunk), "chunk_size": 10**15, "dim": None, "filename": "chunk-0-0.bin"}],
        "config": {
            "chunk_bytes": 1 << 26,
            "chunk_size": None,
            "compression": None,
            "data_format": ["bytes"],
            "data_spec": json.dumps([1, {"type": None, "context": None, "children_spec": []}]),
            "encryption": None,
            "item_loader": "PyTreeLoader",
        },
        "updated_at": "0",
    }
    (d / "index.json").write_text(json.dumps(index))

    # Token files whose first bytes already refuse them, with 300 MiB behind (sparse: no disk
    # used; more than the memory a case may take) that was read whole before: a Megatron .idx whose counts need 62 bytes, and a
    # LitData token chunk whose count is not its index's.
    d = case("megatron_idx_padded", "corrupt")
    idx = b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, 4, 1, 2)  # one sequence of int32, two document indices
    with open(d / "x.idx", "wb") as f:
        f.write(idx + struct.pack("<iqqq", 3, 0, 0, 1))
        f.truncate(300 << 20)
    (d / "x.bin").write_bytes(b"\0" * 12)
    d = case("litdata_token_table", "corrupt")
    with open(d / "chunk-0-0.bin", "wb") as f:
        f.write(struct.pack("<II", 3, 8))
        f.truncate(300 << 20)
    tokens_index = {
        "chunks": [{"chunk_bytes": 300 << 20, "chunk_size": 70_000_000, "dim": None, "filename": "chunk-0-0.bin"}],
        "config": {"chunk_bytes": 300 << 20, "chunk_size": None, "compression": None, "data_format": ["no_header_numpy:2"],
                   "data_spec": None, "encryption": None, "item_loader": "TokensLoader"},
        "updated_at": "0",
    }
    (d / "index.json").write_text(json.dumps(tokens_index))

    # A tar member whose size field claims 10^15 bytes.
    d = case("tar_size_bomb", "corrupt")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(3):
            data = b"x" * 100
            info = tarfile.TarInfo(f"k{i}.bin")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    b = bytearray(buf.getvalue())
    # Member 1's header is at 1024 (a 512-byte header and one block of payload before it):
    # its size field (12 octal bytes at 124) claims 8 GiB, the most octal can say.
    b[1024 + 124 : 1024 + 136] = b"%011o\0" % (8**11 - 1)
    b[1024 + 148 : 1024 + 156] = b" " * 8
    b[1024 + 148 : 1024 + 156] = b"%06o\0 " % sum(b[1024 : 1024 + 512])
    (d / "s.tar").write_bytes(bytes(b))

    # Parquet footers whose claims a reader must not follow (pyarrow refuses the first two):
    # a row group of -5 rows (read as empty, its rows were dropped) or of 2^63 - 1 (Python's
    # len() failed with an empty OverflowError), a column chunk of -1 bytes (the parquet
    # crate asserts on it: a panic), an offset index with two pages
    # swapped or every page's first row moved (a row selection followed it to other rows than
    # asked for), and a schema nested 20,000 deep.
    import pyarrow as pa
    import pyarrow.parquet as pq

    def parquet(name, edit, options="", group=100, batch=16, page=1024):
        d = case(name, "corrupt", options)
        p = d / "v.parquet"
        rows = 300
        table = pa.table({"n": pa.array(range(rows), pa.int64()), "text": [f"row {i:05d} " + "x" * 40 for i in range(rows)]})
        pq.write_table(table, p, compression="none", use_dictionary=False, write_page_index=True, data_page_size=page,
                       row_group_size=group, write_batch_size=batch)
        body, fm = read_footer(p)
        edit(p, body, fm)

    def negative_rows(p, body, fm):
        get(get(fm, 4)[2][1][0], 3)[2] = -5  # row group 0's num_rows
        write_with_footer(p, body, fm)

    def rows_past_values(p, body, fm):
        get(get(fm, 4)[2][1][0], 3)[2] = 2**63 - 1  # row group 0 claims 2^63 - 1 rows, its columns 100 values
        write_with_footer(p, body, fm)

    def negative_chunk(p, body, fm):
        meta = get(get(get(fm, 4)[2][1][0], 1)[2][1][1], 3)[2]  # row group 0, column `text`: its ColumnMetaData
        get(meta, 7)[2] = -1  # total_compressed_size
        write_with_footer(p, body, fm)

    def swapped_pages(p, body, fm):
        raw = bytearray(p.read_bytes())
        col = get(get(fm, 4)[2][1][0], 1)[2][1][1]  # row group 0, column `text`
        at, length = get(col, 4)[2], get(col, 5)[2]  # its offset index: where, how long
        index = R(raw, at).struct()
        pages = get(index, 1)[2][1]
        for fid in (1, 2):  # two pages' offsets and sizes traded
            a, b = get(pages[1], fid), get(pages[2], fid)
            a[2], b[2] = b[2], a[2]
        forged = write_struct(index)
        assert len(forged) == length
        raw[at : at + length] = forged
        p.write_bytes(bytes(raw))

    def shifted_index(p, body, fm):
        raw = bytearray(p.read_bytes())
        col = get(get(fm, 4)[2][1][0], 1)[2][1][1]
        at, length = get(col, 4)[2], get(col, 5)[2]
        index = R(raw, at).struct()
        # Every page from the fourth on starts 2 rows late: the pages between it and the last
        # keep their true counts, so a read of one of them alone would take other rows. The
        # first rows (pages 0 and 1) are true: only the last page's head shows the lie.
        for page in get(index, 1)[2][1][3:]:
            get(page, 3)[2] += 2
        forged = write_struct(index)
        assert len(forged) == length
        raw[at : at + length] = forged
        p.write_bytes(bytes(raw))

    def deep_schema(p, body, fm):
        # A chain of 20,000 groups, one in the next (about 140 KB): building it by recursion
        # overflowed the stack.
        group = [[3, 5, 0], [4, 8, b"g"], [5, 5, 1]]
        leaf = [[1, 5, 2], [3, 5, 0], [4, 8, b"x"]]
        get(fm, 2)[2] = (12, [[[4, 8, b"schema"], [5, 5, 1]]] + [group] * 20_000 + [leaf])
        write_with_footer(p, body, fm)

    parquet("parquet_negative_rows", negative_rows)
    parquet("parquet_negative_chunk", negative_chunk)
    parquet("parquet_rows_past_values", rows_past_values)
    parquet("parquet_swapped_pages", swapped_pages)
    # One group of 300 rows in pages of at most 32 (at least 8 pages a column): a read of a
    # few rows with a small decoded_bytes reads only their pages.
    parquet("parquet_shifted_index", shifted_index, "decoded_bytes=2000", group=300, batch=8, page=256)
    parquet("parquet_deep_schema", deep_schema)
    return cases


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    json.dump(write(out), sys.stdout)


if __name__ == "__main__":
    main()
