#!/usr/bin/env bash
# The whole test suite: installs what the tests need (integration/setup.sh), then runs every
# Rust test, integration test and doctest in the workspace. README and .ci/run call this.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash integration/setup.sh
export STOKER_PYTHON="$root/.venv/bin/python"
cargo test --workspace --locked
