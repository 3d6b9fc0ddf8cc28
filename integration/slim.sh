#!/usr/bin/env bash
# The CLI built without the library's heavy formats (`--no-default-features --features demo`,
# what the README's command 1 builds): it must run the demo's layouts, and refuse Parquet,
# HDF5 and tokenizers with an error naming the feature, not misread them. integration/test.sh
# runs this before it builds the tests, whose own build of target/debug/stoker (every
# feature) then takes that path's place again.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cargo build -p stoker-cli --no-default-features --features demo --locked
bin="$root/target/debug/stoker"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$bin" demo "$work/demo" > /dev/null
# The layouts it keeps read as in a full build: the demo's tar shards and JSONL text.
"$bin" ls "$work/demo/images" --limit 2 | grep -q 'jpg' || { echo "slim: the demo's tar shards did not list" >&2; exit 1; }
"$bin" inspect "$work/demo/text" | grep -q 'jsonl' || { echo "slim: the demo's JSONL did not open" >&2; exit 1; }
printf 'PAR1 not a footer PAR1' > "$work/a.parquet"
printf 'not hdf5' > "$work/b.h5"
refused() { # what, feature, command...
  local what="$1" feature="$2" out
  shift 2
  if out="$("$@" 2>&1)"; then
    echo "slim: $what was read by a build without the $feature feature: $out" >&2
    exit 1
  fi
  grep -q "\`$feature\` feature" <<< "$out" || { echo "slim: $what: the error does not name the feature: $out" >&2; exit 1; }
}
# A LitData chunk whose rows LitData stored as an Arrow table (its items empty, an Arrow IPC
# file and the LDARW01 trailer after them): refused when the dataset opens, not at each read
# (a Loader skipping bad samples would skip them all). The Arrow bytes are never read.
python3 - "$work/lit" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
os.makedirs(d)
arrow = b"ARROW1\0\0" + bytes(56)
chunk = struct.pack("<III", 1, 12, 12) + arrow + struct.pack("<I", len(arrow)) + b"LDARW01\0"
with open(os.path.join(d, "chunk-0-0.bin"), "wb") as f:
    f.write(chunk)
leaf = {"type": None, "context": None, "children_spec": []}
spec = [1, {"type": "builtins.dict", "context": json.dumps(["__key__", "cls"]), "children_spec": [leaf, leaf]}]
index = {
    "chunks": [{"chunk_bytes": len(chunk), "chunk_size": 1, "dim": None, "filename": "chunk-0-0.bin"}],
    "config": {"chunk_bytes": 16000, "chunk_size": None, "compression": None, "data_format": ["str", "int"],
               "data_spec": json.dumps(spec), "encryption": None, "item_loader": "PyTreeLoader"},
}
with open(os.path.join(d, "index.json"), "w") as f:
    json.dump(index, f)
PY
refused "a LitData Arrow-table chunk" parquet "$bin" inspect "$work/lit"
refused "a Parquet file" parquet "$bin" inspect "$work/a.parquet"
refused "an HDF5 file" hdf5 "$bin" ls "$work/b.h5"
refused "a tokenizer" tokenizers "$bin" tokens "$work/demo/text" --tokenizer "$work/demo/tokenizer.json" --seq-len 16 --global-batch 2
echo "slim: the CLI without parquet, hdf5 and tokenizers reads the demo and refuses the rest by name"
