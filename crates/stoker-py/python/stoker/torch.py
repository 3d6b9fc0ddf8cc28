"""For code that keeps a PyTorch DataLoader with workers: an IterableDataset that splits the
samples by DataLoader worker and by rank, so no sample repeats."""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Union

import torch.utils.data

from . import Dataset, _OpenArgs, _ShownArgs, _stoker, _to_python


class IterableDataset(_ShownArgs, torch.utils.data.IterableDataset):
    """Samples of ``uri`` in Stoker's order (shuffled per epoch with ``shuffle=True``, or by
    shard windows with ``shuffle="shards"`` as ``stoker.Loader`` does), each DataLoader worker
    reading its share through a Rust loader with prefetching. Call ``set_epoch(e)`` before
    each epoch when shuffling.

    ``uri`` and ``options`` are shown with credentials masked (``***``), as for
    ``stoker.Dataset``; the pickle each DataLoader worker gets carries them, since the worker
    opens the source. Keep pickles private."""

    def __init__(
        self,
        uri: str,
        shuffle: Union[bool, str] = False,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        prefetch: int = 4,
        read_batch: int = 64,
        shuffle_window: Optional[int] = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self._args = _OpenArgs(os.fspath(uri), options)
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.shuffle_window = shuffle_window
        self.prefetch, self.read_batch, self.epoch = prefetch, read_batch, 0

    def set_epoch(self, epoch: int) -> None:
        from . import _count

        self.epoch = _count("set_epoch's epoch", epoch, 0, 2**64 - 1)

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        source = _stoker.Source(self._args.uri, self._args.json())
        loader = _stoker.Loader(
            source,
            self.read_batch,
            shuffle=self.shuffle,
            seed=self.seed,
            prefetch=self.prefetch,
            rank=self.rank,
            world_size=self.world_size,
            worker=worker,
            num_workers=workers,
            shuffle_window=self.shuffle_window,
        )
        for batch in loader.epoch(self.epoch):
            names = batch.fields()
            for row, key in enumerate(batch.keys()):
                yield _to_python(key, [(n, batch.value(n, row)) for n in names])


__all__ = ["IterableDataset", "Dataset"]
