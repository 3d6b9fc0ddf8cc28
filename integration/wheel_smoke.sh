#!/usr/bin/env bash
# The Python package as a user installs it: build the abi3 wheel, install it into a fresh venv
# (no Rust toolchain on its PATH, and pip takes binary packages only, so nothing is compiled),
# and run integration/py/wheel_smoke.py there. Prints the smoke script's JSON line last.
#
#   bash integration/wheel_smoke.sh [--release]
#
# Without --release the wheel is built in the dev profile the test suite's `maturin develop`
# already compiled (packaging only, seconds); with it, the release wheel users get (minutes).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
work="$root/target/wheel-smoke"
rm -rf "$work"
mkdir -p "$work/wheels"
(cd crates/stoker-py && "$root/.venv/bin/maturin" build --locked --quiet ${1:-} --out "$work/wheels" \
    --interpreter "$root/.venv/bin/python" >&2)
wheel=$(ls "$work"/wheels/stoker-*-abi3-*.whl)
python3 -m venv "$work/venv"
# No cargo or rustc on the PATH: an install that needed Rust would fail here.
clean_path="$work/venv/bin:/usr/bin:/bin"
for tool in cargo rustc; do
    if PATH="$clean_path" command -v "$tool" > /dev/null; then
        echo "wheel_smoke: $tool is on the clean PATH ($clean_path); the check would prove nothing" >&2
        exit 1
    fi
done
PATH="$clean_path" "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary :all: \
    "$wheel[numpy]" >&2
PATH="$clean_path" "$work/venv/bin/python" integration/py/wheel_smoke.py "$work/data"
