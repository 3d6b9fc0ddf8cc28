"""Write TFRecord files with the `tfrecord` package's own writer and print what Stoker must read.

    python write_tfrecord.py example OUTDIR
    python write_tfrecord.py raw OUTDIR

`example`: tf.train.Example records in a-00000.tfrecord, a-00001.tfrecord and b.tfrecord.gz (the
writer's output, gzip-compressed whole, as TensorFlow's GZIP option writes it), each with
features image (one bytes value), label (one int64), box (four floats), score (one float), ids
(int64s, one to five of them) and tags (bytes, none to three): every case of the field convention.
`raw`: records of plain bytes (not protobuf) in c.tfrecords.
`indexed`: like `example`'s plain files, with the package's own index beside each (its
`create_index`): a-00000.tfindex (the name its `create_indices` gives) and a-00001.index (the
name its `MultiTFRecordDataset` examples use).
Prints [{"key": "a-00000/000000000", "fields": [[name, hex], ...]}, ...] in Stoker's order.
"""
import gzip
import io
import json
import os
import random
import shutil
import sys

import numpy as np
from tfrecord import TFRecordWriter
from tfrecord.tools.tfrecord2idx import create_index


def npy(values, dtype):
    buf = io.BytesIO()
    np.save(buf, np.array(values, dtype=dtype))
    return buf.getvalue()


def f32_text(v):
    # Shortest text that reads back to the same float32 (Rust's `f32` Display).
    return np.format_float_positional(np.float32(v), unique=True, trim="-").encode()


def example(rng, i):
    ids = [rng.randrange(-(2**40), 2**40) for _ in range(rng.randrange(1, 6))]
    tags = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 9))) for _ in range(rng.randrange(0, 4))]
    box = [rng.random() for _ in range(4)]
    datum = {
        "image": (bytes(rng.randrange(256) for _ in range(rng.randrange(100, 3000))), "byte"),
        "label": (i % 10, "int"),
        "box": (box, "float"),
        "score": (0.25 * i, "float"),
        "ids": (ids, "int"),
    }
    if tags:
        datum["tags"] = (tags, "byte")
    fields = {"image": datum["image"][0], "label": str(i % 10).encode(), "box": npy(box, "<f4"),
              "score": f32_text(0.25 * i)}
    fields["ids"] = str(ids[0]).encode() if len(ids) == 1 else npy(ids, "<i8")
    if len(tags) == 1:
        fields["tags"] = tags[0]
    else:
        fields.update({f"tags.{k}": t for k, t in enumerate(tags)})
    return datum, sorted(fields.items())


def write(path, records):
    w = TFRecordWriter(path)
    for datum in records:
        w.write(datum)
    w.close()


def main():
    kind, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(7)
    samples = []
    if kind in ("example", "indexed"):
        n = 0
        files = [("a-00000", 40), ("a-00001", 25), ("b", 30)] if kind == "example" else [("a-00000", 40), ("a-00001", 25)]
        for name, count in files:
            made = [example(rng, n + k) for k in range(count)]
            n += count
            path = os.path.join(out, name + ".tfrecord")
            write(path, [d for d, _ in made])
            if name == "b":
                with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.remove(path)
            if kind == "indexed":
                create_index(path, os.path.join(out, name + (".tfindex" if name == "a-00000" else ".index")))
            samples += [{"key": f"{name}/{k:09d}", "fields": [[f, v.hex()] for f, v in fields]}
                        for k, (_, fields) in enumerate(made)]
    elif kind == "raw":
        payloads = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 500))) for _ in range(50)]
        payloads[0] = b"\xff\xfe plain bytes, not a protobuf message"
        with open(os.path.join(out, "c.tfrecords"), "wb") as f:
            for p in payloads:
                # The framing as the package writes it, for bytes it would not take as a dict.
                length = len(p).to_bytes(8, "little")
                f.write(length + TFRecordWriter.masked_crc(length) + p + TFRecordWriter.masked_crc(p))
        samples = [{"key": f"c/{k:09d}", "fields": [["data", p.hex()]]} for k, p in enumerate(payloads)]
    else:
        raise SystemExit(f"unknown kind {kind}")
    print(json.dumps(samples))


if __name__ == "__main__":
    main()
