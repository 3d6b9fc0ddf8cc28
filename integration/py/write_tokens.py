"""Write Megatron indexed datasets (.bin + .idx) with Megatron-LM's own writer
(megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder), and print what they hold, read
back by Megatron's own reader (IndexedDataset).

    python write_tokens.py megatron OUTDIR     # two uint16 datasets, documents of 0 to 700 tokens
    python write_tokens.py megatron-i32 OUTDIR # one int32 dataset (ids past 65535)
    python write_tokens.py flat OUTDIR         # nanoGPT's layout: train.bin (uint16, raw) and big.npy
                                               # (uint32, numpy.save), every document ended by 50256
    python write_tokens.py litdata OUTDIR      # LitData token chunks: litdata.optimize with
                                               # TokensLoader, int32 tensors as LitGPT writes them
    python write_tokens.py mds OUTDIR          # MDS shards (MDSWriter, zstd) of a `tokens` ndarray
                                               # column (uint16) and a `source` str column

Prints the expected samples as JSON: [{"key": ..., "fields": [["tokens", hex]]}, ...] in
Stoker's order (files by path, then sequences in order); keys are `NAME/NNNNNNNNN` (the file
name without .idx, the sequence number), tokens as stored (little-endian, the dataset's dtype).
"""
import json
import os
import sys
import warnings

import numpy as np

warnings.filterwarnings("ignore")  # Megatron warns that Transformer Engine and Apex are absent
import torch  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder  # noqa: E402


def lengths(n, seed):
    rng = np.random.default_rng(seed)
    out = rng.integers(1, 700, size=n)
    out[3] = 0  # an empty document
    return out


def write(prefix, dtype, n, seed, vocab):
    rng = np.random.default_rng(seed + 1)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for size in lengths(n, seed):
        b.add_item(torch.from_numpy(rng.integers(0, vocab, size=int(size)).astype(np.int64)))
        b.end_document()
    b.finalize(prefix + ".idx")


def main():
    kind, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if kind == "flat":
        return flat(out)
    if kind == "litdata":
        return litdata(out)
    if kind == "mds":
        return mds(out)
    if kind == "megatron":
        files = [("part-00", np.uint16, 60, 1, 50257), ("part-01", np.uint16, 45, 2, 50257)]
    elif kind == "megatron-i32":
        files = [("big-vocab", np.int32, 50, 3, 200_000)]
    else:
        sys.exit(f"unknown kind {kind}")
    samples = []
    for name, dtype, n, seed, vocab in files:
        prefix = os.path.join(out, name)
        write(prefix, dtype, n, seed, vocab)
        ds = IndexedDataset(prefix)
        for i in range(len(ds)):
            tokens = np.asarray(ds[i]).astype(np.dtype(dtype).newbyteorder("<"))
            samples.append({"key": f"{name}/{i:09d}", "fields": [["tokens", tokens.tobytes().hex()]]})
    json.dump(samples, sys.stdout)


def flat(out):
    """As nanoGPT's prepare.py: every document's ids, then the end-of-text token, back to back."""
    samples = []
    for name, dtype, n, seed, vocab in [("big", np.uint32, 30, 4, 100_000), ("train", np.uint16, 40, 5, 50256)]:
        rng = np.random.default_rng(seed)
        docs = []
        for size in lengths(n, seed):
            ids = rng.integers(0, vocab, size=int(size))
            ids = ids[ids != 50256]
            docs.append(np.append(ids, 50256).astype(dtype))
        arr = np.concatenate(docs)
        if name == "train":
            arr.tofile(os.path.join(out, "train.bin"))
        else:
            np.save(os.path.join(out, "big.npy"), arr)
        for i, d in enumerate(docs):
            samples.append({"key": f"{name}/{i:09d}", "fields": [["tokens", d.astype(np.dtype(dtype).newbyteorder("<")).tobytes().hex()]]})
    json.dump(samples, sys.stdout)


def litgpt_document(i):
    """A document as LitGPT's data preparation yields it: an int32 tensor of ids, EOS last."""
    rng = np.random.default_rng(100 + i)
    ids = rng.integers(0, 50256, size=int(rng.integers(1, 700)))
    return torch.from_numpy(np.append(ids, 50256).astype(np.int32))


def litdata(out):
    """Write with litdata.optimize(item_loader=TokensLoader()), and check the expected documents
    against LitData's own reader: its blocks are each chunk's documents joined, cut every
    block_size tokens (the chunk's remainder dropped)."""
    from litdata import StreamingDataset, optimize
    from litdata.streaming.item_loader import TokensLoader

    n = 80
    # LitData talks on standard output (its workers too): sent to stderr, for the JSON's sake.
    sys.stdout.flush()
    real = os.dup(1)
    os.dup2(2, 1)
    try:
        optimize(fn=litgpt_document, inputs=list(range(n)), output_dir=out, chunk_bytes="24kb",
                 item_loader=TokensLoader(), num_workers=1)
    finally:
        sys.stdout.flush()
        os.dup2(real, 1)
        os.close(real)
    docs = [litgpt_document(i).numpy() for i in range(n)]
    with open(os.path.join(out, "index.json")) as f:
        chunks = json.load(f)["chunks"]
    assert len(chunks) > 2, "several chunks"
    samples, blocks, at = [], [], 0
    block = 128
    for c in chunks:
        name = c["filename"].removesuffix(".bin")
        mine = docs[at:at + c["chunk_size"]]
        at += c["chunk_size"]
        for i, d in enumerate(mine):
            samples.append({"key": f"{name}/{i:09d}", "fields": [["tokens", d.astype("<i4").tobytes().hex()]]})
        stream = np.concatenate(mine)
        blocks += [stream[k:k + block] for k in range(0, len(stream) - block + 1, block)]
    assert at == n, "every document in a chunk"
    theirs = StreamingDataset(out, item_loader=TokensLoader(block_size=block), shuffle=False)
    assert len(theirs) == len(blocks), (len(theirs), len(blocks))
    for k in range(len(theirs)):
        assert np.array_equal(np.asarray(theirs[k]), blocks[k]), k
    json.dump(samples, sys.stdout)


def mds(out):
    """MosaicML Streaming's MDSWriter, zstd-compressed shards: one document a sample, its ids in
    an ndarray column. Expected: the documents as .npy (Stoker's form of an ndarray column),
    checked against Streaming's own reader."""
    from streaming import MDSWriter, StreamingDataset

    rng = np.random.default_rng(7)
    docs = [rng.integers(0, 50256, size=int(rng.integers(1, 500))).astype(np.uint16) for _ in range(70)]
    with MDSWriter(out=out, columns={"tokens": "ndarray:uint16", "source": "str"}, compression="zstd",
                   size_limit=1 << 14) as w:
        for i, d in enumerate(docs):
            w.write({"tokens": d, "source": f"doc-{i}"})
    theirs = StreamingDataset(local=out, shuffle=False, batch_size=1)
    assert [np.array_equal(theirs[i]["tokens"], d) for i, d in enumerate(docs)] == [True] * len(docs)
    # Streaming's reader left the shards it decompressed beside the writer's: only what the
    # writer wrote stays.
    for name in os.listdir(out):
        if name.endswith(".mds") and os.path.exists(os.path.join(out, name + ".zstd")):
            os.remove(os.path.join(out, name))
    # The documents' raw ids (keys are the source column's; the reader's samples hold .npy).
    json.dump([{"key": f"doc-{i}", "fields": [["tokens", d.astype("<u2").tobytes().hex()]]}
               for i, d in enumerate(docs)], sys.stdout)


if __name__ == "__main__":
    main()
