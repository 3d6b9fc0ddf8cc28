"""Stoker sources as Ray Data datasets: ``stoker.ray.read(uri, ...)`` reads any source Stoker
opens (tar, Parquet, MDS, LitData, TFRecord, HDF5, JSONL, LMDB, files, mixes) in Ray read
tasks, each through Stoker's store, fetch layer and caches on its node, decoding on Stoker's
Rust threads when ``decode=`` is given.

Each read task takes a run of consecutive samples: whole shards where the source has shards
and there are no more tasks than shards (so a task streams its shards, as a Loader does), else
even runs of samples. Blocks are Arrow tables with ``__key__`` (string) and ``__index__``
(int64: the sample's index in the whole source), then one column per field: undecoded fields
as ``large_binary`` (the bytes, zero-copy from Stoker's batch), decoded images and arrays as
Ray's fixed-shape tensor columns, decoded integers as ``int64``. A sample's augmentation draws
(random crops, flips, colour) depend on ``(seed, epoch, index)`` only, so a read gives the
tensors ``stoker.Loader(uri, decode=..., seed=seed)`` gives for the same samples in that epoch.

Requires ``ray[data]`` (``pip install 'stoker[ray]'``).
"""

from __future__ import annotations

import bisect
import functools
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence

try:
    import numpy
    import pyarrow
    import ray.data
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask
except ImportError as e:  # pragma: no cover - exercised without ray installed
    raise ImportError(
        f"stoker.ray needs Ray Data ({e.name or e} is not installed here): pip install 'stoker[ray]'"
    ) from e

from . import InvalidInputError, _decode_json, _OpenArgs, _ShownArgs, _stoker

#: Rows per block when ``rows_per_block`` is not given: a batch of the task's Loader.
DEFAULT_ROWS_PER_BLOCK = 256

#: The fewest samples a read task takes when ``override_num_blocks`` is not given.
MIN_TASK_SAMPLES = 512


def read(
    uri: "str | os.PathLike[str]",
    *,
    decode: Optional[Dict[str, Any]] = None,
    seed: int = 0,
    epoch: int = 0,
    rows_per_block: int = DEFAULT_ROWS_PER_BLOCK,
    decode_threads: Optional[int] = None,
    override_num_blocks: Optional[int] = None,
    concurrency: Optional[int] = None,
    ray_remote_args: Optional[Dict[str, Any]] = None,
    **options: Any,
) -> "ray.data.Dataset":
    """A Ray Data ``Dataset`` of the samples of ``uri`` in storage order (shuffle with Ray's
    ``randomize_block_order()`` or ``random_shuffle()``). ``options`` are the source's, as
    for ``stoker.open`` (``columns=``, ``endpoint=``, ``layout=``...); ``decode`` takes the
    Loader's specs (``stoker.Image``, ``stoker.Int``, ``stoker.Npy``, ``stoker.Bytes``), run on
    ``decode_threads`` Rust threads in each task (default: the CPUs Ray granted the task). Ray's own
    ``override_num_blocks`` (the number of read tasks), ``concurrency`` and
    ``ray_remote_args`` behave as for Ray's readers; without ``override_num_blocks``, a task
    per shard, or two per cluster CPU, but no task of fewer than ``MIN_TASK_SAMPLES`` samples."""
    if rows_per_block < 1:
        raise InvalidInputError(f"rows_per_block must be at least 1, not {rows_per_block}")
    source = StokerDatasource(uri, decode=decode, seed=seed, epoch=epoch, rows_per_block=rows_per_block,
                              decode_threads=decode_threads, **options)
    if override_num_blocks is None:
        override_num_blocks = source.default_tasks(int(ray.cluster_resources().get("CPU", 1)))
    return ray.data.read_datasource(
        source, override_num_blocks=override_num_blocks, concurrency=concurrency, ray_remote_args=ray_remote_args
    )


class StokerDatasource(_ShownArgs, Datasource):
    """The Ray Data datasource behind :func:`read` (for ``ray.data.read_datasource``).

    The source is opened on the driver to count its samples and find its shards; each read
    task opens it again in its worker (its URI and options, credentials included, travel in
    the task's pickle: keep them private, as Ray's own readers' credentials)."""

    def __init__(
        self,
        uri: "str | os.PathLike[str]",
        *,
        decode: Optional[Dict[str, Any]] = None,
        seed: int = 0,
        epoch: int = 0,
        rows_per_block: int = DEFAULT_ROWS_PER_BLOCK,
        decode_threads: Optional[int] = None,
        **options: Any,
    ) -> None:
        Datasource.__init__(self)
        self._args = _OpenArgs(os.fspath(uri), options)
        self._decode = _decode_json(decode)
        self._seed, self._epoch, self._rows = seed, epoch, rows_per_block
        self._threads = decode_threads
        source = _stoker.Source(self._args.uri, self._args.json())
        self._len = len(source)
        self._shard_starts = source.shard_starts()

    def default_tasks(self, cpus: int) -> int:
        """Read tasks when the caller does not say (Ray's own default, 200 or more, would make
        tasks of a few samples each, and every task opens the source and starts a Loader: 2048
        images read at 475/s in 200 tasks and 1,200/s in 4, on 2 CPUs). At least
        ``MIN_TASK_SAMPLES`` samples a task; within that, a task per shard, or two per CPU."""
        by_size = max(1, -(-self._len // MIN_TASK_SAMPLES))
        return max(1, min(by_size, max(2 * cpus, len(self._shard_starts))))

    def get_name(self) -> str:
        return "Stoker"

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None, data_context: Any = None) -> List[ReadTask]:
        spans = split(self._len, self._shard_starts, max(1, parallelism))
        tasks = []
        for start, end in spans:
            meta = BlockMetadata(num_rows=end - start, size_bytes=None, input_files=None, exec_stats=None)
            read_fn = functools.partial(
                _read_span, self._args, (start, end), self._decode, self._seed, self._epoch, self._rows, self._threads
            )
            tasks.append(ReadTask(read_fn, meta, per_task_row_limit=per_task_row_limit))
        return tasks


def split(n: int, shard_starts: Sequence[int], parts: int) -> List[tuple]:
    """``[start, end)`` runs of ``n`` samples for ``parts`` read tasks, none empty: cut at the
    shard starts nearest to even cuts when there are at least as many shards as parts (a
    task then reads whole shards), else evenly."""
    parts = max(1, min(parts, n))
    if n == 0:
        return []
    even = [n * k // parts for k in range(1, parts)]
    if len(shard_starts) >= parts:
        cuts = []
        for c in even:
            i = bisect.bisect_left(shard_starts, c)
            near = [s for s in shard_starts[max(0, i - 1) : i + 1] if 0 < s < n]
            if near:
                cuts.append(min(near, key=lambda s: abs(s - c)))
        even = cuts
    bounds = sorted(set([0, n] + even))
    return list(zip(bounds, bounds[1:]))


def _read_span(
    args: _OpenArgs, span: tuple, decode: Optional[str], seed: int, epoch: int, rows: int, threads: Optional[int]
) -> Iterator["pyarrow.Table"]:
    """One read task: the samples of ``span`` through a Loader in this worker, as Arrow tables."""
    if threads is None:
        # The task's own share of its node: Ray runs a task per CPU it grants, and decode
        # threads beyond the CPUs granted would only contend with the node's other tasks.
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        threads = max(1, int(cpus)) if cpus else None
    source = _stoker.Source(args.uri, args.json())
    loader = _stoker.Loader(
        source, rows, shuffle=None, seed=seed, rank=0, world_size=1, wrap=False, decode=decode,
        threads=threads, span=span,
    )
    for batch in loader.epoch(epoch):
        yield _table(batch)


def _table(batch: Any) -> "pyarrow.Table":
    from ray.data.extensions.tensor_extension import ArrowTensorArray

    cols: Dict[str, Any] = {
        "__key__": pyarrow.array(batch.keys(), pyarrow.string()),
        "__index__": pyarrow.array(batch.indices(), pyarrow.int64()),
    }
    for name in batch.fields():
        if name == "__source__":  # a mix's source names
            cols[name] = pyarrow.array(batch.texts(name), pyarrow.string())
            continue
        data, offsets, dtype = batch.column(name)
        values = numpy.from_dlpack(data)
        if dtype is None:
            # Stoker's int64 offsets are Arrow's large_binary offsets: no copy.
            ends = numpy.from_dlpack(offsets)
            cols[name] = pyarrow.LargeBinaryArray.from_buffers(
                pyarrow.large_binary(), len(ends) - 1, [None, pyarrow.py_buffer(ends), pyarrow.py_buffer(values)]
            )
        elif values.ndim > 1:
            cols[name] = ArrowTensorArray.from_numpy(values)
        else:
            cols[name] = pyarrow.array(values)
    return pyarrow.table(cols)


__all__ = ["read", "StokerDatasource", "split", "DEFAULT_ROWS_PER_BLOCK"]
