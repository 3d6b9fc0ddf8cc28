#!/usr/bin/env bash
# The peers for the side-by-side benchmarks (integration/bench_remote.py, bench_mix.py), in their
# own venv inside the clone, .venv-peers/ (kept apart from .venv: the peers pull in packages the
# test suite must not see), idempotently:
#   mosaicml-streaming, litdata, webdataset (the readers compared), boto3 (uploads through the S3
#   API), torch (their DataLoader), and the stoker wheel built here with
#   `maturin build --release` from crates/stoker-py.
#
#   bash integration/peers_setup.sh
#   PEERS_TORCH_FROM=/path/to/site-packages bash integration/peers_setup.sh
#   bash integration/peers_setup.sh --packages-only
#
# The peers are also the writers of the formats Stoker reads without repacking (pyarrow and
# Hugging Face `datasets` for Parquet, MosaicML's MDSWriter, `litdata.optimize`): the test suite
# runs them from this venv (integration/setup.sh calls this with --packages-only, which skips the
# release builds only the benchmarks need).
#
# torch from PyPI is ~5 GB with its CUDA libraries. With PEERS_TORCH_FROM set to a site-packages
# that already holds torch (e.g. .venv/lib/python3.11/site-packages after integration/setup.sh),
# torch and the CUDA wheels it needs (triton, nvidia-*, cuda-*) are symlinked from there, with
# their .dist-info, so pip sees them installed; nothing else is shared.
set -euo pipefail
packages_only=false
[ "${1:-}" = "--packages-only" ] && packages_only=true
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
venv="$root/.venv-peers"
py="${PYTHON:-python3}"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }

if [ ! -x "$venv/bin/python" ]; then
  echo "peers_setup: creating .venv-peers with $($py --version)"
  "$py" -m venv "$venv"
fi
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# torch 2.15.0: the version the test suite runs against; mosaicml-streaming 0.13 takes
# torch>=1.10,<3 and litdata 0.2.76 torch>=2.4 (both read with 2.15.0 in these benchmarks).
torch_ver=2.15.0
if [ -n "${PEERS_TORCH_FROM:-}" ]; then
  "$venv/bin/python" - "$PEERS_TORCH_FROM" "$site" "$torch_ver" <<'PY'
import importlib.metadata as md, os, re, sys
src, dst, want = sys.argv[1:]
dists = {d.metadata["Name"].lower().replace("_", "-"): d for d in md.distributions(path=[src])}
torch = dists.get("torch")
if torch is None or torch.version.split("+")[0] != want:
    sys.exit(f"peers_setup: PEERS_TORCH_FROM={src} has no torch {want} (found {torch and torch.version})")
linked = []
for name, dist in dists.items():
    if not (name in ("torch", "triton") or re.match(r"(nvidia|cuda)-", name)):
        continue
    # Top-level entries of the dist (packages, modules, .dist-info, .libs), from its RECORD.
    tops = {str(f).split("/")[0] for f in (dist.files or []) if not str(f).startswith("..")}
    for top in sorted(tops):
        if top == "__pycache__" or top.endswith(".pth"):
            continue
        s, d = os.path.join(src, top), os.path.join(dst, top)
        if not os.path.lexists(d) and os.path.exists(s):
            os.symlink(s, d)
            linked.append(top)
print(f"peers_setup: linked {len(linked)} entries of torch {torch.version} and its CUDA wheels from {src}")
PY
fi

# Pinned so a fresh machine gets what was measured. numpy: mosaicml-streaming wants <2.2.
# huggingface-hub<1.0: mosaicml-streaming imports transformers (<5, its dependency), which fails
# with huggingface-hub >= 1.0. obstore: LitData's default S3 client.
# datasets 4.8 is the newest that takes huggingface-hub<1.0. tokenizers 0.22.2: the core version
# the Rust crate is pinned to (token-exact tests); zstandard writes the .jsonl.zst fixtures;
# tfrecord (with protobuf) writes the TFRecord fixtures and is the TFRecord benchmark's peer;
# albumentations (OpenCV 4: its 2.0.8 predates OpenCV 5) is the augmentation benchmark's peer;
# h5py writes the HDF5 fixtures and is the HDF5 benchmark's peer; Ray Data and Ray Train run
# stoker.ray's tests and examples/ray_train.py (crates/stoker-py/tests/test_ray.py).
need=(torch=="$torch_ver" torchvision==0.29.2 mosaicml-streaming==0.13.0 litdata==0.2.76 webdataset==1.0.2
      obstore==0.12.1 boto3==1.44.5 numpy==2.1.3 "huggingface-hub<1.0" maturin==1.16.0
      pyarrow==26.0.1 datasets==4.8.5 tokenizers==0.22.2 zstandard==0.25.0 tfrecord==1.14.6
      albumentations==2.0.8 opencv-python-headless==4.14.0.94 h5py==3.16.0 "ray[data,train]==2.60.0")
have() { "$venv/bin/python" - "$@" 2>/dev/null <<'PY'
import importlib.metadata as m, sys
from packaging.requirements import Requirement
for spec in sys.argv[1:]:
    r = Requirement(spec)
    try:
        v = m.version(r.name)
    except m.PackageNotFoundError:
        sys.exit(1)
    if not r.specifier.contains(v, prereleases=True) and not r.specifier.contains(v.split("+")[0]):
        sys.exit(1)
PY
}
if ! have "${need[@]}"; then
  echo "peers_setup: installing ${need[*]} into .venv-peers"
  pip install --quiet --no-cache-dir packaging
  pip install --quiet --no-cache-dir "${need[@]}"
fi
# torch pulls in Triton (1 GB), torch.compile's GPU compiler, which nothing here runs;
# integration/setup.sh removes it from .venv too (CI's disk is finite). A link to a Triton
# removed there goes with it.
find "$site" -maxdepth 1 -xtype l -name 'triton*' -delete
if pip show --quiet triton >/dev/null 2>&1; then
  echo "peers_setup: removing triton from .venv-peers (1 GB; torch.compile's GPU compiler, unused here)"
  pip uninstall --quiet --yes triton
fi

# Megatron-LM's own indexed-dataset writer and reader (the tests' second implementation of the
# .bin/.idx format). Without its dependencies: the datasets module needs only torch and numpy,
# and the rest (transformer engine, apex) is for training. 0.16 is the newest for Python 3.11.
nodeps=(megatron-core==0.16.1)
if ! have "${nodeps[@]}"; then
  echo "peers_setup: installing ${nodeps[*]} into .venv-peers (no dependencies)"
  pip install --quiet --no-cache-dir --no-deps "${nodeps[@]}"
fi

if $packages_only; then
  echo "peers_setup: packages ok in .venv-peers"
  exit 0
fi

# The stoker wheel, release build (the benchmarks measure it), reinstalled each run so it
# matches the working tree (cargo rebuilds only what changed).
wheels="$root/target/peers-wheels"
rm -rf "$wheels"
(cd crates/stoker-py && "$venv/bin/maturin" build --release --locked --quiet --out "$wheels" --interpreter "$venv/bin/python")
pip install --quiet --no-cache-dir --force-reinstall --no-deps "$wheels"/stoker-*.whl

# The servers every benchmark row reads through, and the CLI (`stoker index` writes the manifest).
cargo build --release --locked --quiet -p stoker-testkit -p stoker-cli --bins

"$venv/bin/python" - <<'PY'
import importlib.metadata as m
names = ["torch", "mosaicml-streaming", "litdata", "webdataset", "boto3", "stoker"]
print("peers_setup: ok (" + ", ".join(f"{n} {m.version(n)}" for n in names) + ")")
PY
