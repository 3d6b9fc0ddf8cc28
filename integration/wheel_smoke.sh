#!/usr/bin/env bash
# The Python package as a user installs it: build the abi3 wheel, install it into a fresh venv
# (no Rust toolchain on its PATH, and pip takes binary packages only, so nothing is compiled),
# and run integration/py/wheel_smoke.py there. Prints the smoke script's JSON line, one per Python tried.
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
# The abi3 wheel serves every Python >= 3.9: tried with this machine's python3, and with the
# oldest and newest CPython it has besides (pyenv's shims resolve only where installed).
pythons=(python3)
for v in 3.9 3.13; do
    for extra in "python$v" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python3; do
        if [ -n "$(command -v "$extra")" ] && "$extra" -c "" 2> /dev/null; then
            pythons+=("$extra")
            break
        fi
    done
done
# One Python's fresh venv, install and smoke run; prints the smoke's JSON line.
smoke() {
    local py="$1" venv clean_path tool
    venv="$work/venv-$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    "$py" -m venv "$venv"
    # No cargo or rustc on the PATH: an install that needed Rust would fail here.
    clean_path="$venv/bin:/usr/bin:/bin"
    for tool in cargo rustc; do
        if PATH="$clean_path" command -v "$tool" > /dev/null; then
            echo "wheel_smoke: $tool is on the clean PATH ($clean_path); the check would prove nothing" >&2
            return 1
        fi
    done
    PATH="$clean_path" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary :all: \
        "$wheel[numpy]" >&2
    PATH="$clean_path" "$venv/bin/python" integration/py/wheel_smoke.py "$venv-data"
}
# The Pythons side by side (each mostly unpacks wheels and starts an interpreter), their output
# printed in order; any failure fails the whole.
pids=()
for i in "${!pythons[@]}"; do
    smoke "${pythons[$i]}" > "$work/out-$i" 2> "$work/err-$i" &
    pids+=($!)
done
failed=0
for i in "${!pythons[@]}"; do
    if ! wait "${pids[$i]}"; then
        echo "wheel_smoke: ${pythons[$i]} failed:" >&2
        failed=1
    fi
    cat "$work/err-$i" >&2
    cat "$work/out-$i"
done
exit "$failed"
