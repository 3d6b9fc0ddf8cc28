"""Language-model input, side by side: token sources read as training sequences, and text
tokenized and packed, each row in its own process, same data, same cores, rounds alternating.

    .venv-peers/bin/python integration/bench_tokens.py [--tokens 50e6] [--text-mb 40] [--rounds 3]
        [--parts sources,tokenize,decode] [--batch 8] [--epochs 1] [--json out.json]

Token sources (seq_len 2048, shifted labels: rows of 2049 tokens, batches of --batch rows (8),
shuffled; --epochs per process: the first epoch's rate, then the median of the later ones; the
stoker row's first epoch counts opening the loader):
  raw        the .bin read whole, in one read, into a buffer already in memory (as a loader's
             reused buffers are; a fresh array's first touch is the machine's page-fault cost,
             which on a VM can be most of it): the bound
  stoker     stoker.TokenLoader over the Megatron .bin/.idx (input_ids, position_ids, loss_mask,
             cu_seqlens)
  stoker-ids the same with columns=("input_ids",), what the two peers deliver
  stoker-u16 stoker-ids with ids_dtype="uint16": the file's own width, copied as it is (the
             peers' uint16 tokens widened to int64 on the CPU; these are widened on the GPU)
  memmap     nanoGPT's way: a map-style Dataset slicing numpy.memmap windows, in a torch
             DataLoader (2 workers)
  litdata    LitData StreamingDataset + TokensLoader(block_size=2049) over chunks written by
             litdata.optimize from the same documents, in its StreamingDataLoader (2 workers)

Tokenize and pack (real text: the .py files of the installed packages, one document each):
  bound           the tokenizers crate on one thread (`stoker pack` with TOKENIZERS_PARALLELISM=false,
                  which the crate's encode_batch obeys), times the cores: the issue's bound
  wheel-1thread   the tokenizers Python wheel on one thread, times the cores (the same core)
  stoker-jsonl    `stoker pack --layout tokens --tokenize` from JSONL (release CLI)
  stoker-parquet  the same from Parquet
  datasets        `datasets` map(tokenize, batched, num_proc=cores) + group_texts into 2048-token
                  blocks, from the same JSONL, + save_to_disk
Tokenize per sample, one document per row (fine-tuning input: rows of 512 ids, truncated or
padded, and their lengths; batches of 32, shuffled, from the same JSONL):
  stoker-decode    stoker.Loader with decode={"text": stoker.Tokens(tokenizer.json, 512)}
  dataloader-wheel a map-style Dataset over the JSONL lines, each __getitem__ tokenizing with the
                   tokenizers wheel (one thread), truncating and padding, in a torch DataLoader
                   (2 workers): what a fine-tuning script does
Rates are tokens/s (and documents/s for the packers and per-sample rows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers_common as pc  # noqa: E402

SEQ = 2048
# Per-sample tokenizing: one document a row.
ROW_LEN, ROW_BATCH = 512, 32


# --- data -------------------------------------------------------------------------------------


def write_tokens(out: Path, n_tokens: int) -> Dict[str, Any]:
    """Documents of random uint16 tokens (lengths 1 to ~4000, mean ~800) as one Megatron
    dataset (its .bin is the tokens back to back, what nanoGPT's memmap reads) and as LitData
    TokensLoader chunks."""
    import numpy as np

    rng = np.random.default_rng(0)
    lens: List[int] = []
    while sum(lens) < n_tokens:
        lens += [int(x) + 1 for x in rng.lognormal(6.2, 0.9, size=10_000)]
    total = 0
    for i, n in enumerate(lens):
        if total + n > n_tokens:
            lens = lens[:i]
            break
        total += n
    tokens = rng.integers(0, 50257, size=total, dtype=np.uint16)
    out.mkdir(parents=True, exist_ok=True)
    tokens.tofile(out / "corpus.bin")
    sizes = np.array(lens, dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1].astype(np.int64) * 2)])
    with open(out / "corpus.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], dtype="<u8").tobytes())
        f.write(bytes([8]))  # uint16
        f.write(np.array([len(lens), len(lens) + 1], dtype="<u8").tobytes())
        f.write(sizes.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(np.arange(len(lens) + 1, dtype="<i8").tobytes())
    return {"documents": len(lens), "tokens": total}


def _litdata_doc(arg):
    import numpy as np
    import torch

    path, start, n = arg
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16, count=n, offset=start * 2).astype(np.int32))


def write_litdata(src: Path, out: Path) -> None:
    import numpy as np
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    idx = open(src / "corpus.idx", "rb").read()
    n = int(np.frombuffer(idx[18:26], dtype="<u8")[0])
    sizes = np.frombuffer(idx[34:34 + 4 * n], dtype="<i4")
    starts = np.concatenate([[0], np.cumsum(sizes[:-1].astype(np.int64))])
    inputs = [(str(src / "corpus.bin"), int(s), int(z)) for s, z in zip(starts, sizes)]
    optimize(fn=_litdata_doc, inputs=inputs, output_dir=str(out), chunk_size=(SEQ + 1) * 1024,
             item_loader=TokensLoader(), num_workers=2, mode="overwrite")


def write_text(out: Path, mb: int) -> Dict[str, Any]:
    """The installed packages' .py files, one document each (capped at 200 KB), as JSONL and
    Parquet, and a byte-level BPE tokenizer (32k) trained on the first 10 MB."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    site = Path(pa.__file__).resolve().parent.parent
    docs, size = [], 0
    for p in sorted(site.rglob("*.py")):
        try:
            t = p.read_text(encoding="utf-8")[:200_000]
        except (UnicodeDecodeError, OSError):
            continue
        if len(t) < 200:
            continue
        docs.append(t)
        size += len(t.encode())
        if size >= mb << 20:
            break
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    pq.write_table(pa.table({"text": docs}), out / "corpus.parquet", row_group_size=1000)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    sample, acc = [], 0
    for d in docs:
        sample.append(d)
        acc += len(d)
        if acc > 10 << 20:
            break
    tok.train_from_iterator(sample, trainers.BpeTrainer(vocab_size=32000, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(out / "tokenizer.json"))
    return {"documents": len(docs), "bytes": size}


# --- rows (each in its own process) -----------------------------------------------------------


def _epochs(spec, one_epoch):
    """Run `one_epoch()` (returns the tokens it delivered) --epochs times in this process; the
    first epoch's rate is the row's, the median of the others its steady rate."""
    times, tokens = [], 0
    for _ in range(spec.get("epochs", 1)):
        t = time.perf_counter()
        tokens = one_epoch()
        times.append(time.perf_counter() - t)
    out = {"tokens": tokens, "seconds": times[0], "epoch_seconds": times}
    if len(times) > 1:
        out["later_tokens_per_s"] = tokens / sorted(times[1:])[(len(times) - 2) // 2]
    return out


def _rows_of(loader):
    """One epoch of a DataLoader of [B, SEQ + 1] tensors: the tokens it delivered."""
    return sum(b.shape[0] * SEQ for b in loader)


def row_raw(spec):
    import numpy as np

    path = Path(spec["tokens_dir"]) / "corpus.bin"
    a = np.ones(path.stat().st_size // 2, dtype=np.uint16)  # in memory before the clock starts

    def epoch():
        with open(path, "rb", buffering=0) as f:
            assert f.readinto(memoryview(a).cast("B")) == a.nbytes
        return int(a.size)

    out = _epochs(spec, epoch)
    out["check"] = int(a[:: 4096].sum())
    return out


def row_stoker(spec, columns=None, ids_dtype=None):
    import torch  # noqa: F401  (imported before the clock, as the DataLoader rows import it)

    import stoker

    t = time.perf_counter()  # the first epoch counts opening the index and the loader
    loader = stoker.TokenLoader(spec["tokens_dir"], seq_len=SEQ, global_batch=spec["batch"], labels=True,
                                shuffle=True, seed=1, columns=columns, ids_dtype=ids_dtype)
    opened = time.perf_counter() - t

    def epoch():
        n = 0
        for b in loader:
            n += b["input_ids"].shape[0] * SEQ
        return n

    out = _epochs(spec, epoch)
    out["seconds"] += opened
    out["epoch_seconds"][0] += opened
    return out


def row_stoker_ids(spec):
    return row_stoker(spec, columns=("input_ids",))


def row_stoker_u16(spec):
    return row_stoker(spec, columns=("input_ids",), ids_dtype="uint16")


class _Memmap:
    def __init__(self, path):
        import numpy as np

        self.path, self.data = path, None
        self.n = (os.path.getsize(path) // 2 - 1) // SEQ

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import numpy as np
        import torch

        if self.data is None:  # opened in the worker, as nanoGPT reopens per batch
            self.data = np.memmap(self.path, dtype=np.uint16, mode="r")
        return torch.from_numpy(self.data[i * SEQ:i * SEQ + SEQ + 1].astype(np.int64))


def row_memmap(spec):
    from torch.utils.data import DataLoader

    ds = _Memmap(str(Path(spec["tokens_dir"]) / "corpus.bin"))
    loader = DataLoader(ds, batch_size=spec["batch"], shuffle=True, num_workers=2, drop_last=True,
                        persistent_workers=spec.get("epochs", 1) > 1)
    return _epochs(spec, lambda: _rows_of(loader))


def row_litdata(spec):
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import TokensLoader

    ds = StreamingDataset(spec["litdata_dir"], item_loader=TokensLoader(block_size=SEQ + 1), shuffle=True, seed=1)
    loader = StreamingDataLoader(ds, batch_size=spec["batch"], num_workers=2, drop_last=True,
                                 persistent_workers=spec.get("epochs", 1) > 1)
    return _epochs(spec, lambda: _rows_of(loader))


def _texts(spec):
    return [json.loads(line)["text"] for line in open(Path(spec["text_dir"]) / "corpus.jsonl")]


def row_wheel_1thread(spec):
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: the single-core rate
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(spec["text_dir"]) / "tokenizer.json"))
    texts = _texts(spec)
    t = time.perf_counter()
    n = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    secs = time.perf_counter() - t
    return {"tokens": n, "seconds": secs / (os.cpu_count() or 1), "documents": len(texts), "one_core_s": secs}


def row_bound(spec):
    r = _stoker_pack(spec, "corpus.jsonl", {"TOKENIZERS_PARALLELISM": "false"})
    r["one_core_s"] = r["seconds"]
    r["seconds"] /= os.cpu_count() or 1
    return r


def _stoker_pack(spec, name, env=None):
    out = Path(spec["work"]) / f"packed-{name}"
    shutil.rmtree(out, ignore_errors=True)
    src = Path(spec["text_dir"]) / name
    cli = str(pc.RELEASE / "stoker")
    t = time.perf_counter()
    res = subprocess.run([cli, "pack", str(src), str(out), "--layout", "tokens", "--tokenize",
                          str(Path(spec["text_dir"]) / "tokenizer.json"), "--append-eos", "<|endoftext|>", "--json",
                          "--quiet"], capture_output=True, text=True, env={**os.environ, **(env or {})})
    secs = time.perf_counter() - t
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    return {"tokens": r["tokens"] - r["documents"], "seconds": secs, "documents": r["documents"]}


def row_stoker_jsonl(spec):
    return _stoker_pack(spec, "corpus.jsonl")


def row_stoker_parquet(spec):
    return _stoker_pack(spec, "corpus.parquet")


def row_datasets(spec):
    import datasets
    from tokenizers import Tokenizer

    datasets.disable_progress_bars()
    cache = Path(spec["work"]) / "hf-cache"
    shutil.rmtree(cache, ignore_errors=True)
    tok_path = str(Path(spec["text_dir"]) / "tokenizer.json")
    t = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=str(Path(spec["text_dir"]) / "corpus.jsonl"), split="train",
                               cache_dir=str(cache))
    tok = Tokenizer.from_file(tok_path)

    def tokenize(b):
        return {"input_ids": [e.ids for e in tok.encode_batch(b["text"], add_special_tokens=False)]}

    ids = ds.map(tokenize, batched=True, num_proc=os.cpu_count(), remove_columns=["text"])

    def group_texts(b):  # the Hugging Face examples' packing
        cat = [t for ids_ in b["input_ids"] for t in ids_]
        n = len(cat) // SEQ * SEQ
        return {"input_ids": [cat[i:i + SEQ] for i in range(0, n, SEQ)]}

    packed = ids.map(group_texts, batched=True, num_proc=os.cpu_count())
    packed.save_to_disk(str(Path(spec["work"]) / "hf-packed"))
    secs = time.perf_counter() - t
    n = sum(len(x) for x in ids["input_ids"])
    return {"tokens": n, "seconds": secs, "documents": len(ds)}


def row_stoker_decode(spec):
    import stoker

    tok = str(Path(spec["text_dir"]) / "tokenizer.json")
    loader = stoker.Loader(str(Path(spec["text_dir"]) / "corpus.jsonl"), batch_size=ROW_BATCH, shuffle=True, seed=1,
                           decode={"text": stoker.Tokens(tok, ROW_LEN, eos="<|endoftext|>")})
    t, n, docs = time.perf_counter(), 0, 0
    for b in loader:
        n += int(b["text_len"].sum())
        docs += len(b["text_len"])
    return {"tokens": n, "seconds": time.perf_counter() - t, "documents": docs}


class _WheelRows:
    """What a fine-tuning script does: the lines in memory, each tokenized when asked for."""

    def __init__(self, spec):
        self.texts = _texts(spec)
        self.path = str(Path(spec["text_dir"]) / "tokenizer.json")
        self.tok = None

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        import torch
        from tokenizers import Tokenizer

        if self.tok is None:  # loaded in the worker
            self.tok = Tokenizer.from_file(self.path)
            self.eos = self.tok.token_to_id("<|endoftext|>")
        ids = self.tok.encode(self.texts[i], add_special_tokens=False).ids[:ROW_LEN - 1] + [self.eos]
        row = torch.zeros(ROW_LEN, dtype=torch.int32)
        row[:len(ids)] = torch.tensor(ids, dtype=torch.int32)
        return row, len(ids)


def row_dataloader_wheel(spec):
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the wheel's threads would fight the workers
    from torch.utils.data import DataLoader

    loader = DataLoader(_WheelRows(spec), batch_size=ROW_BATCH, shuffle=True, num_workers=2)
    t, n, docs = time.perf_counter(), 0, 0
    for rows, lens in loader:
        n += int(lens.sum())
        docs += len(lens)
    return {"tokens": n, "seconds": time.perf_counter() - t, "documents": docs}


ROWS = {"raw": row_raw, "stoker-decode": row_stoker_decode, "dataloader-wheel": row_dataloader_wheel, "stoker": row_stoker, "stoker-ids": row_stoker_ids, "stoker-u16": row_stoker_u16, "memmap": row_memmap, "litdata": row_litdata, "bound": row_bound,
        "wheel-1thread": row_wheel_1thread,
        "stoker-jsonl": row_stoker_jsonl, "stoker-parquet": row_stoker_parquet, "datasets": row_datasets}


def run_row(name: str, spec: Dict[str, Any]) -> Dict[str, Any]:
    res = subprocess.run([sys.executable, __file__, "--row", name, "--spec", json.dumps(spec)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--row")
    ap.add_argument("--spec")
    ap.add_argument("--tokens", type=float, default=50e6)
    ap.add_argument("--text-mb", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="rows per batch of the token-source rows")
    ap.add_argument("--epochs", type=int, default=1,
                    help="epochs per token-source row, in one process: the first, then the median of the rest")
    ap.add_argument("--parts", default="sources,tokenize")
    ap.add_argument("--work")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.row:
        print(json.dumps(ROWS[a.row](json.loads(a.spec))))
        return
    work = Path(a.work or tempfile.mkdtemp(prefix="stoker-bench-tokens-"))
    try:
        run(a, work)
    finally:
        if not a.work:  # data made for this run only (--work keeps it for the next)
            shutil.rmtree(work, ignore_errors=True)


def run(a: argparse.Namespace, work: Path) -> None:
    spec: Dict[str, Any] = {"work": str(work), "tokens_dir": str(work / "tokens"), "litdata_dir": str(work / "litdata"),
                            "text_dir": str(work / "text"), "batch": a.batch,
                            "epochs": a.epochs}
    report: Dict[str, Any] = {"machine": pc.machine(), "versions": pc.versions(), "rounds": []}
    parts = set(a.parts.split(","))
    groups = []
    if "sources" in parts:
        if not (work / "tokens" / "corpus.idx").exists():
            report["tokens_data"] = write_tokens(work / "tokens", int(a.tokens))
            write_litdata(work / "tokens", work / "litdata")
        groups.append(["raw", "stoker", "stoker-ids", "stoker-u16", "memmap", "litdata"])
    if "tokenize" in parts:
        if not (work / "text" / "tokenizer.json").exists():
            report["text_data"] = write_text(work / "text", a.text_mb)
        groups.append(["bound", "wheel-1thread", "stoker-jsonl", "stoker-parquet", "datasets"])
    if "decode" in parts:
        if not (work / "text" / "tokenizer.json").exists():
            report["text_data"] = write_text(work / "text", a.text_mb)
        groups.append(["stoker-decode", "dataloader-wheel"])
    for r in range(a.rounds):
        for g in groups:
            order = g if r % 2 == 0 else list(reversed(g))
            for name in order:
                res = run_row(name, spec)
                res.update(row=name, round=r)
                if "tokens" in res:
                    res["tokens_per_s"] = res["tokens"] / res["seconds"]
                print(json.dumps(res), flush=True)
                report["rounds"].append(res)
    report["machine"]["load_end"] = os.getloadavg()
    print(pc.machine_line(report["machine"]))
    for g in groups:
        for name in g:
            rates = [x["tokens_per_s"] for x in report["rounds"] if x["row"] == name and "tokens_per_s" in x]
            print(f"{name:15s} " + " / ".join(f"{v / 1e6:8.2f}" for v in rates) + " M tokens/s")
            later = [x["later_tokens_per_s"] for x in report["rounds"] if x["row"] == name and "later_tokens_per_s" in x]
            if later:
                print(f"{'  later epochs':15s} " + " / ".join(f"{v / 1e6:8.2f}" for v in later) + " M tokens/s")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
