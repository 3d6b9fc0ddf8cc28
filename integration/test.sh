#!/usr/bin/env bash
# The whole test suite: installs what the tests need (integration/setup.sh) while it builds
# them, then runs every Rust test, integration test and doctest in the workspace. README and
# .ci/run call this.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# Setup (downloads, mostly) runs beside the build of the tests, which needs nothing it installs.
source integration/background.sh
in_background bash integration/setup.sh
setup_pid=$bg_pid setup_log=$bg_log
# Remote sources cache blocks on disk by default: everything this suite runs keeps that cache
# (and tar indexes of read-only shards) here, never in ~/.cache, and starts it empty.
export STOKER_CACHE_DIR="$root/target/test-cache"
rm -rf "$STOKER_CACHE_DIR"
export STOKER_PYTHON="$root/.venv/bin/python"
# Writers of Parquet (pyarrow, datasets), MDS (mosaicml-streaming) and LitData (litdata).
export STOKER_WRITERS_PYTHON="$root/.venv-peers/bin/python"
# The GCS and Azure emulators integration/setup.sh installs (tests/remote_gcs.rs, remote_azure.rs).
export STOKER_FAKE_GCS="$root/.venv/bin/fake-gcs-server"
export STOKER_AZURITE="$root/integration/node_modules/.bin/azurite-blob"
# The CLI without Parquet, HDF5 and tokenizers (the README's command 1 builds that one): it
# reads the demo's layouts and refuses the others by name. Before the tests' build, which puts
# the full CLI back at target/debug/stoker.
bash integration/slim.sh
# Every test and doctest; not the examples (benchmarks, ~95 MB of debug binary each, which
# clippy --all-targets has already compiled): CI's disk is finite.
# stoker-zune-jpeg (vendor/) is upstream's decoder: its tests need upstream's test images.
# With the `cuda` feature on: without a driver the GPU path must report CudaUnavailable, never
# panic, and everything else must behave as without the feature. One build of the suite, not
# two (a second build of the library and its dependents took a minute of both cores). The
# build without the feature is linted by .ci/run, and the Python package, built without it,
# checks its error at run time (tests/test_torch.py).
features=(--workspace --exclude stoker-zune-jpeg --features stoker/cuda --locked)
cargo test "${features[@]}" --lib --bins --tests --no-run
collect "$setup_pid" "$setup_log" "integration/setup.sh"
# The docker-compose recipe must at least parse and resolve (no engine runs here; setup
# installs Debian's docker-compose, which checks it without one).
docker-compose -f docker/docker-compose.yml config -q
# Two test binaries take one test at a time on one thread (each installs a process-wide
# allocator that counts, so their tests take turns): about 45 s of one core. They run beside the
# rest, whose tests wait on servers and child processes often enough to leave a core idle.
# Every other test target is named from the manifests, so a new one is never left out.
solo=(decode_budget loader_alloc)
targets="$("$root/.venv/bin/python" integration/test_targets.py --exclude-package stoker-zune-jpeg --except "${solo[@]}")"
mapfile -t rest <<< "$targets"
# After them, in the same background job, the Python package is built into .venv while the rest
# still run: its build (the extension's own crate, then its link) leaves a core idle too. Cargo
# holds the build directory's lock only while it builds, not while tests run, and by then the
# rest's `cargo test` has long passed its own (brief) look at what is built. Then the
# checked-in type stub must match the compiled module (mypy, on one thread).
solo_then_package() {
  cargo test "${features[@]}" "${solo[@]/#/--test=}"
  (cd crates/stoker-py && VIRTUAL_ENV="$root/.venv" "$root/.venv/bin/maturin" develop --quiet --locked)
  (cd crates/stoker-py && "$root/.venv/bin/python" -m mypy.stubtest stoker._stoker)
}
in_background solo_then_package
solo_pid=$bg_pid solo_log=$bg_log
cargo test "${features[@]}" --lib --bins "${rest[@]/#/--test=}"
collect "$solo_pid" "$solo_log" "the one-at-a-time test binaries (${solo[*]}), or the Python package's build (maturin develop) or its type stub's check (stubtest)"
cargo test "${features[@]}" --doc
# The test binaries are done with (~100 MB of debug binary each, 0.75 GB in all), and the steps
# below build what they run: CI's disk is finite. A rerun links them again.
find target/debug/deps -maxdepth 1 -type f -perm -u+x ! -name '*.*' -delete
# Fuzzing: the cargo tests above replay every fuzz corpus with seeded mutations
# (crates/stoker/tests/it/fuzz_corpus.rs). The coverage-guided run, `fuzz/run.sh 600`, builds
# every dependency again with instrumentation (minutes of a 2-core CI for 10 s a target), so
# it is run by hand and its finds are added to fuzz/corpus (fuzz/README.md).
# The Python package (built into .venv above) against the real torch DataLoader (fork and spawn
# workers, torchrun); its S3 tests use the embedded S3 server binary, target/debug/s3_server,
# which `cargo test` built above for the test kit's own tests (a `cargo build -p
# stoker-testkit` here would build its dependencies again, without the tests' features).
[ -x target/debug/s3_server ] || { echo "test: target/debug/s3_server was not built by cargo test" >&2; exit 1; }
# Two workers, each test file in one of them (its module fixtures, such as a Ray cluster, started
# once): about 0.7x the time of one on two cores. A test still running after 15 minutes (the
# longest take about two) has hung: it fails there with its stack (SIGALRM, which interrupts a
# wait on a child and stoker's own waits, which check for signals) and the run goes on. A wait
# that a signal cannot break prints every thread's stack a minute later (faulthandler). Not
# --timeout-method=thread: its worker exits, and xdist gives the same file, hang first, to each
# new worker it starts. The slowest tests are listed to show where the time goes.
STOKER_S3_SERVER="$root/target/debug/s3_server" "$root/.venv/bin/python" -m pytest -q -p no:cacheprovider \
  -n 2 --dist loadfile --timeout 900 -o faulthandler_timeout=960 --durations 12 crates/stoker-py/tests
