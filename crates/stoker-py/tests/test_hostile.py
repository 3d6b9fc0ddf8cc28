"""Hostile files (the corpus integration/py/hostile.py writes) are a StokerError in Python,
never a dead interpreter: sizes no file can hold, decompression bombs, a tar size bomb."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import stoker

HOSTILE = Path(__file__).resolve().parents[3] / "integration" / "py" / "hostile.py"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile")
    cases = json.loads(subprocess.run([sys.executable, str(HOSTILE), str(out)], check=True, capture_output=True, timeout=300).stdout)
    return out, cases


def test_every_hostile_file_is_a_stoker_error(corpus) -> None:
    out, cases = corpus
    assert len(cases) >= 6
    for case in cases:
        options = dict(kv.split("=", 1) for kv in case["options"].split("&") if kv)
        with pytest.raises(stoker.StokerError) as e:
            ds = stoker.open(str(out / case["path"]), **{k: int(v) for k, v in options.items()})
            for i in range(min(len(ds), 10)):
                ds[i]
        assert case["path"] in str(e.value), (case["name"], str(e.value))
        expected = {"corrupt": stoker.CorruptDataError, "invalid_input": stoker.InvalidInputError, "not_found": stoker.NotFoundError}[case["kind"]]
        assert isinstance(e.value, expected), (case["name"], repr(e.value))


def test_a_hostile_file_in_a_child_interpreter_does_not_kill_it(corpus) -> None:
    # The failure mode this guards against was an abort (exit 134) with no exception at all.
    # torch is hidden: the dataset is then the plain class, and each child does not spend
    # 1.5 s importing torch for a read that never reaches a tensor.
    out, cases = corpus
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import stoker\n"
        "try:\n"
        "    stoker.open(sys.argv[1])[0]\n"
        "except stoker.StokerError as e:\n"
        "    print('raised', type(e).__name__)\n"
    )
    for case in cases:
        if case["options"]:
            continue
        run = subprocess.run([sys.executable, "-c", code, str(out / case["path"])], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "raised" in run.stdout, (case["name"], run.returncode, run.stderr[-2000:])


CHILD = (
    "import sys\n"
    "sys.modules['torch'] = None\n"
    "import stoker\n"
    "try:\n"
    "    ds = stoker.open(sys.argv[1])\n"
    "    for i in range(len(ds)):\n"
    "        ds[i]\n"
    "    print('read', len(ds))\n"
    "except stoker.StokerError as e:\n"
    "    print('raised', type(e).__name__, e)\n"
)


def _child(path):
    return subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=120)


def _lmdb(path):
    import lmdb

    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as t:
        for i in range(20):
            t.put(b"k%05d" % i, b"value %d" % i)
    env.close()
    (path / "lock.mdb").unlink()
    return bytearray((path / "data.mdb").read_bytes())


def test_damaged_lmdb_pages_and_parquet_pages_are_errors_not_a_dead_process(tmp_path) -> None:
    import struct

    import pyarrow as pa
    import pyarrow.parquet as pq

    # A leaf node of a database without duplicates marked as duplicates (LMDB's cursor made a
    # sub-cursor for it: SIGSEGV).
    dup = tmp_path / "dup"
    b = _lmdb(dup)
    ps = struct.unpack_from("<I", b, 40)[0]
    leaf = next(p for p in range(2, len(b) // ps) if struct.unpack_from("<H", b, p * ps + 10)[0] & 0x02)
    b[leaf * ps + struct.unpack_from("<H", b, leaf * ps + 16)[0] + 4] |= 0x04
    (dup / "data.mdb").write_bytes(bytes(b))
    # The live meta page's page size damaged (LMDB mapped by it, past the file's end: SIGBUS).
    meta = tmp_path / "meta"
    b = _lmdb(meta)
    ps = struct.unpack_from("<I", b, 40)[0]
    assert struct.unpack_from("<Q", b, ps + 144)[0] > struct.unpack_from("<Q", b, 144)[0]
    b[ps + 42] ^= 0xFF
    (meta / "data.mdb").write_bytes(bytes(b))
    # A Parquet data page said to be dictionary-encoded in a chunk without a dictionary (the
    # parquet crate panicked: a PanicException, not a StokerError).
    page = tmp_path / "page"
    page.mkdir()
    path = page / "x.parquet"
    pq.write_table(pa.table({"n": pa.array(range(10), pa.int64())}), path, compression="none", use_dictionary=False)
    at = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    b = bytearray(path.read_bytes())
    # PageHeader (Thrift compact): type, sizes, [crc], then DataPageHeader {num_values, encoding}.
    i = at
    for _ in range(3):
        i += 1
        while b[i] & 0x80:
            i += 1
        i += 1
    if b[i] == 0x15:
        i += 1
        while b[i] & 0x80:
            i += 1
        i += 1
    assert b[i] in (0x2C, 0x1C)
    i += 1
    assert b[i] == 0x15
    i += 1
    while b[i] & 0x80:
        i += 1
    i += 1
    assert b[i] == 0x15 and b[i + 1] == 0x00, "a PLAIN encoding"
    b[i + 1] = 0x10  # zigzag(8): RLE_DICTIONARY
    path.write_bytes(bytes(b))
    for case, named in ((dup, "data.mdb"), (meta, "meta pages"), (page, "x.parquet")):
        run = _child(case)
        assert run.returncode == 0 and "raised" in run.stdout and named in run.stdout, (case.name, run.returncode, run.stdout, run.stderr[-2000:])
