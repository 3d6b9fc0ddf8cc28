"""Stoker: keeps the GPU fed.

``stoker.open(uri, **options)`` gives a map-style dataset that drops into
``torch.utils.data.DataLoader`` (fork and spawn workers both work); ``stoker.Loader`` is the
faster path: batches prefetched by Rust threads, shuffled with a resumable sampler, split by
rank, decoded and augmented in Rust (``decode={"jpg": stoker.Image(224), "cls": stoker.Int()}``),
handed over zero-copy. ``stoker.mix({uri: weight, ...})`` mixes several sources by weight.

Credentials (``secret_access_key=...``, a password in an ``endpoint``, secrets in the URI's
query) never show: ``Dataset.uri``, ``Dataset.options``, ``repr``, ``vars`` and exception
messages have them masked as ``***``. A pickled dataset does carry them, since a spawned
DataLoader worker must open the source too: keep pickles as private as the credentials.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import sys
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _stoker
from ._stoker import (
    CorruptDataError,
    CudaUnavailableError,
    DecodeError,
    InvalidInputError,
    NotFoundError,
    RemoteError,
    StokerError,
)


class DamageWarning(UserWarning):
    """Damaged shards or members were skipped while opening a source (``on_damage=skip``)."""


__all__ = [
    "DamageWarning",
    "open",
    "mix",
    "Dataset",
    "Loader",
    "TokenLoader",
    "Image",
    "Int",
    "Npy",
    "Bytes",
    "Tokens",
    "diagnose",
    "pack",
    "index",
    "demo",
    "StokerError",
    "NotFoundError",
    "InvalidInputError",
    "CorruptDataError",
    "DecodeError",
    "RemoteError",
    "CudaUnavailableError",
]

# torch is not imported here: `import stoker` takes milliseconds where torch takes seconds.
# `stoker.Dataset` (a torch Dataset where torch is installed) is made at its first use, and
# the Loader imports torch or numpy at its first batch.

Sample = Dict[str, Any]


def _option(key: str, value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if key == "columns" and isinstance(value, (list, tuple)):
        # ``columns=["image", "label"]`` is the query's ``columns=image,label``.
        return ",".join(value)
    return value


def _options_json(options: Dict[str, Any]) -> str:
    values = {k: _option(k, v) for k, v in options.items()}
    try:
        # NaN and infinities are not JSON: refused here, naming the option, rather than as a
        # parse error at a column of text the user never wrote.
        return json.dumps(values, allow_nan=False)
    except ValueError as e:
        for k, v in values.items():
            try:
                json.dumps(v, allow_nan=False)
            except ValueError:
                raise InvalidInputError(f"option {k!r}: {e} (NaN and infinities are no option's value)") from None
        raise InvalidInputError(f"options: {e}") from None


# No state a loader writes nests deeper than a few levels; a damaged one may nest thousands.
_STATE_DEPTH = 32


def _plain(value: Any, depth: int = 0) -> Any:
    """A state's mappings as dicts (an OmegaConf or other Mapping), for json."""
    if depth > _STATE_DEPTH:
        raise InvalidInputError(f"the state nests deeper than {_STATE_DEPTH} levels: it is not one a loader wrote")
    if isinstance(value, Mapping):
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    return value


def _state_json(state: Any) -> str:
    """A state as the JSON the extension reads, or an error saying it cannot be one."""
    try:
        return json.dumps(_plain(state), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"the state is not one a loader wrote: {e}") from None


def _shown_value(key: str, value: Any) -> Any:
    """An option's value as it may be shown: a credential's as ``***``, a URL's without its
    userinfo or secret query values (an ``endpoint`` with ``user:password@``)."""
    if _stoker.is_secret_option(key):
        return "***"
    if isinstance(value, Mapping):
        return {k: _shown_value(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_shown_value(key, v) for v in value)
    if isinstance(value, str) and "://" in value:
        return _stoker.redact(value)
    return value


def _shown(thing: Any) -> str:
    """``repr`` of something a user passed (a URI, a tuple of them), credentials redacted."""
    if isinstance(thing, (str, os.PathLike)):
        return repr(_stoker.redact(os.fspath(thing)))
    return _stoker.redact_text(repr(thing))


class _OpenArgs:
    """A source's URI and options as given, credentials included: what opening it takes, in
    this process or in a DataLoader worker it is pickled to (pickles carry them). Shown only
    as the redacted URI; kept in slots, so ``vars`` of the object holding it shows no secret."""

    __slots__ = ("uri", "options")

    def __init__(self, uri: str, options: Dict[str, Any]) -> None:
        self.uri = uri
        self.options = options

    def json(self) -> str:
        return _options_json(self.options)

    def shown_uri(self) -> str:
        return _stoker.redact(self.uri)

    def shown_options(self) -> Dict[str, Any]:
        return {k: _shown_value(k, v) for k, v in self.options.items()}

    def __repr__(self) -> str:
        return f"<stoker open arguments of {self.shown_uri()}: credentials not shown>"

    def __getstate__(self) -> Tuple[str, Dict[str, Any]]:
        return (self.uri, self.options)

    def __setstate__(self, state: Tuple[str, Dict[str, Any]]) -> None:
        self.uri, self.options = state


class _ShownArgs:
    """``uri`` and ``options`` of what is opened from ``self._args``, credentials masked."""

    _args: _OpenArgs

    @property
    def uri(self) -> str:
        """The URI as given, credentials redacted."""
        return self._args.shown_uri()

    @property
    def options(self) -> Dict[str, Any]:
        """The options as given, credentials (and an endpoint's password) shown as ``***``."""
        return self._args.shown_options()


def _to_python(key: str, fields: List[Tuple[str, bytes]]) -> Dict[str, Any]:
    # Always a webdataset-style dict, whatever the source: one shape to write code against.
    out: Dict[str, Any] = {"__key__": key}
    out.update(fields)
    return out


def _whole(name: str, value: Any) -> int:
    """``value`` as an int, or an error naming ``name``: a float (1.5), a bool or text is refused,
    not rounded or read (ranges are checked where the spec is)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidInputError(f"{name} must be a whole number, not {value!r}")
    return int(value.__index__())


def _real(name: str, value: Any) -> float:
    """``value`` as a finite float, or an error naming ``name``."""
    if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
        raise InvalidInputError(f"{name} must be a number, not {value!r}")
    try:
        f = float(value)
    except OverflowError:  # an int past a float's range (10**400)
        raise InvalidInputError(f"{name} must be a finite number, not one past a float's range") from None
    if f != f or f in (float("inf"), float("-inf")):
        raise InvalidInputError(f"{name} must be a finite number, not {value!r}")
    return f


def _flag(name: str, value: Any) -> bool:
    """``value`` as a bool, or an error naming ``name`` (``"no"`` is not False, nor True)."""
    if type(value).__name__ not in ("bool", "bool_"):
        raise InvalidInputError(f"{name} must be True or False, not {value!r}")
    return bool(value)


class Image:
    """Decode an image field (JPEG, PNG, WebP) into a fixed-size RGB tensor, in Rust.

    ``crop="random_resized"`` is torchvision's ``RandomResizedCrop(size, scale, ratio)``;
    ``crop="center"`` is ``Resize(resize)`` + ``CenterCrop(size)`` (``resize`` defaults to
    ``size * 256 / 224``); ``crop="squash"`` resizes the whole image to ``size``. ``flip=True`` is
    ``RandomHorizontalFlip()`` (half the samples flipped); a number is the probability
    (``flip=1.0`` flips every image). Resizing is antialiased bilinear, as PIL's.
    ``layout`` is ``"HWC"`` (``[H, W, 3]``) or ``"CHW"``; ``dtype`` ``"uint8"``, ``"float16"``
    or ``"float32"`` (floats are scaled to 0..1, then ``(x - mean) / std`` when given).
    Random choices depend only on (seed, epoch, sample index): reruns, resumed runs and runs at
    another world size give identical tensors. Images over ``max_pixels`` are refused.

    Colour, after the resize (torchvision's ``transforms.v2`` semantics on uint8 images):
    ``color_jitter=(brightness, contrast, saturation, hue)`` is ``ColorJitter(brightness,
    contrast, saturation, hue)`` (Albumentations: ``ColorJitter`` with the same four): factors
    from ``[max(0, 1 - a), 1 + a]`` (hue ``[-h, h]``, ``h <= 0.5``), the four in a random order,
    0 leaving one out; ``grayscale=p`` is ``RandomGrayscale(p)`` (Albumentations: ``ToGray(p=p)``
    with its default weights 0.299/0.587/0.114, within a level). ``blur=(kernel, sigma_lo,
    sigma_hi)`` is ``GaussianBlur(kernel, sigma=(sigma_lo, sigma_hi))`` after the colour, applied
    to a ``blur_p`` share of the samples (``RandomApply([GaussianBlur(...)], p=blur_p)``;
    Albumentations: ``GaussianBlur(blur_limit=(kernel, kernel), sigma_limit=(lo, hi), p=blur_p)``).
    """

    def __init__(
        self,
        size: Union[int, Tuple[int, int]],
        crop: str = "random_resized",
        flip: Union[bool, float] = False,
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        resize: Optional[int] = None,
        layout: str = "HWC",
        dtype: str = "uint8",
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        max_pixels: int = 100_000_000,
        color_jitter: Optional[Sequence[float]] = None,
        grayscale: float = 0.0,
        blur: Optional[Tuple[int, float, float]] = None,
        blur_p: float = 1.0,
    ) -> None:
        if hasattr(size, "__len__") and not isinstance(size, (str, bytes)) and getattr(size, "ndim", 1) == 1:
            # (H, W): a tuple, a list, a config's list, a 1-D array.
            if len(size) != 2:
                raise InvalidInputError(f"size is one number or (height, width), not {size!r}")
            h, w = (_whole("size", d) for d in size)
        else:
            h = w = _whole("size", size)
        if color_jitter is not None and len(color_jitter) != 4:
            raise InvalidInputError("color_jitter is (brightness, contrast, saturation, hue)")
        if blur is not None and len(blur) != 3:
            raise InvalidInputError("blur is (kernel, sigma_lo, sigma_hi)")
        if crop == "random_resized":
            mode: Dict[str, Any] = {"mode": "random_resized", "scale": list(scale), "ratio": list(ratio)}
        elif crop == "center":
            mode = {"mode": "center", "resize": None if resize is None else _whole("resize", resize)}
        elif crop == "squash":
            mode = {"mode": "squash"}
        else:
            raise InvalidInputError(f"crop must be 'random_resized', 'center' or 'squash', not {crop!r}")
        if layout not in ("HWC", "CHW"):
            raise InvalidInputError(f"layout must be 'HWC' or 'CHW', not {layout!r}")
        if (mean is None) != (std is None):
            raise InvalidInputError("give both mean and std to normalize, or neither")
        # True is torchvision's RandomHorizontalFlip() (p=0.5), as `flip` is on the CLI.
        flip_p = 0.5 if flip is True else 0.0 if flip is False else _real("flip", flip)
        if not 0.0 <= flip_p <= 1.0:
            raise InvalidInputError(f"flip is True, False or a probability in [0, 1], not {flip!r}")
        self.spec: Dict[str, Any] = {
            "kind": "image",
            "size": [h, w],
            "crop": mode,
            "flip": flip_p,
            "layout": layout,
            "dtype": dtype,
            "normalize": None
            if mean is None
            else {"mean": [_real("mean", m) for m in mean], "std": [_real("std", d) for d in std or ()]},
            "max_pixels": _whole("max_pixels", max_pixels),
            "color_jitter": None
            if color_jitter is None
            else dict(zip(("brightness", "contrast", "saturation", "hue"), [_real("color_jitter", c) for c in color_jitter])),
            "grayscale": _real("grayscale", grayscale),
            "blur": None
            if blur is None
            else {"kernel": _whole("blur kernel", blur[0]), "sigma": [_real("blur", blur[1]), _real("blur", blur[2])],
                  "p": _real("blur_p", blur_p)},
        }

    def __repr__(self) -> str:
        return f"stoker.Image({self.spec})"


class Int:
    """Decode integer text (``.cls``, ``.txt``: ``"7"``) into an int64 tensor ``[B]``."""

    spec: Dict[str, Any] = {"kind": "int"}

    def __repr__(self) -> str:
        return "stoker.Int()"


class Npy:
    """Decode ``.npy`` arrays into one stacked array ``[B, *shape]``. Every sample of the run
    must have the first one's dtype and shape (or the declared ones); others raise
    ``DecodeError`` naming the sample."""

    def __init__(self, dtype: Optional[str] = None, shape: Optional[Sequence[int]] = None) -> None:
        dims = None if shape is None else [_whole("shape", d) for d in shape]
        self.spec: Dict[str, Any] = {"kind": "npy", "dtype": dtype, "shape": dims}

    def __repr__(self) -> str:
        return f"stoker.Npy({self.spec})"


class Bytes:
    """Keep a field as raw bytes: ``(data, offsets)`` in every batch (the default for fields
    not named in ``decode``). With ``shape``, every value must be exactly that many elements
    of ``dtype`` and the field is one dense ``[B, *shape]`` tensor."""

    def __init__(self, shape: Optional[Sequence[int]] = None, dtype: str = "uint8") -> None:
        if shape is None:
            self.spec: Dict[str, Any] = {"kind": "bytes"}
        else:
            self.spec = {"kind": "fixed", "dtype": dtype, "shape": [_whole("shape", d) for d in shape]}

    def __repr__(self) -> str:
        return f"stoker.Bytes({self.spec})"


class Tokens:
    """Tokenize a UTF-8 text field in Rust, one document per row: ``[B, seq_len]`` token ids
    and a ``FIELD_len`` column ``[B]`` (int32) of each row's tokens before its padding.

    ``tokenizer`` is a Hugging Face ``tokenizer.json`` (the ``tokenizers`` crate, the Python
    wheel's ids); documents are tokenized on the Loader's decode threads. ``bos``/``eos`` (an id
    or the token's text, ``eos="<|endoftext|>"``) go around every document; a longer document
    is truncated to fit (its BOS and EOS kept), or with ``truncate=False`` raises
    ``DecodeError``; a shorter one is padded with ``pad_id``. ``dtype`` is ``"int32"``,
    ``"int64"`` or ``"uint16"`` (vocabularies of at most 65,536 tokens). The mask of real tokens
    is ``torch.arange(seq_len) < batch["text_len"][:, None]``.

    This is the fine-tuning shape (one sample per row). Pretraining's packed rows, where
    documents are joined and cut to exactly ``seq_len``, are ``stoker.TokenLoader``'s.
    """

    def __init__(
        self,
        tokenizer: Union[str, "os.PathLike[str]"],
        seq_len: int,
        bos: Union[int, str, None] = None,
        eos: Union[int, str, None] = None,
        pad_id: int = 0,
        dtype: str = "int32",
        truncate: bool = True,
    ) -> None:
        self.spec: Dict[str, Any] = {
            "kind": "tokens",
            "tokenizer": os.fspath(tokenizer),
            "seq_len": _whole("seq_len", seq_len),
            "bos": bos,
            "eos": eos,
            "pad_id": _whole("pad_id", pad_id),
            "dtype": dtype,
            "truncate": _flag("truncate", truncate),
        }

    def __repr__(self) -> str:
        return f"stoker.Tokens({self.spec})"


def _decode_json(decode: Optional[Dict[str, Any]]) -> Optional[str]:
    if not decode:
        return None
    out = {}
    for field, d in decode.items():
        spec = getattr(d, "spec", None)
        if spec is None:
            raise InvalidInputError(
                f"decode[{field!r}] must be stoker.Image(...), stoker.Int(), stoker.Npy(), stoker.Bytes() or "
                f"stoker.Tokens(...), not {d!r}"
            )
        out[field] = spec
    return json.dumps(out)


class _Dataset(_ShownArgs):
    """A map-style dataset over any Stoker source: ``len(ds)``, ``ds[i]``, ``ds.get_many(idx)``.

    ``ds[i]`` is ``{"__key__": key, field: bytes, ...}`` for every source (files and LMDB give
    one field, ``"data"``; tar shards one per member extension), as webdataset gives it. An
    LMDB key that is not UTF-8 is its bytes escaped (``\\xNN``, a backslash as ``\\\\``), so
    keys stay distinct.

    ``uri`` and ``options`` are shown with credentials masked (``***``); so are ``repr``
    and ``vars``. Pickles as its URI and options, credentials included: each DataLoader
    worker (fork or spawn) reopens it, and needs them to. Keep pickles private.
    """

    def __init__(self, uri: str, transform: Optional[Callable[[Sample], Any]] = None, **options: Any) -> None:
        self._args = _OpenArgs(os.fspath(uri), options)
        self.transform = transform
        self._source = _stoker.Source(self._args.uri, self._args.json())
        damage = self.damage()
        if damage:
            # Said once, where the dataset is opened (not again in each DataLoader worker).
            lines = "\n".join("  " + d["text"] for d in damage[:10])
            more = f"\n  ... and {len(damage) - 10} more" if len(damage) > 10 else ""
            warnings.warn(
                f"{self.uri}: {len(damage)} damaged stretch(es) skipped while opening (on_damage=skip); "
                f"their samples are not in the dataset:\n{lines}{more}\n"
                "Details: Dataset.damage() or Loader.stats()['damage'].",
                DamageWarning,
                stacklevel=3,
            )

    def damage(self) -> List[Dict[str, Any]]:
        """Damage stepped over while opening under ``on_damage=skip`` (``skip_errors=True`` in
        the Loader): one dict per damaged stretch or unreadable shard, with ``shard``,
        ``cause``, ``start``/``end`` bytes, ``key_before``/``key_after``, ``dropped`` keys,
        ``samples_lost`` (None when unknown), ``reason`` and ``text`` (all of it in one line)."""
        return json.loads(self._source.damage_json())  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> Any:
        key, fields = self._source.get(index)
        sample = _to_python(key, fields)
        return self.transform(sample) if self.transform else sample

    def get_many(self, indices: Sequence[int]) -> List[Any]:
        """Samples at ``indices``, read concurrently (coalesced for tar shards)."""
        out = [_to_python(k, f) for k, f in self._source.get_many(list(indices))]
        return [self.transform(s) for s in out] if self.transform else out

    def info(self) -> Dict[str, Any]:
        """Layout, shard count, sample count and URI (credentials redacted)."""
        return self._source.info()

    def __repr__(self) -> str:
        return repr(self._source)

    def __getstate__(self) -> Dict[str, Any]:
        # The URI and options as given, credentials included: the process this goes to must
        # open the source itself.
        return {"args": self._args, "transform": self.transform}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self._args, self.transform = state["args"], state["transform"]
        self._source = _stoker.Source(self._args.uri, self._args.json())


_DATASET: Optional[type] = None


def _dataset_class(torch: bool = True) -> Any:
    """``stoker.Dataset``: the dataset as a subclass of ``torch.utils.data.Dataset`` where torch
    is installed (imported here, at the first dataset made), a plain class where it is not.
    With ``torch=False`` and torch not imported yet, the plain class (``_Dataset``, which
    ``stoker.Dataset`` subclasses): what a numpy Loader reads through without importing torch."""
    global _DATASET
    if _DATASET is None:
        if not torch and "torch" not in sys.modules:
            return _Dataset
        try:
            from torch.utils.data import Dataset as base

            bases: Tuple[type, ...] = (_Dataset, base)
        except ImportError:
            bases = (_Dataset,)
        _DATASET = type("Dataset", bases, {"__module__": __name__, "__qualname__": "Dataset", "__doc__": _Dataset.__doc__})
    return _DATASET


if TYPE_CHECKING:
    Dataset = _Dataset
else:

    def __getattr__(name: str) -> Any:
        # `stoker.Dataset` (and pickles of its instances, which name it) made on first use.
        if name == "Dataset":
            return _dataset_class()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _output(output: Optional[str]) -> str:
    """The batches' array type: ``output`` as given, else ``"torch"`` where torch is installed
    and ``"numpy"`` where it is not (looked up, not imported). Missing, it is an error here,
    naming what to install, not at the first batch."""
    if output is None:
        output = "torch" if _installed("torch") else "numpy"
    if output not in ("torch", "numpy"):
        raise InvalidInputError(f"output must be 'torch' or 'numpy', not {output!r}")
    if not _installed(output):
        other = "numpy" if output == "torch" else "torch"
        raise InvalidInputError(
            f"output={output!r} needs {output}, which is not installed here: pip install 'stoker[{output}]'"
            + (f" (or output={other!r})" if _installed(other) else "")
        )
    return output


def _as_dataset(uri_or_dataset: Any, output: str, options: Dict[str, Any]) -> "_Dataset":
    """A loader's dataset: the one given, or one opened on ``uri_or_dataset`` with ``options``
    (a plain one, without importing torch, for a numpy loader while torch is not imported)."""
    if isinstance(uri_or_dataset, _Dataset):
        if uri_or_dataset.transform is not None:
            # The loader reads the dataset's source, not its __getitem__: the transform would
            # be skipped without a word.
            raise InvalidInputError(
                f"{uri_or_dataset.uri}: a loader reads a dataset's samples without its transform; pass transform= "
                "to the loader instead (it runs on its threads, ahead of the loop)"
            )
        if options:
            # Source options shape how a source is opened: given with an opened dataset they
            # would be dropped without a word (and a misspelt argument, `suffle=`, lands here).
            raise InvalidInputError(
                f"{', '.join(map(repr, sorted(options)))}: not an argument of this loader, and source options apply only "
                f"when the loader opens a URI; {uri_or_dataset.uri} is already open: pass options to stoker.open() "
                "(or check the argument's spelling)"
            )
        return uri_or_dataset
    return _dataset_class(torch=output == "torch")(os.fspath(uri_or_dataset), **options)  # type: ignore[no-any-return]


def _count(name: str, value: Any, least: int, most: int) -> int:
    """``value`` as a whole number in ``least..=most``, or an error naming ``name`` (a float,
    NaN or a bool is refused rather than rounded or taken as 1)."""
    n = _whole(name, value)
    if not least <= n <= most:
        raise InvalidInputError(f"{name} must be from {least} to {most}, not {n}")
    return n


def _whole_args(**args: Any) -> None:
    """Each argument given (not None) a whole number from 0 to 2^64 - 1, or an error naming it:
    the extension's conversion says only "int too big to convert" or "can't convert negative
    int to unsigned". Lower bounds of meaning (a batch of at least one row) are the loader's."""
    for name, value in args.items():
        if value is not None:
            _count(name, value, 0, 2**64 - 1)


def _installed(module: str) -> bool:
    """Whether ``module`` is imported or importable, without importing it."""
    return sys.modules.get(module) is not None or importlib.util.find_spec(module) is not None


def open(uri: Union[str, "os.PathLike[str]"], transform: Optional[Callable[[Sample], Any]] = None, **options: Any) -> Dataset:  # noqa: A001
    """Open a source: a directory, tar shards (``shards/train-{000..127}.tar``), an LMDB
    directory, or ``s3://``, ``gs://``, ``az://``, ``http(s)://`` URIs. Options are the URI
    query keys (``layout``, ``endpoint``, ``concurrency``...)."""
    return _dataset_class()(os.fspath(uri), transform=transform, **options)


SourceLike = Union[str, "os.PathLike[str]", "Dataset"]


def pack(
    source: SourceLike,
    dest: Union[str, "os.PathLike[str]"],
    *,
    layout: str = "tar",
    shard_size: Optional[int] = None,
    samples_per_shard: Optional[int] = None,
    prefix: Optional[str] = None,
    group: bool = False,
    field: Optional[str] = None,
    force: bool = False,
    jobs: Optional[int] = None,
    dest_options: Optional[Dict[str, Any]] = None,
    **options: Any,
) -> Dict[str, Any]:
    """Pack ``source`` (a URI, opened with ``options``, or a Dataset) into ``dest``: WebDataset
    tar shards (``layout="tar"``, up to ``shard_size`` bytes, 256 MiB by default, named
    ``{prefix}-000000.tar``...) with their indexes and manifest, or one LMDB environment
    (``layout="lmdb"``). ``stoker pack`` from Python: the plan is made first, and a rerun after
    an interruption finishes the job. Returns the report (samples, shards, bytes, seconds)."""
    src = source._source if isinstance(source, _Dataset) else _stoker.Source(os.fspath(source), _options_json(options))
    return _stoker.pack(
        src, os.fspath(dest), layout, shard_size, samples_per_shard, prefix, group, field, force, jobs,
        _options_json(dest_options or {}),
    )


def index(uri: Union[str, "os.PathLike[str]"], **options: Any) -> Dict[str, Any]:
    """Build or refresh the shard indexes of a directory or prefix and write its manifest
    (``stoker index``); ``checksums=True`` records every tar member's checksum."""
    return _stoker.index(os.fspath(uri), _options_json(options))


def demo(path: Union[str, "os.PathLike[str]"] = "demo", images: int = 512, documents: int = 1000) -> Dict[str, Any]:
    """Write a small demo dataset under ``path`` to try Stoker on (``stoker demo`` on the CLI):
    ``images/train-0000.tar`` .. ``train-0003.tar`` (WebDataset: ``jpg`` photos-like JPEGs and
    ``cls`` labels 0-9), ``text/part-0000.jsonl`` and ``part-0001.jsonl`` (``{"id", "text"}``
    documents) and ``tokenizer.json`` (word level, with ``<|endoftext|>``). The bytes depend on
    the counts alone. Returns the paths written and the bytes in all."""
    return _stoker.demo(os.fspath(path), int(images), int(documents))


def _mix_entry(source: SourceLike, weight: Any, extra: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if isinstance(weight, Mapping):  # {uri: {"weight": w, "name": n, **options}}
        extra = {**weight, **(extra or {})}
        weight = extra.pop("weight", None)
    extra = dict(extra or {})
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise InvalidInputError(f"the weight of mix source {_shown(source)} must be a number, not {_shown(weight)}")
    name = extra.pop("name", None)
    if isinstance(source, _Dataset):
        if source.transform is not None:
            raise InvalidInputError(
                f"{source.uri}: a dataset with a transform cannot join a mix; pass transform= to the Loader instead"
            )
        uri, options = source._args.uri, {**source._args.options, **extra}
    else:
        uri, options = os.fspath(source), extra
    weight = _real(f"the weight of mix source {_shown(source)}", weight)
    entry: Dict[str, Any] = {"uri": uri, "weight": weight, "options": json.loads(_options_json(options))}
    if name is not None:
        entry["name"] = str(name)
    return entry


def mix(
    sources: Union[Mapping[Any, Any], Sequence[Tuple[Any, ...]]],
    epoch_length: Optional[int] = None,
    replacement: bool = False,
    fill_missing: Union[None, bool, Mapping[str, Union[str, bytes]]] = None,
    weight_by: str = "samples",
    **options: Any,
) -> Dataset:
    """Several sources read as one, in proportions fixed by their weights.

    ``sources`` is ``{uri: weight}``, ``{uri: {"weight": w, "name": "web", **options}}`` or
    ``[(uri_or_dataset, weight), ...]`` (optionally ``(uri_or_dataset, weight, {"name": ...,
    **options})``); ``options`` apply to every source under its own. Give the result to
    ``stoker.Loader``: each epoch, every source contributes exactly its weight's share of the
    epoch's samples (``epoch_length``, or by default the longest epoch in which no source runs
    out; ``replacement=True`` lets a small source repeat evenly instead), drawn by its own
    permutation and spread over the epoch by a permutation keyed by (seed, epoch). Resuming
    (``state_dict``) works mid-epoch and at another world size, as for one source.

    Each batch has ``"__source__"``: the source name of every sample (default names are the
    URIs), to split losses per dataset; ``Loader.stats()["sources"]`` gives each source's
    delivered samples and bytes and the time spent waiting for its reads.

    Sources must have the same fields: one that lacks a field another has is an error naming
    both, unless ``fill_missing`` fills it (``True``: empty bytes; ``{"cls": "-1"}``: that
    value for that field). As a map-style dataset, the mix is its sources concatenated.

    ``weight_by="tokens"`` makes the weights shares of tokens, for ``stoker.TokenLoader`` (which
    weights every mix by tokens); ``stoker.Loader`` refuses it.
    """
    if isinstance(sources, Mapping):
        entries = [_mix_entry(s, w, None) for s, w in sources.items()]
    else:
        entries = []
        for item in sources:
            # Lists too: what a JSON or YAML config gives for a tuple. The item is not shown:
            # its options may hold credentials.
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
                what = f"a {type(item).__name__}" + (f" of {len(item)}" if isinstance(item, (tuple, list)) else "")
                raise InvalidInputError(f"mix sources are (uri_or_dataset, weight[, options]) tuples, not {what}")
            entries.append(_mix_entry(item[0], item[1], item[2] if len(item) == 3 else None))
    if weight_by not in ("samples", "tokens"):
        raise InvalidInputError(f"weight_by must be 'samples' or 'tokens', not {weight_by!r}")
    spec: Dict[str, Any] = {"sources": entries, "replacement": _flag("replacement", replacement), "weight_by": weight_by}
    if epoch_length is not None:
        spec["epoch_length"] = _count("epoch_length", epoch_length, 0, 2**64 - 1)
    if isinstance(fill_missing, Mapping):
        fills = {}
        for field, value in fill_missing.items():
            if isinstance(value, bytes):
                try:
                    value = value.decode("utf-8")
                except UnicodeDecodeError:
                    raise InvalidInputError(f"fill_missing[{field!r}] must be UTF-8 text") from None
            fills[str(field)] = str(value)
        spec["fill_missing"] = fills
    elif fill_missing is not None:
        spec["fill_missing"] = _flag("fill_missing", fill_missing)
    return _dataset_class()("mix:" + json.dumps(spec), **options)


def _iteration_epoch(epoch: int, started: bool, resume: Optional[int], asked: Optional[int]) -> int:
    """The epoch an iteration of a loader reads: a loaded state's (``resume``), else the one
    after the last iteration's, else ``epoch`` (set by ``set_epoch``, which also gives
    ``asked``). A ``set_epoch`` naming another epoch than a loaded state's is an error: reading
    the resumed epoch would skip the one asked for, reading the asked one would drop the resume."""
    if resume is None:
        if started and epoch >= 2**64 - 1:
            raise InvalidInputError(f"epoch {epoch} is the last a loader can read: set_epoch() to go on")
        return epoch + 1 if started else epoch
    if asked is not None and asked != resume:
        raise InvalidInputError(
            f"set_epoch({asked}) after load_state_dict() of a state for epoch {resume}: "
            f"call set_epoch({resume}) to resume there (a state taken at an epoch's end is the next epoch's start)"
        )
    return resume


class Loader:
    """Batches from Rust threads, prefetched and in order, handed over without copies.

    Each batch is a dict like webdataset's batched output: ``"__key__"`` (list of keys),
    ``"__index__"`` (source indices), for a ``stoker.mix`` ``"__source__"`` (list of source
    names) and one entry per field. Fields named in ``decode`` are
    decoded on Rust threads into one tensor each (``stoker.Image`` -> uint8 ``[B, H, W, 3]``,
    ``stoker.Int`` -> int64 ``[B]``, ``stoker.Npy`` -> ``[B, *shape]``); every other field is
    ``(data, offsets)``: uint8 values back to back and int64 offsets of length ``B + 1``. A
    field's type and shape never change during a run. ``output="numpy"`` gives numpy arrays,
    ``output="torch"`` tensors; by default tensors where torch is installed, numpy arrays where
    it is not (torch or numpy is imported at the first batch, not before). The decode threads' working memory (an image's pixels are decoded whole before the crop and
    resize) shares one budget, ``decode_memory_bytes`` (default: ``max_bytes_in_flight``): a
    huge image waits for room instead of every thread holding one, and an image that alone
    needs more than a decode may take raises ``stoker.DecodeError`` naming the option.

    ``transform=fn`` is the escape hatch for arbitrary Python: ``fn(sample_dict)`` runs on
    ``transform_threads`` Python threads ahead of the consumer (useful with code that releases
    the GIL, such as PIL's codecs) and the results are collated with ``collate_fn`` (torch's
    ``default_collate`` by default).

    Iterating runs one epoch; each new iteration starts the next epoch (or ``set_epoch``).
    ``state_dict()``/``load_state_dict()`` resume mid-epoch, also in another process or at
    another world size. ``rank``/``world_size`` default to ``RANK``/``WORLD_SIZE``.

    ``shuffle`` picks each epoch's order: ``False`` reads in storage order; ``True`` draws a
    new order of all samples (every sample is its own read: best mixing, and over a remote
    store as many small requests as samples); ``"shards"`` (sources in shards: tar, Parquet
    row groups, MDS, LitData, TFRecord, HDF5 and JSONL files; not one file per sample, LMDB
    or a mix) permutes the shards and shuffles the samples of each window of ``shuffle_window`` shards (default 4)
    together, reading each window's shards ahead with a few large requests, in the order the
    epoch visits them. It streams a remote dataset at the link's speed, at the cost of less
    mixing: a batch draws from ``shuffle_window`` shards. Up to two windows of shards are held
    in memory (the next one is read early only while both fit in ``max_bytes_in_flight``, or
    when a batch that spans the two needs it).
    Every order is seeded by ``(seed, epoch)``, exactly-once, rank-partitioned and resumable.
    """

    def __init__(
        self,
        uri_or_dataset: Union[str, Dataset, "os.PathLike[str]"],
        batch_size: int,
        shuffle: Union[bool, str] = False,
        seed: int = 0,
        drop_last: bool = False,
        prefetch: int = 4,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        device: Optional[str] = None,
        output: Optional[str] = None,
        max_bytes_in_flight: int = 1 << 30,
        skip_errors: bool = False,
        decode: Optional[Dict[str, Any]] = None,
        decode_threads: Optional[int] = None,
        decode_memory_bytes: Optional[int] = None,
        transform: Optional[Callable[[Dict[str, Any]], Any]] = None,
        transform_threads: int = 2,
        collate_fn: Optional[Callable[[List[Any]], Any]] = None,
        shuffle_window: Optional[int] = None,
        **options: Any,
    ) -> None:
        output = _output(output)
        if device not in (None, "cpu"):
            raise CudaUnavailableError(
                f"device={device!r}: this build of stoker has no CUDA support; use device=None and move batches with .to()"
            )
        if transform is not None and not callable(transform):
            raise InvalidInputError(f"transform must be callable, not {transform!r}")
        transform_threads = _count("transform_threads", transform_threads, 1, 1024)
        _whole_args(batch_size=batch_size, seed=seed, prefetch=prefetch, rank=rank, world_size=world_size,
                    max_bytes_in_flight=max_bytes_in_flight, decode_threads=decode_threads,
                    decode_memory_bytes=decode_memory_bytes, shuffle_window=shuffle_window)
        if collate_fn is not None and transform is None:
            # Batches are collated in Rust without a transform: the function would never run.
            raise InvalidInputError(
                "collate_fn= collates what transform= returns, and no transform is given (batches are then built in "
                "Rust, fields as tensors): pass transform= too, or convert the batches in the loop"
            )
        if skip_errors and not isinstance(uri_or_dataset, _Dataset):
            # Damage found while opening is skipped around too (and reported in stats()); a
            # dataset given was opened with its own options.
            options = {"on_damage": "skip", **options}
        if not isinstance(uri_or_dataset, _Dataset) and "cache_block" not in options:
            # A source opened for this order: reads that walk shards front to back take
            # bigger cache blocks (stoker::SourceOptions::for_order).
            block = _stoker.cache_block_for(shuffle, shuffle_window)
            if block is not None:
                options = {**options, "cache_block": block}
        ds = _as_dataset(uri_or_dataset, output, options)
        self.dataset = ds
        self.output = output
        self.epoch = 0
        self.prefetch = prefetch
        self.transform = transform
        self.transform_threads = transform_threads
        self.collate_fn = collate_fn
        self._loader = _stoker.Loader(
            ds._source,
            batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            prefetch=prefetch,
            rank=rank,
            world_size=world_size,
            max_bytes_in_flight=max_bytes_in_flight,
            skip_errors=skip_errors,
            decode=_decode_json(decode),
            threads=decode_threads,
            shuffle_window=shuffle_window,
            decode_memory_bytes=decode_memory_bytes,
        )
        self._started = False
        # With a transform: the position after the last batch yielded (see `_transformed`).
        self._delivered: Optional[str] = None
        # The epoch set_epoch() asked for since the last iteration began, if any.
        self._asked: Optional[int] = None

    def __len__(self) -> int:
        return len(self._loader)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads (as DistributedSampler.set_epoch)."""
        epoch = _count("set_epoch's epoch", epoch, 0, 2**64 - 1)
        self.epoch = epoch
        self._asked = epoch
        self._started = False

    def __iter__(self) -> Iterator[Any]:
        self.epoch = _iteration_epoch(self.epoch, self._started, self._loader.resume_epoch(), self._asked)
        self._asked = None
        self._delivered = None
        self._started = True
        if self.transform is None:
            for batch in self._loader.epoch(self.epoch):
                yield self._convert(batch)
        else:
            yield from self._transformed(self._loader.epoch(self.epoch))

    def _transformed(self, batches: Iterator[Any]) -> Iterator[Any]:
        # Batches are handed to the pool as they arrive and collected in order, keeping up to
        # `prefetch` batches in the pool's hands while the consumer works.
        # The Rust loader's position runs ahead of the consumer by the batches in the pool, so
        # each batch carries the position just after it, and `state_dict()` gives the position
        # after the last batch yielded: a resume repeats and skips nothing.
        fn = self.transform
        assert fn is not None
        collate = self.collate_fn or self._default_collate()
        pending: Deque[Tuple[List["Future[Any]"], Optional[str]]] = collections.deque()

        def deliver() -> Any:
            futures, state = pending.popleft()
            out = collate([f.result() for f in futures])
            self._delivered = state
            return out

        # Kept after the loop ends, also when it is left early (a `break`, an error): the Rust
        # loader has then read past the batches the pool still held, never yielded, and
        # state_dict() must give the position after the last batch yielded. The next
        # iteration or load_state_dict() drops it.
        self._delivered = self._loader.state()
        with ThreadPoolExecutor(self.transform_threads, thread_name_prefix="stoker-transform") as pool:
            for batch in batches:
                pending.append(([pool.submit(fn, s) for s in self._rows(batch)], self._loader.state()))
                if len(pending) > self.prefetch:
                    yield deliver()
            while pending:
                yield deliver()

    def _rows(self, batch: Any) -> Iterator[Dict[str, Any]]:
        """A batch's samples as webdataset-style dicts: raw fields as bytes, decoded fields as
        their row of the batch's tensor."""
        converted = self._convert(batch)
        raw = [n for n, c in converted.items() if isinstance(c, tuple)]
        dense = [n for n, c in converted.items() if n not in ("__key__", "__index__") and not isinstance(c, tuple)]
        for i, key in enumerate(converted["__key__"]):
            row: Dict[str, Any] = {"__key__": key, "__index__": converted["__index__"][i]}
            for name in raw:
                row[name] = batch.value(name, i)
            for name in dense:
                row[name] = converted[name][i]
            yield row

    def _default_collate(self) -> Callable[[List[Any]], Any]:
        if self.output == "torch":
            from torch.utils.data import default_collate

            return default_collate
        return list

    def _convert(self, batch: Any) -> Dict[str, Any]:
        # torch takes DLPack capsules directly (no per-column protocol negotiation in Python);
        # numpy takes only objects with __dlpack__.
        if self.output == "torch":
            import torch

            convert, capsules = torch.from_dlpack, True
        else:
            import numpy

            convert, capsules = numpy.from_dlpack, False
        out: Dict[str, Any] = {"__key__": batch.keys(), "__index__": batch.indices()}
        for name in batch.fields():
            if name == "__source__":  # a mix's source names: text, like the keys
                out[name] = batch.texts(name)
                continue
            data, offsets, dtype = batch.column(name, capsules)
            out[name] = convert(data) if dtype else (convert(data), convert(offsets))
        return out

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader stands (as torchdata's StatefulDataLoader: a plain dict)."""
        state = self._loader.state() if self._delivered is None else self._delivered
        loader = json.loads(state) if state else None
        # The epoch the state resumes in: after an epoch's last batch, the next one.
        epoch = loader["sampler"]["epoch"] if loader else self.epoch
        return {"epoch": epoch, "loader": loader}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state_dict()``: the next iteration delivers exactly the samples not
        yet delivered in that epoch."""
        if not isinstance(state, Mapping) or "epoch" not in state or "loader" not in state:
            # A TokenLoader's state, or an empty dict, would otherwise restart the epoch.
            keys = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
            raise InvalidInputError(
                f"load_state_dict() takes what a Loader's state_dict() gave (a dict of 'epoch' and 'loader'), not {keys}"
            )
        epoch = _count("the state's epoch", state["epoch"], 0, 2**64 - 1)
        loader = state["loader"]
        if loader is not None and not isinstance(loader, Mapping):
            raise InvalidInputError(f"the state's 'loader' must be a dict or None, not {type(loader).__name__}")
        # state_dict() copies the sampler's epoch out: two that differ are a damaged state, and
        # either reading would resume an epoch the run was not in.
        sampler = loader.get("sampler") if loader is not None else None
        inner = sampler.get("epoch") if isinstance(sampler, Mapping) else None
        if inner is not None and (isinstance(inner, bool) or inner != epoch):
            raise InvalidInputError(
                f"the state's epoch ({epoch}) is not its sampler's ({inner!r}): it is not a state this loader wrote"
            )
        # Checked before anything changes: a refused state leaves the loader as it was.
        text = None if loader is None else _state_json(loader)
        if text is not None:
            self._loader.load_state(text)
        self.epoch = epoch
        self._started = False
        self._delivered = None
        self._asked = None

    def stats(self) -> Dict[str, Any]:
        """Consumer wait (GPU starvation), throughput, fetch latency, retries, cache hits."""
        return self._loader.stats()


def diagnose(
    uri: Union[str, "os.PathLike[str]"],
    batch_size: int = 64,
    *,
    step: Optional[Callable[[], Any]] = None,
    prefetch: int = 4,
    shuffle: Union[bool, str] = False,
    seed: int = 0,
    samples: int = 2048,
    seconds: float = 10.0,
    decode: Optional[Dict[str, Any]] = None,
    shuffle_window: Optional[int] = None,
    **options: Any,
) -> Dict[str, Any]:
    """Find where the input pipeline starves the consumer, as ``stoker diagnose`` does.

    Measures (1) the consumer on one cached batch, (2) plus the copy, (3) plus collation from
    cached samples, (4) plus reading from storage with the cache off, (5) the full pipeline,
    and names the step that costs most and the knob that helps. ``step`` is called once per
    batch as the consumer: your training step on a fixed input (e.g. a forward and backward
    pass followed by ``torch.cuda.synchronize()``). Returns the report as a dict (``steps``,
    ``verdict`` with ``step``, ``knob`` and ``advice``) with its printable form in ``"text"``.
    ``decode`` takes the Loader's spec, so decoding is measured as the Loader would run it;
    ``shuffle`` and ``shuffle_window`` its order (``True``, ``False`` or ``"shards"``).
    """
    text, report = _stoker.diagnose(
        os.fspath(uri),
        _options_json(options),
        batch_size,
        prefetch=prefetch,
        shuffle=shuffle,
        seed=seed,
        samples=samples,
        seconds=seconds,
        step=step,
        decode=_decode_json(decode),
        shuffle_window=shuffle_window,
    )
    out: Dict[str, Any] = json.loads(report)
    out["text"] = text
    return out


from .tokens import TokenLoader  # noqa: E402  (it uses Dataset, defined above)
