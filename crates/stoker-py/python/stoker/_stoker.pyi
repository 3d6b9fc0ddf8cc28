from typing import Any, Callable, Dict, List, Optional, Tuple, Union, final


__all__ = [
    "Batch",
    "CorruptDataError",
    "CudaUnavailableError",
    "DecodeError",
    "DlPack",
    "Epoch",
    "InvalidInputError",
    "Loader",
    "diagnose",
    "index",
    "is_secret_option",
    "NotFoundError",
    "pack",
    "RemoteError",
    "redact",
    "redact_text",
    "ShardWriter",
    "Source",
    "StokerError",
    "TokenEpoch",
    "TokenLoader",
]

class StokerError(Exception): ...
class NotFoundError(StokerError): ...
class InvalidInputError(StokerError): ...
class CorruptDataError(StokerError): ...
class DecodeError(CorruptDataError): ...
class RemoteError(StokerError): ...
class CudaUnavailableError(StokerError): ...

@final
class Source:
    def __new__(cls, uri: str, options: str = "{}") -> Source: ...
    def __len__(self) -> int: ...
    def get(self, i: int) -> Tuple[str, List[Tuple[str, bytes]]]: ...
    def get_many(self, indices: List[int]) -> List[Tuple[str, List[Tuple[str, bytes]]]]: ...
    def info(self) -> Dict[str, Any]: ...
    def damage_json(self) -> str: ...
    def shard_starts(self) -> List[int]: ...

@final
class DlPack:
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

@final
class Batch:
    def __len__(self) -> int: ...
    def keys(self) -> List[str]: ...
    def indices(self) -> List[int]: ...
    def fields(self) -> List[str]: ...
    def column(self, name: str) -> Tuple[DlPack, DlPack, Optional[str]]: ...
    def texts(self, name: str) -> List[str]: ...
    def value(self, name: str, i: int) -> bytes: ...

@final
class Epoch:
    def __iter__(self) -> "Epoch": ...
    def __next__(self) -> Batch: ...

@final
class Loader:
    def __new__(
        cls,
        source: Source,
        batch_size: int,
        shuffle: Union[bool, str, None] = None,
        seed: int = 0,
        drop_last: bool = False,
        prefetch: int = 4,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        worker: int = 0,
        num_workers: int = 1,
        wrap: bool = True,
        max_bytes_in_flight: int = ...,
        skip_errors: bool = False,
        decode: Optional[str] = None,
        threads: Optional[int] = None,
        shuffle_window: Optional[int] = None,
        decode_memory_bytes: Optional[int] = None,
        span: Optional[Tuple[int, int]] = None,
    ) -> Loader: ...
    def __len__(self) -> int: ...
    def epoch(self, epoch: int) -> Epoch: ...
    def resume_epoch(self) -> Optional[int]: ...
    def state(self) -> Optional[str]: ...
    def load_state(self, state: str) -> None: ...
    def stats(self) -> Dict[str, Any]: ...

@final
class TokenEpoch:
    def __iter__(self) -> "TokenEpoch": ...
    def __next__(self) -> Batch: ...

@final
class TokenLoader:
    def __new__(
        cls,
        source: Source,
        seq_len: int,
        global_batch: int,
        labels: bool = False,
        shuffle: Union[bool, str, None] = None,
        seed: int = 0,
        shuffle_window: Optional[int] = None,
        bos: Union[int, str, None] = None,
        eos: Union[int, str, None] = None,
        pad_id: int = 0,
        pad_tail: bool = False,
        per_document: bool = False,
        int64: bool = False,
        mask_boundaries: bool = False,
        prefetch: int = 4,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        tokenizer: Optional[str] = None,
        field: Optional[str] = None,
        skip_errors: bool = False,
    ) -> TokenLoader: ...
    def batches(self, epoch: int) -> int: ...
    def tokens(self, epoch: int) -> int: ...
    def set_weights(self, weights: List[float]) -> None: ...
    def epoch(self, epoch: int) -> TokenEpoch: ...
    def state(self) -> str: ...
    def load_state(self, state: str) -> None: ...
    def stats(self) -> Dict[str, Any]: ...


def diagnose(
    uri: str,
    options: str,
    batch_size: int,
    prefetch: int = 4,
    shuffle: Union[bool, str, None] = None,
    seed: int = 0,
    samples: int = 2048,
    seconds: float = 10.0,
    step: Optional[Callable[[], Any]] = None,
    decode: Optional[str] = None,
    shuffle_window: Optional[int] = None,
) -> Tuple[str, str]: ...


def redact(uri: str) -> str: ...
def redact_text(text: str) -> str: ...
def is_secret_option(key: str) -> bool: ...

@final
class ShardWriter:
    def __new__(cls, dest: str, options: str = "{}") -> ShardWriter: ...
    def begin(self, settings: str, force: bool = False) -> None: ...
    def finish(self, prefix: str, written: List[str]) -> Dict[str, Any]: ...
    def write(
        self, name: str, keys: List[str], columns: List[Tuple[str, List[Optional[bytes]]]]
    ) -> Dict[str, Any]: ...
    def write_tokens(self, stem: str, dtype: str, docs: List[bytes]) -> Dict[str, Any]: ...

def index(uri: str, options: str = "{}") -> Dict[str, Any]: ...
def pack(
    source: Source,
    dest: str,
    layout: str = "tar",
    shard_size: Optional[int] = None,
    samples_per_shard: Optional[int] = None,
    prefix: Optional[str] = None,
    group: bool = False,
    field: Optional[str] = None,
    force: bool = False,
    jobs: Optional[int] = None,
    dest_options: str = "{}",
) -> Dict[str, Any]: ...
