"""Write Parquet the way users have it, with the real writers, and print what it holds.

    python write_parquet.py pyarrow OUTDIR   # pyarrow.parquet: 2 files, several row groups, zstd and snappy
    python write_parquet.py hf OUTDIR        # Hugging Face datasets: Image feature, to_parquet

Prints the expected samples as JSON: [{"key": ..., "fields": [[name, hex], ...]}, ...] in the
order a reader returns them, field values by Stoker's convention for typed columns: binary as
stored, strings as UTF-8, integers and booleans as decimal text, floats as their shortest
round-trip text, lists of numbers as .npy bytes (numpy.save), {bytes, path} structs as the
bytes in `<col>` and the path in `<col>.path`; a null leaves the field out.
"""
import io
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def payload(i, n):
    return bytes((i * 31 + j * 7) % 256 for j in range(n))


def float_text(x, dtype):
    # Rust's Display: shortest round-trip digits, never an exponent, no trailing ".0".
    return np.format_float_positional(dtype(x), unique=True, trim="-")


def npy(arr):
    b = io.BytesIO()
    np.save(b, np.ascontiguousarray(arr), allow_pickle=False)
    return b.getvalue()


def write_pyarrow(out):
    samples = []
    for f, (compression, n) in enumerate([("zstd", 23), ("snappy", 17)]):
        rows = []
        for r in range(n):
            i = f * 100 + r
            rows.append({
                "__key__": f"file{f}/sample{r:03d}",
                "jpg": payload(i, 1 + (i * 977) % 65536) if r % 7 != 3 else None,
                "txt": f"caption {i} ünï" if r % 5 != 4 else None,
                "cls": i * 3 - 50,
                "score": (i * 0.37 - 3.0) if r % 6 != 5 else None,
                "flag": r % 2 == 0,
                "emb": [i * 0.5, -1.25, 3.0, float(r)],
                "u8": r % 256,
            })
        schema = pa.schema([
            ("__key__", pa.string()), ("jpg", pa.binary()), ("txt", pa.string()), ("cls", pa.int64()),
            ("score", pa.float64()), ("flag", pa.bool_()), ("emb", pa.list_(pa.float32(), 4)), ("u8", pa.uint8()),
        ])
        table = pa.Table.from_pylist(rows, schema=schema)
        # Small row groups and pages, so the page index decides what a random read fetches.
        pq.write_table(table, Path(out) / f"part-{f:05d}.parquet", row_group_size=6, compression=compression,
                       data_page_size=4096, write_page_index=True)
        for row in rows:
            fields = []
            for name in ("jpg", "txt", "cls", "score", "flag", "emb", "u8"):
                v = row[name]
                if v is None:
                    continue
                if name == "jpg":
                    data = v
                elif name == "txt":
                    data = v.encode()
                elif name == "score":
                    data = float_text(v, np.float64).encode()
                elif name == "flag":
                    data = b"1" if v else b"0"
                elif name == "emb":
                    data = npy(np.array(v, dtype="<f4"))
                else:
                    data = str(v).encode()
                fields.append([name, data.hex()])
            samples.append({"key": row["__key__"], "fields": fields})
    return samples


def write_hf(out):
    from datasets import ClassLabel, Dataset, Features, Image, Value
    from PIL import Image as PILImage

    images, labels, texts = [], [], []
    for i in range(14):
        img = PILImage.new("RGB", (8 + i, 6 + i % 4), color=(i * 17 % 256, 40, 200 - i))
        images.append(img)
        labels.append(i % 3)
        texts.append(f"a picture number {i}")
    features = Features({"image": Image(), "label": ClassLabel(names=["a", "b", "c"]), "text": Value("string")})
    ds = Dataset.from_dict({"image": images, "label": labels, "text": texts}, features=features)
    path = Path(out) / "train-00000-of-00001.parquet"
    ds.to_parquet(str(path))
    # What HF stored: read it back with pyarrow (the encoded image bytes and their path).
    table = pq.read_table(path)
    samples = []
    for r, row in enumerate(table.to_pylist()):
        fields = []
        img = row["image"]
        if img["bytes"] is not None:
            fields.append(["image", img["bytes"].hex()])
        if img["path"] is not None:
            fields.append(["image.path", img["path"].encode().hex()])
        fields.append(["label", str(row["label"]).encode().hex()])
        fields.append(["text", row["text"].encode().hex()])
        samples.append({"key": f"train-00000-of-00001/{r:06d}", "fields": fields})
    return samples


def main():
    kind, out = sys.argv[1], sys.argv[2]
    Path(out).mkdir(parents=True, exist_ok=True)
    samples = {"pyarrow": write_pyarrow, "hf": write_hf}[kind](out)
    json.dump(samples, sys.stdout)


if __name__ == "__main__":
    main()
