"""The rows of a Ray dataset as shard members, for :mod:`stoker.ray`'s datasink: a write
task's blocks streamed into tar shards (their Arrow columns handed to Stoker's shard writer in
place) or Megatron token files. Imported by :mod:`stoker.ray`, which checks for Ray first."""

from __future__ import annotations

import bisect
import io
from typing import Any, Dict, Iterator, List, Optional

import numpy
import pyarrow
import pyarrow.compute
from ray.data.block import BlockAccessor

from . import InvalidInputError

#: Columns that name or place a row rather than hold one of its fields.
ROW_COLUMNS = ("__key__", "__index__", "__source__")


#: Token types of layout "tokens": numpy's name, and the ids each holds.
TOKEN_DTYPES = {"uint16": (0, 65535), "int32": (0, 2**31 - 1)}


def _write_tokens(
    writer: Any, stem: str, blocks: Any, field: Optional[str], dtype: str, size: int, per: Optional[int]
) -> List[Dict[str, Any]]:
    """One write task of layout "tokens": its rows' token ids as Megatron pairs."""
    lo, hi = TOKEN_DTYPES[dtype]
    written: List[Dict[str, Any]] = []
    docs: List[bytes] = []
    held = 0

    def flush() -> None:
        nonlocal docs, held
        written.append(writer.write_tokens(f"{stem}-{len(written):04d}", dtype, docs))
        docs, held = [], 0

    for b in blocks:
        block = BlockAccessor.for_block(b)
        table = block.to_arrow()
        if table.num_rows == 0:
            continue
        cols = [c for c in table.column_names if c not in ROW_COLUMNS]
        name = field if field is not None else (cols[0] if len(cols) == 1 else None)
        if name is None or name not in table.column_names:
            raise InvalidInputError(
                f"layout='tokens' writes one column of token ids: name it with field= (the dataset has {cols})"
            )
        keys = table.column("__key__").to_pylist() if "__key__" in table.column_names else None
        for i, ids in enumerate(_token_rows(block, table, name)):
            if ids.size and (ids.min() < lo or ids.max() > hi):
                row = f"the row with __key__ {keys[i]!r}" if keys else "a row"
                raise InvalidInputError(
                    f"{row} of column {name!r} holds id {int(ids.min() if ids.min() < lo else ids.max())}, outside "
                    f"{dtype} ({lo}..{hi}); pass token_dtype='int32' for a larger vocabulary"
                )
            doc = ids.astype(numpy.dtype(dtype).newbyteorder("<"), copy=False).tobytes()
            if docs and (held + len(doc) > size or (per is not None and len(docs) >= per)):
                flush()
            docs.append(doc)
            held += len(doc)
    if docs:
        flush()
    return written


def _token_rows(block: Any, table: "pyarrow.Table", name: str) -> Iterator["numpy.ndarray"]:
    """Each row's token ids of column ``name`` as an integer array."""
    col = table.column(name)
    t = col.type
    T = pyarrow.types
    if T.is_list(t) or T.is_large_list(t) or T.is_fixed_size_list(t):
        if not T.is_integer(t.value_type):
            raise InvalidInputError(f"column {name!r} holds lists of {t.value_type}, not integer token ids")
        for chunk in col.chunks:
            if chunk.null_count:
                raise InvalidInputError(f"column {name!r} has a null row; every row needs its token ids")
            if T.is_fixed_size_list(t):
                values = chunk.flatten().to_numpy()
                yield from values.reshape(len(chunk), t.list_size)
                continue
            offsets = chunk.offsets.to_numpy()
            values = chunk.values.to_numpy()
            for a, b in zip(offsets[:-1], offsets[1:]):
                yield values[a:b]
        return
    if isinstance(t, pyarrow.ExtensionType):
        for row in block.to_numpy(name):
            ids = numpy.asarray(row)
            if ids.dtype.kind not in "iu":
                raise InvalidInputError(f"column {name!r} holds {ids.dtype} tensors, not integer token ids")
            yield ids.reshape(-1)
        return
    if T.is_binary(t) or T.is_large_binary(t):
        # `.npy` arrays as Stoker reads them from MDS ndarray columns, Parquet lists, LitData.
        for i, data in enumerate(col.to_pylist()):
            try:
                ids = numpy.load(io.BytesIO(data), allow_pickle=False)
            except Exception as e:
                raise InvalidInputError(f"row {i} of column {name!r} is not an .npy array of token ids ({e})") from None
            if ids.dtype.kind not in "iu":
                raise InvalidInputError(f"row {i} of column {name!r} holds {ids.dtype}, not integer token ids")
            yield ids.reshape(-1)
        return
    raise InvalidInputError(
        f"column {name!r} has type {t}; layout='tokens' takes a list or tensor column of token ids, or .npy bytes"
    )


class _Shards:
    """The shards of one write task: each block's rows go into the shard being written as
    they come (read in place by Stoker's writer, which streams the shard to its file), and a
    shard closes before the row that would take it past its size (or row count). A task holds
    a block of rows, not its shard."""

    def __init__(self, writer: Any, stem: str, shard_size: int, per_shard: Optional[int]) -> None:
        self._writer, self._stem, self._size, self._per = writer, stem, shard_size, per_shard
        self._stream: Any = None
        self.written: List[Dict[str, Any]] = []

    def add(self, block: Any) -> None:
        table = block.to_arrow()
        if table.num_rows == 0:  # an empty block has no columns at all
            return
        if "__key__" not in table.column_names:
            raise InvalidInputError(
                f"stoker.ray.write needs a __key__ column (each row's sample key); the dataset has "
                f"{table.column_names}: add one with map_batches"
            )
        keys = _keys(table.column("__key__"))
        cols: List[tuple] = []
        for name in table.column_names:
            if name in ROW_COLUMNS:
                continue
            member = _member_name(name, table.schema.field(name).type)
            if member.lower() in {c.lower() for c, _ in cols}:
                raise InvalidInputError(
                    f"two columns would both be written as member {member!r} (a list or tensor column is "
                    f"written as COLUMN.npy; field names are compared lower-case): rename one"
                )
            cols.append((member, _values(block, table, name)))
        sizes = _row_bytes(keys, cols)
        # A block Ray assembled from several tables has columns of several chunks: they are
        # written a chunk at a time where they lie, not combined into one copy first.
        starts = [_chunk_starts(c) for _, c in cols]
        cuts = sorted({o for s in starts for o in s[1:]})
        n, start = len(keys), 0
        while start < n:
            # The rows that fit in what is left of the shard (by size, then count); a row
            # bigger than a whole shard gets one of its own.
            stream = self._open()
            held = numpy.cumsum(sizes[start:])
            fit = int(numpy.searchsorted(held, self._size - stream.bytes, side="right"))
            if self._per is not None:
                fit = min(fit, self._per - stream.samples)
            if fit == 0 and stream.samples:
                self._flush()
                continue
            end = start + max(fit, 1)
            for a, b in _pieces(start, end, cuts):
                stream.add(keys.slice(a, b - a), [(m, _piece(c, s, a, b)) for (m, c), s in zip(cols, starts)])
            start = end
            if start < n:
                self._flush()

    def _open(self) -> Any:
        if self._stream is None:
            name = f"{self._stem}-{len(self.written):04d}.tar"
            self._stream = self._writer.shard(name, self._size)
        return self._stream

    def close(self) -> None:
        if self._stream is not None and self._stream.samples:
            self._flush()

    def abort(self) -> None:
        if self._stream is not None:
            self._stream.abort()
            self._stream = None

    def _flush(self) -> None:
        self.written.append(self._stream.finish())
        self._stream = None


def _keys(col: Any) -> "pyarrow.Array":
    """The ``__key__`` column as one string array, or why it cannot name samples."""
    keys = _plain(col.combine_chunks())
    if not (pyarrow.types.is_string(keys.type) or pyarrow.types.is_large_string(keys.type)):
        raise InvalidInputError(f"row 0 of a block has __key__ {keys[0].as_py()!r}; keys are non-empty strings")
    lengths = pyarrow.compute.binary_length(keys)
    bad = pyarrow.compute.fill_null(pyarrow.compute.equal(lengths, 0), True)
    if pyarrow.compute.any(bad).as_py():
        first = int(numpy.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
        raise InvalidInputError(f"row {first} of a block has __key__ {keys[first].as_py()!r}; keys are non-empty strings")
    return keys


def _plain(arr: Any) -> Any:
    """A dictionary-encoded array (or chunked array) decoded, and a view array
    (``string_view``, ``binary_view``) as its large type: the layouts the shard writer reads
    in place."""
    if pyarrow.types.is_dictionary(arr.type):
        if isinstance(arr, pyarrow.ChunkedArray):
            arr = pyarrow.chunked_array([c.dictionary_decode() for c in arr.chunks], arr.type.value_type)
        else:
            arr = arr.dictionary_decode()
    view = {"string_view": pyarrow.large_string, "binary_view": pyarrow.large_binary}.get(str(arr.type))
    return arr.cast(view()) if view else arr


def _chunk_starts(col: "pyarrow.ChunkedArray") -> List[int]:
    """Where each chunk of ``col`` starts, and its end."""
    starts = [0]
    for c in col.chunks:
        starts.append(starts[-1] + len(c))
    return starts


def _pieces(start: int, end: int, cuts: List[int]) -> Iterator[tuple]:
    """``[start, end)`` cut at ``cuts`` (the chunk starts of every column, sorted)."""
    i = bisect.bisect_right(cuts, start)
    while i < len(cuts) and cuts[i] < end:
        yield start, cuts[i]
        start, i = cuts[i], i + 1
    yield start, end


def _piece(col: "pyarrow.ChunkedArray", starts: List[int], a: int, b: int) -> "pyarrow.Array":
    """Rows ``[a, b)`` of ``col`` (its chunks starting at ``starts``), which lie in one of its
    chunks, as a slice of that chunk."""
    i = bisect.bisect_right(starts, a) - 1
    return col.chunk(i).slice(a - starts[i], b - a)


def _row_bytes(keys: "pyarrow.Array", cols: List[tuple]) -> "numpy.ndarray":
    """Bytes each row's members take in a tar (as ``stoker pack`` counts them: a header, a
    long-name entry for a name over 100 bytes, the payload padded to 512)."""
    lengths = lambda a: pyarrow.compute.binary_length(a).fill_null(-1).to_numpy(zero_copy_only=False).astype(numpy.int64)  # noqa: E731
    key_len = lengths(keys)
    total = numpy.zeros(len(keys), dtype=numpy.int64)
    for name, vals in cols:
        size = lengths(vals)
        name_len = key_len + 1 + len(name.encode())
        long = numpy.where(name_len > 100, 512 + -(-(name_len + 1) // 512) * 512, 0)
        total += numpy.where(size >= 0, long + 512 + -(-size // 512) * 512, 0)
    return total


def _is_array(t: Any) -> bool:
    return isinstance(t, pyarrow.ExtensionType) or pyarrow.types.is_list(t) or pyarrow.types.is_large_list(t) \
        or pyarrow.types.is_fixed_size_list(t)


def _member_name(column: str, t: Any) -> str:
    return column if not _is_array(t) or column.lower().endswith("npy") else f"{column}.npy"


def _npy(value: Any) -> bytes:
    buf = io.BytesIO()
    numpy.lib.format.write_array(buf, numpy.ascontiguousarray(value), allow_pickle=False)
    return buf.getvalue()


def _values(block: Any, table: "pyarrow.Table", name: str) -> "pyarrow.ChunkedArray":
    """A column's values as member payloads: binary or string chunks (what the shard writer
    reads in place), a null where a row has no member."""
    col = table.column(name)
    t = col.type
    T = pyarrow.types
    plain = _plain(col)
    if any(f(plain.type) for f in (T.is_binary, T.is_large_binary, T.is_string, T.is_large_string)):
        return plain
    if T.is_fixed_size_binary(t):
        vals: List[Optional[bytes]] = col.to_pylist()
    elif T.is_boolean(t):
        vals = [None if v is None else b"1" if v else b"0" for v in col.to_pylist()]
    elif T.is_integer(t):
        vals = [None if v is None else str(v).encode() for v in col.to_pylist()]
    elif T.is_floating(t):
        vals = [None if v is None else repr(float(v)).encode() for v in col.to_pylist()]
    elif _is_array(t):
        if isinstance(t, pyarrow.ExtensionType):
            values = block.to_numpy(name)
            nulls = [False] * len(values) if col.null_count == 0 else col.is_null().to_pylist()
            vals = [None if null else _npy(v) for v, null in zip(values, nulls)]
        else:
            dtype = t.value_type.to_pandas_dtype()  # the list's own type, not numpy's guess
            vals = [None if v is None else _npy(numpy.asarray(v, dtype=dtype)) for v in col.to_pylist()]
    else:
        raise InvalidInputError(
            f"column {name!r} has type {t}, which stoker.ray.write cannot store as a member: map it to bytes, a "
            "string, a number or a tensor first"
        )
    return pyarrow.chunked_array([pyarrow.array(vals, pyarrow.large_binary())])
