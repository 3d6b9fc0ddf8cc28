#!/usr/bin/env python3
"""Decode benchmark (issue 11): ImageNet training input on this machine's cores, through
PyTorch's DataLoader with PIL and through Stoker's Loader.

Usage (from the repository root, with the venv that has stoker installed)::

    .venv/bin/python integration/bench_decode.py [--images 2048] [--batch 64] [--repeats 3]
        [--warmup 4] [--max-seconds 15] [--dir DIR] [--json FILE] [--quick]

Every row decodes the same JPEGs (integration/bench_decode_data.py: ImageNet-like crops of
scikit-image's sample photos, as files and as WebDataset shards) with the ImageNet training
transform: decode to RGB, RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3)),
RandomHorizontalFlip, uint8 HWC, no normalisation. The baselines use torchvision's transforms
v1 on PIL images. Rows:

1. DataLoader, one fork worker per core, a Dataset that opens one file per sample + PIL: 1.00x.
2. The same with PIL's ``draft``: the JPEG decoder downscales in the DCT domain (1/2, 1/4,
   1/8) as far as the crop, chosen first at full size, stays at least 224 px on both sides.
3. stoker.Loader over the shards, the PIL transform on ``transform_threads`` = cores Python threads.
4. stoker.Loader decoding and augmenting in Rust (``decode=``), default ``decode_threads``.
5. The same with ``decode_threads`` = cores, and the decode bound: ``decode_threads=1`` images/s
   times the cores, against which row 4 is reported as a fraction.
6. DataLoader as row 1, decoding with simplejpeg (libjpeg-turbo without PIL's overhead) and
   cropping/resizing with PIL.

A run is one epoch of a fresh loader; its first ``--warmup`` batches (worker start-up, first
reads) are not timed, nor is anything after ``--max-seconds`` (a guard for very slow builds:
the rate is then over the images consumed so far). The consumer touches a few bytes of every
image and checks every batch: images uint8 [B, 224, 224, 3], labels int64 [B] equal to the
labels written, every image exactly once per complete epoch. Rounds run every row once, in
turn, so background load reaches all rows alike; the table gives each row's best run (all runs
are in the JSON) and its ratio to row 1 of the same invocation. A failing row shows its error
and the others go on; the exit status is non-zero only when the baseline fails.

Needs, besides stoker and torch 2.15: torchvision==0.29.2 (its transforms v1, PIL backend),
pillow==13.0.0, scikit-image==0.26.0 (the sample photos), simplejpeg==1.9.0, numpy.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import simplejpeg
import stoker
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image, ImageOps, features
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_decode_data  # noqa: E402  (the helper module beside this script)

SIZE = 224
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
TRAIN = T.Compose([T.RandomResizedCrop(SIZE, scale=SCALE, ratio=RATIO), T.RandomHorizontalFlip()])

# (images, labels, image numbers) of one batch, whatever the pipeline.
Batch = Tuple[torch.Tensor, torch.Tensor, Sequence[int]]


# --- Per-sample transforms of the Python rows ----------------------------------------------


def hwc_uint8(img: Image.Image) -> torch.Tensor:
    """A PIL image as a uint8 [H, W, 3] tensor."""
    return torch.from_numpy(np.array(img, dtype=np.uint8))


def pil_train(path: Path) -> torch.Tensor:
    """Row 1: torchvision's ImageFolder loader (open, convert to RGB) and the train transform."""
    with open(path, "rb") as f:
        img = Image.open(f).convert("RGB")
    return hwc_uint8(TRAIN(img))


def resize_flip(img: Image.Image, box: Tuple[float, float, float, float]) -> torch.Tensor:
    """The crop ``box`` of ``img`` resized to SIZE x SIZE (PIL bilinear, antialiased, as
    RandomResizedCrop on PIL), flipped with probability 1/2 (as RandomHorizontalFlip)."""
    out = img.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=box)
    return hwc_uint8(ImageOps.mirror(out) if torch.rand(1) < 0.5 else out)


def pil_draft_train(path: Path) -> torch.Tensor:
    """Row 2: the crop is chosen at full size from the header, then the JPEG is decoded at the
    smallest DCT scale that keeps the crop at least SIZE px on both sides."""
    with open(path, "rb") as f:
        img = Image.open(f)
        top, left, h, w = T.RandomResizedCrop.get_params(img, SCALE, RATIO)
        width, height = img.size
        need = SIZE / min(h, w)  # the fraction of full size the crop can be reduced to
        drafted = img.draft("RGB", (math.ceil(width * need), math.ceil(height * need)))
        reduce = width / drafted[1][2] if drafted else 1.0
        rgb = img.convert("RGB")
    box = (left / reduce, top / reduce, (left + w) / reduce, (top + h) / reduce)
    return resize_flip(rgb, box)


def simplejpeg_train(path: Path) -> torch.Tensor:
    """Row 6: a full-size decode by simplejpeg, then the crop, resize and flip in PIL."""
    img = Image.fromarray(simplejpeg.decode_jpeg(path.read_bytes(), colorspace="RGB"))
    top, left, h, w = T.RandomResizedCrop.get_params(img, SCALE, RATIO)
    return resize_flip(img, (left, top, left + w, top + h))


def pil_train_sample(sample: Dict[str, Any]) -> Tuple[torch.Tensor, int, int]:
    """Row 3's ``transform``: row 1's PIL transform on a shard sample's JPEG bytes."""
    img = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
    return hwc_uint8(TRAIN(img)), int(sample["cls"]), int(sample["__key__"])


# --- Pipelines: each yields one epoch of Batch ----------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What every pipeline shares: the data, the batch size and the cores."""

    data: bench_decode_data.DecodeDataset
    batch: int
    cores: int


class FileDataset(torch.utils.data.Dataset):
    """One JPEG file per sample, as torchvision's ImageFolder: (image, label, image number)."""

    def __init__(self, files: List[Path], labels: Sequence[int], load: Callable[[Path], torch.Tensor]) -> None:
        self.files, self.labels, self.load = files, labels, load

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int, int]:
        return self.load(self.files[i]), self.labels[i], i


def dataloader(load: Callable[[Path], torch.Tensor]) -> Callable[[Setup], Iterable[Batch]]:
    """A DataLoader with one fork worker per core over FileDataset(load)."""

    def pipeline(s: Setup) -> Iterable[Batch]:
        dataset = FileDataset(s.data.files, s.data.labels, load)
        return DataLoader(
            dataset,
            batch_size=s.batch,
            shuffle=True,
            num_workers=s.cores,
            multiprocessing_context="fork",
            generator=torch.Generator().manual_seed(0),
        )

    return pipeline


def stoker_python_threads(s: Setup) -> Iterable[Batch]:
    """stoker.Loader reading the shards, the PIL transform on one Python thread per core."""
    return stoker.Loader(
        s.data.shard_uri,
        batch_size=s.batch,
        shuffle=True,
        seed=0,
        transform=pil_train_sample,
        transform_threads=s.cores,
    )


def stoker_native(threads: Optional[Callable[[Setup], int]]) -> Callable[[Setup], Iterable[Batch]]:
    """stoker.Loader decoding in Rust on ``threads(setup)`` threads (None: its default)."""

    def pipeline(s: Setup) -> Iterator[Batch]:
        loader = stoker.Loader(
            s.data.shard_uri,
            batch_size=s.batch,
            shuffle=True,
            seed=0,
            decode={"jpg": stoker.Image(SIZE, crop="random_resized", flip=True), "cls": stoker.Int()},
            decode_threads=None if threads is None else threads(s),
        )
        for batch in loader:
            yield batch["jpg"], batch["cls"], [int(key) for key in batch["__key__"]]

    return pipeline


@dataclass(frozen=True)
class Row:
    """A table row: its key in the JSON, its name in the table, and its pipeline."""

    key: str
    name: str
    pipeline: Callable[[Setup], Iterable[Batch]]


def rows(cores: int) -> List[Row]:
    """The benchmark's rows, the baseline first."""
    dl, native = "DataLoader, files +", "stoker.Loader, Rust decode,"
    return [
        Row("dataloader_pil", f"DataLoader ({cores} fork workers), files + PIL/torchvision", dataloader(pil_train)),
        Row("dataloader_pil_draft", f"{dl} PIL with draft (DCT-domain downscale)", dataloader(pil_draft_train)),
        Row("stoker_pil_threads", f"stoker.Loader, PIL transform on {cores} Python threads", stoker_python_threads),
        Row("stoker_native", f"{native} default decode_threads", stoker_native(None)),
        Row("stoker_native_cores", f"{native} decode_threads={cores}", stoker_native(lambda s: s.cores)),
        Row("stoker_native_1", f"{native} decode_threads=1", stoker_native(lambda s: 1)),
        Row("dataloader_simplejpeg", f"{dl} simplejpeg decode + PIL resize", dataloader(simplejpeg_train)),
    ]


# --- Measuring ------------------------------------------------------------------------------


class CheckFailed(Exception):
    """A batch that is not what the pipeline promised."""


@dataclass
class Run:
    """One epoch: images and seconds after the warm-up, whether it was cut short, and the CPU
    time of the whole run (warm-up included) per image delivered."""

    images: int
    seconds: float
    complete: bool
    cpu_per_image: float

    @property
    def rate(self) -> float:
        return self.images / self.seconds


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of its reaped children (DataLoader workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def check(batch: Batch, batch_size: int, labels: Sequence[int]) -> List[int]:
    """Validate one batch and touch its pixels as a training step would; returns its image
    numbers."""
    x, y, numbers = batch[0], batch[1], [int(n) for n in batch[2]]
    b = len(numbers)
    if not 0 < b <= batch_size:
        raise CheckFailed(f"a batch of {b} images (batch size {batch_size})")
    if x.dtype != torch.uint8 or tuple(x.shape) != (b, SIZE, SIZE, 3):
        raise CheckFailed(f"images are {x.dtype} {list(x.shape)}, not torch.uint8 [{b}, {SIZE}, {SIZE}, 3]")
    if y.dtype != torch.int64 or tuple(y.shape) != (b,):
        raise CheckFailed(f"labels are {y.dtype} {list(y.shape)}, not torch.int64 [{b}]")
    if y.tolist() != [labels[n] for n in numbers]:
        raise CheckFailed("labels differ from the labels written")
    probe = x[:, ::32, ::32]
    if int(probe.max()) == int(probe.min()):
        raise CheckFailed("a batch of constant pixels")
    return numbers


def measure(row: Row, s: Setup, warmup: int, max_seconds: float) -> Run:
    """One epoch of a fresh pipeline, timed after ``warmup`` batches."""
    seen: List[int] = []
    start: Optional[float] = None
    timed = 0
    complete = True
    cpu_start = cpu_seconds()
    # The loop holds the only reference to the pipeline's iterator: leaving it ends the
    # DataLoader's workers (reaped, so their CPU time is counted) or drops the stoker.Loader.
    for i, batch in enumerate(row.pipeline(s)):
        numbers = check(batch, s.batch, s.data.labels)
        seen.extend(numbers)
        if start is None:
            if i + 1 == warmup:
                start = time.perf_counter()
            continue
        timed += len(numbers)
        if time.perf_counter() - start > max_seconds:
            complete = False
            break
    end = time.perf_counter()
    cpu = cpu_seconds() - cpu_start
    if start is None or timed == 0:
        raise CheckFailed(f"the epoch has no batches after the {warmup} warm-up batches: use more --images")
    if complete and sorted(seen) != list(range(s.data.images)):
        raise CheckFailed("an epoch did not deliver every image exactly once")
    return Run(timed, end - start, complete, cpu / len(seen))


@dataclass
class Result:
    """A row's runs, or the error that stopped it."""

    row: Row
    runs: List[Run] = field(default_factory=list)
    error: Optional[str] = None

    @property
    def best(self) -> Optional[float]:
        """The best run's images/s; None when the row failed."""
        return max(r.rate for r in self.runs) if self.runs and self.error is None else None

    @property
    def cpu_per_image(self) -> Optional[float]:
        """The least CPU seconds per image of any run; None when the row failed."""
        return min(r.cpu_per_image for r in self.runs) if self.runs and self.error is None else None


def benchmark(s: Setup, repeats: int, warmup: int, max_seconds: float) -> List[Result]:
    """``repeats`` rounds of every row; a row that fails is not run again."""
    results = [Result(row) for row in rows(s.cores)]
    for round_ in range(repeats):
        for result in results:
            if result.error is not None:
                continue
            try:
                run = measure(result.row, s, warmup, max_seconds)
            except Exception as e:  # noqa: BLE001 - a failing row is reported, not fatal
                result.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                print(f"  round {round_ + 1}: {result.row.name}: FAILED {result.error}", flush=True)
                continue
            result.runs.append(run)
            cut = "" if run.complete else f" (stopped after {max_seconds:g} s)"
            print(f"  round {round_ + 1}: {result.row.name}: {run.rate:.0f} images/s{cut}", flush=True)
    return results


# --- Reporting ------------------------------------------------------------------------------


def machine() -> Dict[str, Any]:
    """Cores, CPU model and the versions that matter, for the report."""
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "pillow": Image.__version__,
        "libjpeg_turbo": features.version_feature("libjpeg_turbo"),
        "simplejpeg": simplejpeg.__version__,
        "stoker_extension": stoker_build(),
    }


def stoker_build() -> str:
    """Where the stoker extension was loaded from, and whether it looks like a debug build.

    Cargo's dev profile (``maturin develop`` without ``--release``) compiles overflow checks
    in, and their panic message with them; release builds do not. An unoptimised build decodes
    images tens of times slower, which would make the Rust rows meaningless.
    """
    path = Path(stoker._stoker.__file__)
    with open(path, "rb") as f:
        debug = b"attempt to add with overflow" in f.read()
    built = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
    kind = "DEBUG build (overflow checks on): rebuild with `maturin develop --release`" if debug else "release build"
    return f"{path} ({kind}, built {built})"


def ratio(rate: Optional[float], base: Optional[float]) -> str:
    """``rate`` as a multiple of ``base``, for the table."""
    return f"{rate / base:.2f}x" if rate is not None and base else "n/a"


def cpu_cell(result: Result) -> str:
    """The row's CPU milliseconds per image (its most frugal run)."""
    cpu = result.cpu_per_image
    return "n/a" if cpu is None else f"{cpu * 1000:.1f}"


def runs_cell(result: Result) -> str:
    """Every run's images/s, starred when --max-seconds cut it short."""
    return ", ".join(f"{run.rate:.0f}" + ("" if run.complete else "*") for run in result.runs)


def table(results: List[Result], cores: int) -> Tuple[str, Dict[str, Any]]:
    """The Markdown table and the decode-bound summary (row 4 against 1 thread x cores)."""
    by_key = {r.row.key: r for r in results}
    base = by_key["dataloader_pil"].best
    lines = [
        "| # | pipeline | images/s | vs DataLoader+PIL | CPU ms/image | runs (images/s) |",
        "|---|---|---:|---:|---:|---|",
    ]
    shown = [r for r in results if r.row.key != "stoker_native_1"]  # that one is the bound row
    for number, r in enumerate(shown, start=1):
        rate = "failed: " + r.error.replace("|", "\\|") if r.error else f"{r.best:.0f}"
        lines.append(f"| {number} | {r.row.name} | {rate} | {ratio(r.best, base)} | {cpu_cell(r)} | {runs_cell(r)} |")
    one = by_key["stoker_native_1"]
    bound = one.best * cores if one.best is not None else None
    per_thread = "failed: " + one.error.replace("|", "\\|") if one.error else f"{one.best:.0f} images/s on one thread"
    lines.append(
        f"| bound | stoker.Loader, Rust decode, decode_threads=1 x {cores} cores ({per_thread}) | "
        f"{'n/a' if bound is None else f'{bound:.0f}'} | {ratio(bound, base)} | {cpu_cell(one)} | {runs_cell(one)} |"
    )
    native = by_key["stoker_native"].best
    summary = {
        "one_thread_images_per_s": one.best,
        "bound_images_per_s": bound,
        "native_fraction_of_bound": native / bound if native is not None and bound else None,
        "native_vs_baseline": native / base if native is not None and base else None,
    }
    return "\n".join(lines), summary


def load_average() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_args() -> argparse.Namespace:
    """The command line; ``--quick`` overrides the sizes for a smoke run."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=2048, help="JPEGs in the data set (default 2048)")
    parser.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every row, best reported (default 3)")
    parser.add_argument("--warmup", type=int, default=4, help="untimed batches at the start of a run (default 4)")
    parser.add_argument("--max-seconds", type=float, default=15.0, help="cut a run after this long (default 15)")
    parser.add_argument("--dir", type=Path, help="data set directory, reused if it matches (default: temporary)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--quick", action="store_true", help="smoke run: 256 images, 1 round, 1 warm-up, 5 s a run")
    args = parser.parse_args()
    if args.quick:
        args.images, args.repeats, args.warmup, args.max_seconds = 256, 1, 1, 5.0
    return args


def json_report(
    args: argparse.Namespace,
    info: Dict[str, Any],
    data: bench_decode_data.DecodeDataset,
    results: List[Result],
    summary: Dict[str, Any],
) -> Dict[str, Any]:
    """Everything the table shows, with every run, for the --json file."""
    base = results[0].best
    return {
        "machine": info,
        "config": {
            "images": data.images,
            "mean_jpeg_bytes": data.mean_bytes,
            "shards": data.num_shards,
            "batch": args.batch,
            "repeats": args.repeats,
            "warmup_batches": args.warmup,
            "max_seconds": args.max_seconds,
            "statistic": "best run",
        },
        "rows": [
            {
                "key": r.row.key,
                "name": r.row.name,
                "images_per_s": r.best,
                "vs_baseline": r.best / base if r.best is not None and base else None,
                "cpu_seconds_per_image": r.cpu_per_image,
                "runs": [asdict(run) for run in r.runs],
                "error": r.error,
            }
            for r in results
        ],
        "decode_bound": summary,
    }


def main() -> int:
    args = parse_args()
    cores = os.cpu_count() or 1
    info = machine()
    info["load_average_start"] = load_average()
    print(f"machine: {cores} cores, {info['cpu']}, load average {info['load_average_start']}")
    print(f"stoker extension: {info['stoker_extension']}")
    print(
        f"transforms: torchvision {info['torchvision']} transforms v1 on PIL {info['pillow']} "
        f"(libjpeg-turbo {info['libjpeg_turbo']}); simplejpeg {info['simplejpeg']}"
    )

    with tempfile.TemporaryDirectory(prefix="stoker-bench-decode-") as tmp:
        root = args.dir or Path(tmp)
        t0 = time.perf_counter()
        data = bench_decode_data.build(root, args.images)
        how = "reused" if data.reused else f"written in {time.perf_counter() - t0:.1f} s"
        print(
            f"data: {data.images} JPEGs, mean {data.mean_bytes / 1024:.1f} KiB, {data.num_shards} shards, "
            f"{how}, in {root} (page cache: the rows read from memory)"
        )
        print(
            f"runs: batch {args.batch}, {args.repeats} round(s), {args.warmup} warm-up batch(es) per run, "
            f"at most {args.max_seconds:g} s timed per run",
            flush=True,
        )
        results = benchmark(Setup(data, args.batch, cores), args.repeats, args.warmup, args.max_seconds)

    info["load_average_end"] = load_average()
    text, summary = table(results, cores)
    print()
    print(text)
    print()
    print(f"images/s: best of {args.repeats} run(s) of {data.images} images less {args.warmup} warm-up batch(es);")
    print("ratios against row 1 of this invocation; * = run stopped by --max-seconds. CPU ms/image: CPU time of")
    print("the process and its DataLoader workers over a whole run, warm-up included, per image (least of the runs).")
    if summary["native_fraction_of_bound"] is not None:
        print(
            f"row 4 is {summary['native_vs_baseline']:.2f}x the DataLoader+PIL baseline (goal >= 2.5x) and "
            f"{summary['native_fraction_of_bound']:.2f} of the decode bound (goal >= 0.85)."
        )
    print(
        f"machine: {cores} cores, {info['cpu']}; "
        f"load average at start {info['load_average_start']}, at end {info['load_average_end']}"
    )
    if args.json:
        args.json.write_text(json.dumps(json_report(args, info, data, results, summary), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if results[0].error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
