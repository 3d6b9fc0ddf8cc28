"""Write a JSONL text corpus (plain, gzip and zstd files) of real text, train a byte-level BPE
tokenizer on it with Hugging Face `tokenizers`, and print what the files hold.

    python write_text.py jsonl OUTDIR
    python write_text.py formats OUTDIR

`formats` writes 200 of the documents in each of the other layouts Stoker reads text from, by
their own writers: txt/ (one .txt file a document), tar/ (WebDataset shards of .txt and .cls
members, Python's tarfile), mds/ (MDSWriter: a `text` str column and an `id` int), litdata/
(litdata.optimize of {"text", "id"} items), parquet/ (pyarrow: `text` and `id` columns);
tokenizer.json and tokens.json as for jsonl, in document order, which is every layout's order.

The text: docstrings of the Python standard library's modules, classes and functions (real
English prose, code samples and some non-ASCII), one document each. OUTDIR gets
corpus-a.jsonl, corpus-b.jsonl.gz, corpus-c.jsonl.zst (a blank line and extra fields included),
tokenizer.json, and tokens.json: every document's ids from the Python `Tokenizer.encode_batch`
(add_special_tokens=False), in Stoker's order. Prints the expected samples as JSON:
[{"key": "corpus-a/000000000", "fields": [["text", hex]]}, ...].
"""
import ast
import gzip
import json
import os
import sys
import sysconfig

import zstandard
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def docstrings(limit):
    stdlib = sysconfig.get_paths()["stdlib"]
    out = []
    for name in sorted(os.listdir(stdlib)):
        if not name.endswith(".py"):
            continue
        try:
            tree = ast.parse(open(os.path.join(stdlib, name), encoding="utf-8").read())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]:
            doc = ast.get_docstring(node)
            if doc and len(doc) > 20:
                out.append(doc)
            if len(out) >= limit:
                return out
    return out


def main():
    kind, out = sys.argv[1], sys.argv[2]
    assert kind in ("jsonl", "formats"), kind
    os.makedirs(out, exist_ok=True)
    docs = docstrings(1500)
    docs[5] = "Ünïcödé — ✓ 日本語のテキスト and emoji 🚀 " + docs[5]
    tok = tokenizer(docs)
    tok.save(os.path.join(out, "tokenizer.json"))
    if kind == "formats":
        return formats(out, docs[:200], tok)
    thirds = [docs[:500], docs[500:1000], docs[1000:]]
    names = ["corpus-a.jsonl", "corpus-b.jsonl.gz", "corpus-c.jsonl.zst"]
    expected = []
    for name, part in zip(names, thirds):
        lines = [json.dumps({"id": i, "text": d, "meta": {"text": "not this one"}}, ensure_ascii=(i % 2 == 0))
                 for i, d in enumerate(part)]
        lines.insert(7, "   ")  # a blank line is not a document
        body = ("\n".join(lines) + "\n").encode()
        path = os.path.join(out, name)
        if name.endswith(".gz"):
            body = gzip.compress(body)
        elif name.endswith(".zst"):
            body = zstandard.ZstdCompressor().compress(body)
        open(path, "wb").write(body)
        stem = name.split(".jsonl")[0]
        expected += [{"key": f"{stem}/{i:09d}", "fields": [["text", d.encode().hex()]]} for i, d in enumerate(part)]
    ids = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    json.dump(ids, open(os.path.join(out, "tokens.json"), "w"))
    json.dump(expected, sys.stdout)


def tokenizer(docs):
    """A byte-level BPE of 4,000 tokens trained on the documents."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    return tok


def formats(out, docs, tok):
    import io
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq
    from litdata import optimize
    from streaming import MDSWriter

    os.makedirs(os.path.join(out, "txt"))
    for i, d in enumerate(docs):
        with open(os.path.join(out, "txt", f"doc-{i:04d}.txt"), "w", encoding="utf-8") as f:
            f.write(d)
    os.makedirs(os.path.join(out, "tar"))
    for shard in range(2):
        with tarfile.open(os.path.join(out, "tar", f"shard-{shard}.tar"), "w") as t:
            for i in range(shard * 100, shard * 100 + 100):
                for ext, body in (("txt", docs[i].encode()), ("cls", str(i % 7).encode())):
                    info = tarfile.TarInfo(f"doc-{i:04d}.{ext}")
                    info.size = len(body)
                    t.addfile(info, io.BytesIO(body))
    with MDSWriter(out=os.path.join(out, "mds"), columns={"text": "str", "id": "int"}, compression="zstd",
                   size_limit=1 << 15) as w:
        for i, d in enumerate(docs):
            w.write({"text": d, "id": i})
    pq.write_table(pa.table({"text": docs, "id": list(range(len(docs)))}),
                   os.path.join(out, "parquet.parquet"), row_group_size=64)
    os.makedirs(os.path.join(out, "parquet"))
    os.rename(os.path.join(out, "parquet.parquet"), os.path.join(out, "parquet", "part-0.parquet"))
    sys.stdout.flush()
    real = os.dup(1)
    os.dup2(2, 1)  # LitData talks on standard output, its workers too
    try:
        optimize(fn=litdata_item, inputs=[(i, d) for i, d in enumerate(docs)],
                 output_dir=os.path.join(out, "litdata"), chunk_bytes="16kb", num_workers=1)
    finally:
        sys.stdout.flush()
        os.dup2(real, 1)
        os.close(real)
    ids = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    json.dump(ids, open(os.path.join(out, "tokens.json"), "w"))
    json.dump([], sys.stdout)


def litdata_item(pair):
    i, d = pair
    return {"text": d, "id": i}


if __name__ == "__main__":
    main()
