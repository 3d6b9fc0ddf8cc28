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

``stoker.ray.write(ds, dest, ...)`` is the other direction: a Ray Data datasink that writes the
rows of any Ray dataset as WebDataset tar shards (or an LMDB environment) from Ray's write
tasks in parallel, into a local directory every node sees or a remote prefix (``s3://``...),
with every member's checksum in the shard indexes and the dataset's manifest written once
every shard has landed.

Requires ``ray[data]`` (``pip install 'stoker[ray]'``).
"""

from __future__ import annotations

import bisect
import functools
import inspect
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence

try:
    import numpy
    import pyarrow
    import ray.data
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasink, Datasource, ReadTask
except ImportError as e:  # pragma: no cover - exercised without ray installed
    raise ImportError(
        f"stoker.ray needs Ray Data ({e.name or e} is not installed here): pip install 'stoker[ray]'"
    ) from e

from . import InvalidInputError, _decode_json, _OpenArgs, _options_json, _ShownArgs, _stoker
from ._ray_rows import TOKEN_DTYPES, _Shards, _write_tokens

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
    num_cpus: Optional[float] = None,
    num_gpus: Optional[float] = None,
    memory: Optional[float] = None,
    resources: Optional[Dict[str, float]] = None,
    accelerator_type: Optional[str] = None,
    runtime_env: Optional[Dict[str, Any]] = None,
    label_selector: Optional[Dict[str, str]] = None,
    fallback_strategy: Optional[List[Dict[str, Any]]] = None,
    max_calls: Optional[int] = None,
    compute: Any = None,
    ray_remote_args: Optional[Dict[str, Any]] = None,
    **options: Any,
) -> "ray.data.Dataset":
    """A Ray Data ``Dataset`` of the samples of ``uri`` in storage order (shuffle with Ray's
    ``randomize_block_order()`` or ``random_shuffle()``). ``options`` are the source's, as
    for ``stoker.open`` (``columns=``, ``endpoint=``, ``layout=``...); ``decode`` takes the
    Loader's specs (``stoker.Image``, ``stoker.Int``, ``stoker.Npy``, ``stoker.Bytes``), run on
    ``decode_threads`` Rust threads in each task (default: the CPUs Ray granted the task, one for
    a task granted none). Ray's own
    ``override_num_blocks`` (the number of read tasks), ``concurrency``, the named remote
    parameters of its readers (``num_cpus``, ``num_gpus``, ``memory``, ``resources``,
    ``accelerator_type``, ``runtime_env``, ``label_selector``, ``fallback_strategy``,
    ``max_calls``, ``compute``: Ray Data 2.60 and later) and ``ray_remote_args`` (deprecated by
    Ray for them) behave as for Ray's readers; a named parameter the installed Ray's readers do
    not take is an error naming it. Without ``override_num_blocks``: a task per shard, or one
    per task slot of the cluster (see :func:`task_slots`: its CPUs over each task's
    ``num_cpus``, and so for GPUs, memory and custom resources, at most ``concurrency``), but
    no task of fewer than ``MIN_TASK_SAMPLES`` samples."""
    if rows_per_block < 1:
        raise InvalidInputError(f"rows_per_block must be at least 1, not {rows_per_block}")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)):
        raise InvalidInputError(f"a read's concurrency is how many read tasks run at once (an int), not {concurrency!r}")
    # Checked before the source is listed, which may take many requests.
    named = _named_read_params(
        num_cpus=num_cpus, num_gpus=num_gpus, memory=memory, resources=resources, accelerator_type=accelerator_type,
        runtime_env=runtime_env, label_selector=label_selector, fallback_strategy=fallback_strategy,
        max_calls=max_calls, compute=compute,
    )
    source = StokerDatasource(uri, decode=decode, seed=seed, epoch=epoch, rows_per_block=rows_per_block,
                              decode_threads=decode_threads, **options)
    if override_num_blocks is None:
        # A named parameter overrides its ray_remote_args entry, as in Ray.
        asks = {**(ray_remote_args or {}), **named}
        slots = task_slots(ray.cluster_resources(), asks, concurrency, named.get("compute"))
        override_num_blocks = source.default_tasks(slots)
    return ray.data.read_datasource(
        source, override_num_blocks=override_num_blocks, concurrency=concurrency, ray_remote_args=ray_remote_args,
        **named,
    )


def _named_read_params(**given: Any) -> Dict[str, Any]:
    """The named remote parameters of a read that were given (not ``None``), each checked to be
    one the installed Ray's ``read_datasource`` takes. Ray Data 2.60 added them (and deprecated
    ``ray_remote_args`` for them); an older Ray would pass them on to the datasource as its
    options, where each would be refused as an unknown source option."""
    named = {k: v for k, v in given.items() if v is not None}
    takes = inspect.signature(ray.data.read_datasource).parameters
    missing = [k for k in named if k not in takes]
    if missing:
        # compute is a strategy, not an option of ray.remote: no ray_remote_args can carry it.
        remote = [k for k in missing if k != "compute"]
        how = "upgrade Ray"
        if remote:
            how += f", or pass them in ray_remote_args={{{', '.join(repr(k) + ': ...' for k in remote)}}}"
        raise InvalidInputError(
            f"Ray {ray.__version__}'s read_datasource takes no {', '.join(f'{k}=' for k in missing)} (Ray Data 2.60 "
            f"added them): {how}"
        )
    return named


def task_slots(cluster: Dict[str, float], asks: Dict[str, Any], concurrency: Optional[int], compute: Any = None) -> int:
    """How many read tasks the cluster runs at once. For each resource a task asks for in
    ``asks`` (Ray's remote parameters: ``num_cpus``, one when not given, as in Ray; ``num_gpus``;
    ``memory``; each of ``resources``), the ``cluster``'s total over the task's share; the
    fewest of those (one a CPU when a task asks for nothing), at most ``concurrency``, or else
    the size of ``compute``'s pool. Counted over the whole cluster's totals: a task too large
    for any one node, or a ``label_selector`` that leaves some nodes out, is not seen here."""

    def amount(name: str, value: Any) -> Optional[float]:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidInputError(f"{name} is an amount of a resource a read task takes (a number), not {value!r}")
        return float(value)

    share = {
        "CPU": amount("num_cpus", asks.get("num_cpus")),
        "GPU": amount("num_gpus", asks.get("num_gpus")),
        "memory": amount("memory", asks.get("memory")),
    }
    if share["CPU"] is None:
        share["CPU"] = 1.0
    for name, value in (asks.get("resources") or {}).items():
        share[name] = amount(f"resources[{name!r}]", value)
    # The small excess keeps 2.0 CPUs over 0.1 a task at 20 slots, not 19.
    fits = [int(cluster.get(name, 0) / s + 1e-9) for name, s in share.items() if s is not None and s > 0]
    slots = min(fits) if fits else int(cluster.get("CPU", 1))
    if concurrency is not None:
        slots = min(slots, concurrency)
    elif compute is not None:
        # Ray's read takes concurrency over compute; a task pool has a size, an actor pool a
        # largest size (infinite when unbounded).
        size = getattr(compute, "size", None)
        if size is None:
            size = getattr(compute, "max_size", None)
        if isinstance(size, (int, float)) and size != float("inf"):
            slots = min(slots, int(size))
    return max(1, slots)


class StokerDatasource(_ShownArgs, Datasource):
    """The Ray Data datasource behind :func:`read` (for ``ray.data.read_datasource``).

    The source is listed on the driver to count its samples and find its shards; each read
    task opens it from that listing in its worker (its URI and options, credentials included,
    travel in the task's pickle: keep them private, as Ray's own readers' credentials)."""

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
        # Listed once here into a snapshot, which every read task opens from: a directory or
        # prefix of 10^5 objects is listed once, not once per task (a request per thousand
        # objects remotely). A local directory of files is listed by name only, each task
        # looking up its own part's files: 0.07 s here on one core for 100,000 files instead
        # of 0.31, the lookups spread over the tasks.
        self._len, self._shard_starts, self._listing = _stoker.Source.list_for_tasks(
            self._args.uri, self._args.json()
        )
        # Parts of the listing by the runs they were cut for (Ray plans a read more than once),
        # and the whole listing's object-store reference, put once.
        self._parts: Dict[tuple, Optional[List[bytes]]] = {}
        self._whole: Any = None

    def default_tasks(self, slots: int) -> int:
        """Read tasks when the caller does not say (Ray's own default, 200 or more, would make
        tasks of a few samples each, and every task opens the source and starts a Loader: 2048
        images read at 475/s in 200 tasks and 1,200/s in 4, on 2 CPUs). At least
        ``MIN_TASK_SAMPLES`` samples a task; within that, a task per shard, or one per task
        slot (``slots``, see :func:`task_slots`): a second wave of tasks costs each slot a task's
        start and the gap before Ray Data submits it (a two-node write of 100,000 files took
        1.18-1.31 s in one wave, 1.32-1.39 s in two)."""
        by_size = max(1, -(-self._len // MIN_TASK_SAMPLES))
        return max(1, min(by_size, max(slots, len(self._shard_starts))))

    def get_name(self) -> str:
        return "Stoker"

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None, data_context: Any = None) -> List[ReadTask]:
        spans = split(self._len, self._shard_starts, max(1, parallelism))
        tasks = []
        for (start, end), listing in zip(spans, self._task_listings(spans)):
            meta = BlockMetadata(num_rows=end - start, size_bytes=None, input_files=None, exec_stats=None)
            read_fn = functools.partial(
                _read_span, self._args, (start, end), self._decode, self._seed, self._epoch, self._rows, self._threads,
                *listing,
            )
            read_fn.__name__ = "read_stoker"  # type: ignore[attr-defined]  # Ray names tasks by it
            tasks.append(ReadTask(read_fn, meta, per_task_row_limit=per_task_row_limit))
        return tasks

    def _task_listings(self, spans: List[tuple]) -> List[tuple]:
        """What each read task of ``spans`` opens the source from: ``(listing, part)``, where
        ``listing`` is a snapshot (its bytes, or their object-store reference when large) and
        ``part`` says it holds only the task's samples, numbered from 0.

        A directory of files (one a sample) gives each task the part of the listing its run
        covers: every task parsing the whole listing costs each task time in proportion to the
        directory (48 ms for 100,000 files, seconds for 10^7), and the tasks are as many as the
        CPUs. The layouts whose samples are not one object each give every task the whole
        snapshot."""
        if self._listing is None:
            return [(None, False)] * len(spans)
        parts = None
        if len(spans) > 1:
            key = tuple(spans)
            if key not in self._parts:
                if len(self._parts) >= 4:  # Ray plans with two or three splits; keep a few
                    self._parts.pop(next(iter(self._parts)))
                self._parts[key] = _stoker.Source.snapshot_spans(self._listing, spans)
            parts = self._parts[key]
        if parts is None:
            # The snapshot goes to the object store once; each task carries its reference.
            if self._whole is None:
                self._whole = ray.put(self._listing)
            return [(self._whole, False)] * len(spans)
        return [(_by_value(p), True) for p in parts]


def _by_value(data: bytes) -> Any:
    """``data`` itself for a task's arguments when small, else its object-store reference (Ray
    warns of read tasks over 1 MiB, and copies their arguments with every task)."""
    return data if len(data) <= INLINE_LISTING else ray.put(data)


#: Listing parts up to this size travel in their read task; larger ones through the object store.
INLINE_LISTING = 64 << 10


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
    args: _OpenArgs, span: tuple, decode: Optional[str], seed: int, epoch: int, rows: int, threads: Optional[int],
    listing: Any = None,
    part: bool = False,
) -> Iterator["pyarrow.Table"]:
    """One read task: the samples of ``span`` through a Loader in this worker, as Arrow tables.
    With ``part``, ``listing`` holds only those samples (from 0): the whole of it is read, each
    sample numbered (``__index__``, augmentation draws) by its index in the whole source."""
    if threads is None:
        # The task's own share of its node: Ray runs a task per CPU it grants, and decode
        # threads beyond the CPUs granted would only contend with the node's other tasks.
        # A task granted no CPU (num_cpus=0) is not to take every core: one thread.
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        threads = max(1, int(cpus)) if cpus else 1
    if isinstance(listing, ray.ObjectRef):
        listing = ray.get(listing)
    source = _stoker.Source(args.uri, args.json(), listing)
    first = 0
    if part:
        if len(source) != span[1] - span[0]:
            raise InvalidInputError(
                f"{_stoker.redact(args.uri)}: a read task's part of the listing holds {len(source)} samples, not the "
                f"{span[1] - span[0]} of samples {span[0]}..{span[1]}; read it again"
            )
        first, span = span[0], None
    loader = _stoker.Loader(
        source, rows, shuffle=None, seed=seed, rank=0, world_size=1, wrap=False, decode=decode,
        threads=threads, span=span, first_index=first,
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


#: A shard closes before the row that would take it past this many bytes (as ``stoker pack``).
DEFAULT_SHARD_SIZE = 256 << 20



def write(
    ds: "ray.data.Dataset",
    dest: "str | os.PathLike[str]",
    *,
    layout: str = "tar",
    shard_size: int = DEFAULT_SHARD_SIZE,
    samples_per_shard: Optional[int] = None,
    prefix: str = "shard",
    field: Optional[str] = None,
    token_dtype: str = "uint16",
    force: bool = False,
    concurrency: Optional[int] = None,
    ray_remote_args: Optional[Dict[str, Any]] = None,
    **options: Any,
) -> Dict[str, Any]:
    """Write the rows of ``ds`` into ``dest`` and return what was written (samples, shards,
    bytes, shards kept from an earlier run).

    Each row is a sample: its key from the ``__key__`` column (required: ``stoker.ray.read``
    gives one; add one with ``map_batches`` otherwise), one member per other column named by the
    column (``__index__`` and ``__source__`` are not written). Binary columns are written as
    they are, strings as UTF-8, numbers as text (``3``, as webdataset's ``.cls``; booleans as
    ``0``/``1``), tensor and list columns as ``.npy`` (the member ``KEY.COLUMN.npy`` unless the
    column's name already ends in ``npy``); a null is a member left out.

    ``layout="tar"``: each write task writes its rows as shards of up to ``shard_size`` bytes
    (and ``samples_per_shard`` rows) named ``{prefix}-{task:06d}-{n:04d}.tar``, the task being
    Ray's index of the write task (for a dataset read by ``stoker.ray.read`` or another reader,
    with per-row maps fused into the read, that is the read task, so a rerun of the same
    pipeline gives the same names and bytes). A shard is written under a temporary name and
    renamed whole; once every task has finished, the manifest is written. ``layout="lmdb"``: the
    shards go to ``DEST/.stoker-shards`` and are then packed into one LMDB environment in
    ``dest`` on the driver (an LMDB environment has one writer; ``field`` picks the value when
    rows have several columns). ``layout="tokens"``: the column ``field`` (default: the one
    column besides ``__key__``/``__index__``) holds each row's token ids (a list or tensor
    column of integers), and each write task writes Megatron indexed datasets
    ``{prefix}-{task:06d}-{n:04d}.bin``/``.idx`` of up to ``shard_size`` bytes of tokens, one
    document per row, as ``token_dtype`` (``uint16``, Megatron's type for vocabularies up to
    65,535 ids, or ``int32``; an id that does not fit is an error); Stoker's ``tokens`` layout,
    ``stoker.TokenLoader`` and Megatron read the directory.

    Rerunning after a failure (a killed worker, a lost node) resumes: shards already there with
    the same bytes are kept, and shards a changed pipeline no longer writes are removed. A
    destination holding anything else is refused unless ``force``. ``options`` are the
    destination store's (``endpoint=``, credentials...); ``concurrency`` and
    ``ray_remote_args`` are Ray's, for the write tasks."""
    sink = StokerDatasink(
        dest, layout=layout, shard_size=shard_size, samples_per_shard=samples_per_shard, prefix=prefix,
        field=field, token_dtype=token_dtype, force=force, **options,
    )
    plan = _write_plan(ds, concurrency, ray_remote_args)
    plan.write_datasink(sink, concurrency=concurrency, ray_remote_args=ray_remote_args)
    if plan is not ds:
        # Ray keeps a write's statistics on the dataset written (``ds.stats()``): the caller's.
        try:
            ds._write_ds = plan._write_ds
        except AttributeError:  # pragma: no cover - another Ray's internals
            pass
    assert sink.report is not None  # set by on_write_complete
    return sink.report


class StokerDatasink(_ShownArgs, Datasink):
    """The Ray Data datasink behind :func:`write` (for ``Dataset.write_datasink``).

    The destination's URI and options, credentials included, travel in each write task's
    pickle: keep them private, as Ray's own writers' credentials."""

    def __init__(
        self,
        dest: "str | os.PathLike[str]",
        *,
        layout: str = "tar",
        shard_size: int = DEFAULT_SHARD_SIZE,
        samples_per_shard: Optional[int] = None,
        prefix: str = "shard",
        field: Optional[str] = None,
        token_dtype: str = "uint16",
        force: bool = False,
        **options: Any,
    ) -> None:
        if layout not in ("tar", "lmdb", "tokens"):
            raise InvalidInputError(f"stoker.ray.write writes layout 'tar', 'lmdb' or 'tokens', not {layout!r}")
        if token_dtype not in TOKEN_DTYPES:
            raise InvalidInputError(f"token_dtype is 'uint16' or 'int32' (Megatron's types), not {token_dtype!r}")
        if shard_size < 1:
            raise InvalidInputError(f"shard_size must be at least 1 byte, not {shard_size}")
        if samples_per_shard is not None and samples_per_shard < 1:
            raise InvalidInputError(f"samples_per_shard must be at least 1, not {samples_per_shard}")
        if field is not None and layout == "tar":
            raise InvalidInputError("field= picks the LMDB value or the token column; a tar shard keeps every column")
        self._args = _OpenArgs(os.fspath(dest), options)
        if layout == "lmdb" and "://" in self._args.uri.split("?")[0]:
            raise InvalidInputError(
                f"{self.uri}: LMDB is written to a local directory (one every node sees); write tar shards to the "
                "store, or LMDB locally and copy it"
            )
        self._layout, self._shard_size, self._per_shard = layout, shard_size, samples_per_shard
        self._prefix, self._field, self._force = prefix, field, force
        self._dtype = token_dtype
        self.report: Optional[Dict[str, Any]] = None
        if not prefix or prefix.startswith(".") or any(c in prefix for c in "/\\") or not prefix.isprintable():
            raise InvalidInputError(f"prefix {prefix!r} must be a plain file name: not starting with '.', without '/'")
        # The destination's checks (a URI that parses, a directory that can be made), on the
        # driver before any task runs.
        _stoker.ShardWriter(self._args.uri, self._args.json())

    def _shards_uri(self) -> str:
        if self._layout != "lmdb":
            return self._args.uri
        path, sep, query = self._args.uri.partition("?")
        return path.rstrip("/") + "/.stoker-shards" + sep + query

    def _settings(self) -> str:
        return json.dumps({
            "writer": "stoker.ray.write", "prefix": self._prefix, "shard_size": self._shard_size,
            "samples_per_shard": self._per_shard, "layout": self._layout, "field": self._field,
            "token_dtype": self._dtype,
        })

    def get_name(self) -> str:
        return "Stoker"

    @property
    def supports_distributed_writes(self) -> bool:
        # A local destination must be one every node sees (a shared file system), as for
        # Ray's own writers; the driver cannot tell.
        return True

    def on_write_start(self, schema: Any = None) -> None:
        if self._layout == "lmdb":
            # The LMDB environment goes in the destination, its staging shards below it: the
            # destination itself holds a job record, so one holding anything else (an earlier
            # pack, someone's data.mdb) is refused unless forced, as for tar.
            _stoker.ShardWriter(self._args.uri, self._args.json()).begin(self._settings(), self._prefix, self._force)
        writer = _stoker.ShardWriter(self._shards_uri(), self._args.json())
        writer.begin(self._settings(), self._prefix, self._force)

    def write(self, blocks: Any, ctx: Any) -> List[Dict[str, Any]]:
        writer = _stoker.ShardWriter(self._shards_uri(), self._args.json())
        stem = f"{self._prefix}-{ctx.task_idx:06d}"
        if self._layout == "tokens":
            return _write_tokens(writer, stem, blocks, self._field, self._dtype, self._shard_size, self._per_shard)
        shards = _Shards(writer, stem, self._shard_size, self._per_shard)
        try:
            for block in blocks:
                shards.add(BlockAccessor.for_block(block))
            shards.close()
        except BaseException:
            shards.abort()  # the shard being written leaves nothing (a remote upload is aborted)
            raise
        return shards.written

    def on_write_complete(self, write_result: Any) -> None:
        written = [s for task in write_result.write_returns for s in task]
        names = [s["name"] for s in written]
        if len(set(names)) != len(names):  # pragma: no cover - task indexes are unique per operator
            raise InvalidInputError(f"{self.uri}: two write tasks wrote one shard name; rerun the write")
        writer = _stoker.ShardWriter(self._shards_uri(), self._args.json())
        report = writer.finish(self._prefix, names)
        self.report = {
            "dest": self.uri,
            "layout": self._layout,
            "samples": sum(s["samples"] for s in written),
            "shards": len(written),
            "payload_bytes": sum(s["payload_bytes"] for s in written),
            "written_bytes": sum(s["bytes"] for s in written),
            "kept_shards": sum(1 for s in written if s["kept"]),
            "manifest": report["manifest"],
            "checksums": report["checksums"],
        }
        if self._layout == "lmdb":
            source = _stoker.Source(self._shards_uri(), self._args.json())
            # Forced: the destination holds the job record and the staging shards.
            done = _stoker.pack(source, self._args.uri, "lmdb", None, None, None, False, self._field, True, None,
                                self._args.json())
            self.report.update(shards=1, written_bytes=done["written_bytes"], staging=_stoker.redact(self._shards_uri()))


def _write_plan(
    ds: "ray.data.Dataset", concurrency: Optional[int] = None, ray_remote_args: Optional[Dict[str, Any]] = None
) -> "ray.data.Dataset":
    """The dataset :func:`write` executes: ``ds`` itself, or, when Ray will run the read and
    the write as one operator, a copy whose context has Ray Data's per-operator resource
    reservations off; the caller's dataset and context are left as they are.

    Reservations split the cluster between the operators of a pipeline, so that none starves
    the others. With one operator there is nothing to split, but in Ray Data 2.60 they start
    empty and are filled by its first resource update, a second in: until then, one task runs
    at a time. Four 0.4 s tasks on two one-CPU nodes took 1.48 s as a Ray Data job with them,
    0.86-0.95 s without, as plain Ray tasks (0.81-0.89 s); for a write that packs in a few
    seconds that second is most of what a second node could give.

    One operator means: ``ds`` is a bare read (no map, filter or other step after it), and
    Ray fuses it with the write: neither sets a task-pool size (``concurrency``) and their
    ``ray_remote_args`` are compatible by Ray's own rule. Anything else keeps Ray's
    reservations and the user's settings."""
    try:
        from ray.data._internal.compute import TaskPoolStrategy
        from ray.data._internal.logical.operators.read_operator import Read
        from ray.data._internal.logical.rules.operator_fusion import are_remote_args_compatible

        dag = ds._logical_plan.dag
        fused = (
            isinstance(dag, Read)
            and not dag.input_dependencies
            and concurrency is None
            and isinstance(dag.compute, TaskPoolStrategy)
            and dag.compute.size is None
            and are_remote_args_compatible(dag.ray_remote_args or {}, ray_remote_args or {})
        )
        if not (fused and ds.context.op_resource_reservation_enabled):
            return ds
        bare = ray.data.Dataset.copy(ds, _deep_copy=True)  # its own context, a copy of ds's
        bare.context.op_resource_reservation_enabled = False
        return bare
    except (ImportError, AttributeError, TypeError):  # another Ray's internals: its defaults
        return ds


def pack(
    source: "str | os.PathLike[str]",
    dest: "str | os.PathLike[str]",
    *,
    address: Optional[str] = None,
    source_options: Optional[Dict[str, Any]] = None,
    **write_options: Any,
) -> Dict[str, Any]:
    """``stoker pack`` on a Ray cluster: ``write(read(source), dest, **write_options)``,
    connecting to the cluster at ``address`` first (``"auto"``, ``ray://...``; none: the
    cluster this process is connected to, or a new local one). ``source_options`` are
    ``stoker.open``'s; the destination's store options go in ``write_options`` (``endpoint=``...).
    Reruns resume as :func:`write` does."""
    if not ray.is_initialized():
        # "local": a new local cluster even where RAY_ADDRESS names another.
        ray.init(address=address, log_to_driver=False)
    return write(read(source, **(source_options or {})), dest, **write_options)


def _main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m stoker.ray pack SRC DEST ...`` (what ``stoker pack --ray`` runs)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m stoker.ray", description="Stoker on a Ray cluster.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="pack a source into tar shards, LMDB or token files from Ray tasks")
    p.add_argument("source")
    p.add_argument("dest")
    p.add_argument("--address", help="the Ray cluster: auto, ray://HOST:10001, local (a new local one); default: "
                   "RAY_ADDRESS, else a new local one")
    p.add_argument("--layout", choices=["tar", "lmdb", "tokens"], default="tar")
    p.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE, help="bytes")
    p.add_argument("--samples-per-shard", type=int)
    p.add_argument("--prefix", default="shard")
    p.add_argument("--field")
    p.add_argument("--token-dtype", default="uint16", choices=sorted(TOKEN_DTYPES))
    p.add_argument("--force", action="store_true")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    # Options from `stoker pack --config` travel in the environment, not the command line
    # (they may hold credentials, and a command line is visible to every user of the machine).
    given = json.loads(os.environ.pop("STOKER_RAY_OPTIONS", "{}") or "{}")
    options = {k: v for k, v in given.items() if v is not None}
    # Store options for the destination; names that are also write() parameters (`concurrency`
    # is Ray's there) stay the source's only.
    taken = {"layout", "list", "field", "concurrency", "token_dtype", "shard_size", "prefix", "force"}
    dest_options = {k: v for k, v in options.items() if k not in taken}
    report = pack(
        args.source, args.dest, address=args.address, source_options=options, layout=args.layout,
        shard_size=args.shard_size, samples_per_shard=args.samples_per_shard, prefix=args.prefix, field=args.field,
        token_dtype=args.token_dtype, force=args.force, **dest_options,
    )
    if args.json:
        print(json.dumps(report))
    else:
        kept = f" ({report['kept_shards']} already complete from an earlier run)" if report["kept_shards"] else ""
        what = {"tar": "tar shards at", "lmdb": "LMDB at", "tokens": "token files at"}[args.layout]
        print(f"packed {report['samples']} samples into {report['shards']} {what} {report['dest']}{kept} on Ray")
    return 0


__all__ = [
    "read", "write", "pack", "StokerDatasource", "StokerDatasink", "split", "DEFAULT_ROWS_PER_BLOCK", "DEFAULT_SHARD_SIZE",
]

if __name__ == "__main__":  # pragma: no cover - run as `python -m stoker.ray`
    import sys

    from stoker.ray import _main as main  # the module proper, whose classes Ray's workers import

    sys.exit(main())
