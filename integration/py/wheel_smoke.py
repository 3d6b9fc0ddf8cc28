"""What a user gets from `pip install stoker-*.whl` in a fresh venv: run with that venv's python.

    python wheel_smoke.py WORKDIR

Writes two tar shards with the standard library, then opens them, iterates the Loader (numpy
arrays: numpy is what the venv has, torch is not there), packs them into LMDB and indexes a
copy, and checks the error that names the extra when an output is asked for that is not
installed. Prints one line of JSON.
"""

import io
import json
import os
import sys
import tarfile
import time

out = sys.argv[1]
shards = os.path.join(out, "shards")
os.makedirs(shards, exist_ok=True)
for s in range(2):
    with tarfile.open(os.path.join(shards, f"train-{s}.tar"), "w") as tar:
        for i in range(s * 10, s * 10 + 10):
            for ext, data in (("bin", bytes([i]) * (i + 1)), ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

start = time.perf_counter()
import stoker  # noqa: E402

import_s = time.perf_counter() - start
found = {"python": "%d.%d" % sys.version_info[:2], "import_s": import_s, "module": os.path.dirname(stoker.__file__), "torch": "torch" in sys.modules}
ds = stoker.open(shards)
found["samples"] = len(ds)
found["bytes_ok"] = all(ds[i]["bin"] == bytes([i]) * (i + 1) for i in range(len(ds)))
seen = []
for batch in stoker.Loader(shards, batch_size=6, decode={"cls": stoker.Int()}, seed=1):
    seen += [int(c) for c in batch["cls"]]
    found["cls_type"] = type(batch["cls"]).__module__
found["loader_classes"] = sorted(seen) == sorted(i % 3 for i in range(20))
packed = stoker.pack(shards, os.path.join(out, "lmdb"), layout="lmdb", field="bin")
found["lmdb"] = [packed["samples"], len(stoker.open(os.path.join(out, "lmdb")))]
found["index_checksums"] = stoker.index(shards, checksums=True)["checksums"]
try:
    stoker.Loader(shards, batch_size=4, output="torch")
    found["torch_error"] = None
except stoker.InvalidInputError as e:
    found["torch_error"] = str(e)
print(json.dumps(found))
