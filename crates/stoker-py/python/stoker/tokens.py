"""Language-model input: token documents packed into fixed-length sequences (see
``stoker.TokenLoader``)."""

import json
import os
from typing import Any, Dict, Iterator, Optional, Sequence, Union

from . import _stoker
from ._stoker import InvalidInputError


class TokenLoader:
    """Packed language-model batches from a tokenized corpus (Megatron ``.bin``/``.idx``, nanoGPT
    ``.bin``/``.npy`` with ``separator=``, LitData ``TokensLoader`` chunks: an item a document), or
    from text (JSONL, Parquet, MDS, LitData, tar ``.txt``) with ``tokenizer="tokenizer.json"``.

    Text is tokenized in Rust (the Hugging Face ``tokenizers`` core, the same ids as the Python
    wheel) once, on all cores, into ``$STOKER_CACHE_DIR/tokens`` (ranks of a node share one pass
    under a lock; a finished pass is reused), because packing must know every document's
    length before the first batch for all ranks to cut the same sequences. ``field`` names the
    text field when samples have several (JSONL's is its ``text_field`` option, ``text``).
    ``bos``/``eos`` may then be given as token text (``eos="<|endoftext|>"``). Arrays of ids in
    a sample format (an MDS ``ndarray`` column, a Parquet list of ints: ``field=``) are copied
    there the same way, without a tokenizer. With ``skip_errors=True`` a document whose bytes are
    bad (a JSONL line that is not JSON or lacks the field, text that is not UTF-8) is packed
    empty and reported on stderr, instead of failing the pass.

    Documents, in the epoch's order (``shuffle``: ``False``, ``True`` or ``"shards"``, seeded
    by ``(seed, epoch)``), each preceded by ``bos`` and followed by ``eos`` when given, are
    joined into one token stream and cut every ``seq_len`` tokens. With ``labels=True`` each row
    holds ``seq_len + 1`` tokens (inputs ``row[:-1]``, labels ``row[1:]``; consecutive rows
    share one token, as Megatron's samples do). ``per_document=True`` puts one document in each
    row instead, truncated or padded (fine-tuning).

    ``global_batch`` is the number of rows over all ranks; rank ``r`` of ``world_size`` gets rows
    ``[r * global_batch / world_size, ...)`` of each global batch. Global batch ``k`` is the same
    whatever the world size, and ``state_dict()`` (the epoch and the next global batch) resumes
    at another world size with the next global batch.

    Each batch is a dict of tensors (numpy arrays with ``output="numpy"``): ``input_ids``
    ``[B, L]`` (int32; ``ids_dtype="int64"`` or ``int64=True`` for int64; ``ids_dtype="uint16"``
    for vocabularies of at most 65,536 tokens: half the bytes to copy and to move to the GPU,
    widened there with ``.long()`` before the embedding), ``position_ids`` ``[B, L]`` int32
    (restarting at every document and row), ``loss_mask`` ``[B, L]`` bool (False on padding and,
    with ``mask_boundaries=True``, on a document's first token after another document in the
    row), ``cu_seqlens`` int32 ``[segments + 1]``, the segment boundaries of the flattened
    ``[B * L]`` batch as flash-attention's varlen functions take them, and ``max_seqlen``.
    ``columns=("input_ids",)`` (or any subset with ``input_ids``) leaves the others out, neither
    computed nor copied: Megatron's GPT defaults and nanoGPT train from ``input_ids`` alone.
    Padding (``pad_id``) happens only at the epoch's end with ``pad_tail=True``; otherwise the
    last partial sequence and global batch are dropped.

    A ``stoker.mix(...)`` of token corpora (or of text, with ``tokenizer=``) is weighted by
    tokens: each source has its weight's share of the tokens at every point of the stream
    (within one document), each source's documents in their own order; the epoch ends when the
    source due next has no document left. ``set_weights`` changes the weights at a resume.
    """

    def __init__(
        self,
        uri_or_dataset: Union[str, Any, "os.PathLike[str]"],
        seq_len: int,
        global_batch: int,
        labels: bool = False,
        shuffle: Union[bool, str] = False,
        seed: int = 0,
        shuffle_window: Optional[int] = None,
        bos: Union[int, str, None] = None,
        eos: Union[int, str, None] = None,
        pad_id: int = 0,
        pad_tail: bool = False,
        per_document: bool = False,
        int64: bool = False,
        ids_dtype: Optional[str] = None,
        mask_boundaries: bool = False,
        prefetch: int = 4,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        output: Optional[str] = None,
        tokenizer: Union[str, "os.PathLike[str]", None] = None,
        field: Optional[str] = None,
        skip_errors: bool = False,
        columns: Optional[Sequence[str]] = None,
        **options: Any,
    ) -> None:
        from . import _as_dataset, _count, _output, _whole_args

        _whole_args(seq_len=seq_len, global_batch=global_batch, seed=seed, shuffle_window=shuffle_window,
                    prefetch=prefetch, rank=rank, world_size=world_size)
        _count("pad_id", pad_id, -(2**63), 2**63 - 1)
        output = _output(output)
        ds = _as_dataset(uri_or_dataset, output, options)
        self.dataset = ds
        self.output = output
        self.epoch = 0
        self._started = False
        self._resume_epoch: Optional[int] = None
        # The epoch set_epoch() asked for since the last iteration began, if any.
        self._asked: Optional[int] = None
        # The iteration under way (its next batches already being cut), if any: the latest
        # one started, until it ends. An iterator kept but not used after a newer one began
        # does not count.
        self._live: Optional[object] = None
        self._loader = _stoker.TokenLoader(
            ds._source,
            seq_len,
            global_batch,
            labels=labels,
            shuffle=shuffle,
            seed=seed,
            shuffle_window=shuffle_window,
            bos=bos,
            eos=eos,
            pad_id=pad_id,
            pad_tail=pad_tail,
            per_document=per_document,
            int64=int64,
            ids_dtype=_ids_dtype(ids_dtype),
            mask_boundaries=mask_boundaries,
            prefetch=prefetch,
            rank=rank,
            world_size=world_size,
            tokenizer=None if tokenizer is None else os.fspath(tokenizer),
            field=field,
            skip_errors=skip_errors,
            # One name alone is one column, not its letters.
            columns=None if columns is None else [columns] if isinstance(columns, str) else list(columns),
        )

    def __len__(self) -> int:
        """Batches in the current epoch (global batches: this rank gets its rows of each)."""
        return self._loader.batches(self.epoch)

    def tokens(self, epoch: Optional[int] = None) -> int:
        """Tokens in an epoch's stream (documents with their BOS and EOS)."""
        return self._loader.tokens(self.epoch if epoch is None else epoch)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads."""
        from . import _count

        epoch = _count("set_epoch's epoch", epoch, 0, 2**64 - 1)
        self.epoch = epoch
        self._asked = epoch
        self._started = False

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        from . import _iteration_epoch

        asked, self._asked = self._asked, None
        self.epoch = _iteration_epoch(self.epoch, self._started, self._resume_epoch, asked)
        self._resume_epoch = None
        self._started = True
        # This iteration's own token: an older iterator closed late must not clear it.
        me = object()
        self._live = me
        # The conversion looked up once an iteration, not once a batch: at 8 rows a batch the
        # consumer's Python is a sixth of the loader's CPU.
        convert, capsules = self._converter()
        try:
            for batch in self._loader.epoch(self.epoch):
                yield batch.token_dict(convert, capsules)
        finally:
            # Left (the epoch's end, a `break` once the loop drops the iterator, an error).
            if self._live is me:
                self._live = None

    def _converter(self) -> Any:
        # The dict is built in Rust, in one call: zero-copy columns typed there (the mask as
        # bool, cu_seqlens as the int32 offsets) with max_seqlen. torch takes DLPack capsules
        # directly, which skips its per-column protocol negotiation in Python.
        if self.output == "torch":
            import torch

            return torch.from_dlpack, True
        import numpy

        return numpy.from_dlpack, False

    def state_dict(self) -> Dict[str, Any]:
        """Where the run stands: the epoch and the next global batch (any world size resumes it)."""
        return json.loads(self._loader.state())

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state_dict()``: the next iteration delivers the next global batch."""
        from . import _state_json

        self._loader.load_state(_state_json(state))
        # The loader's reading of it: a state at an epoch's end resumes at the next one.
        self._resume_epoch = int(json.loads(self._loader.state())["epoch"])
        self.epoch = self._resume_epoch
        self._asked = None
        self._started = False

    def set_weights(self, weights: Any) -> None:
        """A mix's new weights (one per source, in order), from the next global batch: the
        batches delivered stay as they were; the documents not yet read are taken in the new
        proportions for the rest of the epoch (which ends when a source runs out), and the change
        is kept in ``state_dict()``. Call it after ``load_state_dict`` to change a data schedule at
        a resume, or between iterations: not while an iteration is under way (its next batches
        are already cut under the old weights), which is an error."""
        if self._live is not None:
            raise InvalidInputError(
                "set_weights() while an iteration of the epoch is under way: its next batches are already cut under "
                "the old weights. Call it between iterations (leave the loop first; the next iteration starts the "
                "next epoch, as after any loop left early) or after load_state_dict() to resume under the new weights"
            )
        from . import _real

        # In order, one per source: a set or a dict has no order to match the sources by.
        if isinstance(weights, (str, bytes, dict, set, frozenset)) or not hasattr(weights, "__getitem__"):
            raise InvalidInputError(f"weights must be a sequence of numbers, one per source, not {weights!r}")
        self._loader.set_weights([_real("weights", w) for w in weights])

    def stats(self) -> Dict[str, Any]:
        """Consumer wait, throughput, requests and bytes read; for a mix, ``source_tokens``:
        the tokens this rank read per source."""
        return self._loader.stats()


def _ids_dtype(dtype: Any) -> Optional[str]:
    """The name of the ids type asked for: a name, or a numpy or torch dtype (``torch.uint16``)."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        return text[len("torch."):]
    try:
        import numpy

        return numpy.dtype(dtype).name
    except (ImportError, TypeError, ValueError):
        raise InvalidInputError(f"ids_dtype={dtype!r}: give 'int32', 'int64' or 'uint16'") from None
