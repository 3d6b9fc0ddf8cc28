#!/usr/bin/env bash
# Install what the test suite needs beyond cargo, idempotently, inside the clone:
#   .venv/  a Python venv with py-lmdb (fixtures written by the tools users write data with)
# GNU tar comes with Debian; it is checked, not installed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

command -v tar >/dev/null || { echo "setup: GNU tar is missing (apt-get install tar)" >&2; exit 1; }
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($py --version)"
  "$py" -m venv .venv
fi
# Pinned so a fresh machine gets what CI tested.
need=(lmdb==3.0.0)
if ! .venv/bin/python -c "import lmdb" 2>/dev/null; then
  echo "setup: installing ${need[*]} into .venv"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "${need[@]}"
fi
echo "setup: ok ($(.venv/bin/python -c 'import lmdb; print("py-lmdb", lmdb.__version__)'))"
