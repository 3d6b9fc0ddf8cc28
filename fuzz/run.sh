#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer on stable Rust (no nightly, no sanitizer): the
# targets are instrumented with LLVM's SanitizerCoverage through stable -C flags, exactly what
# `cargo fuzz --sanitizer none` does, and linked against libFuzzer built by libfuzzer-sys.
#
#   fuzz/run.sh                 every target for 10 s each (integration/test.sh only replays
#                               the corpora: crates/stoker/tests/it/fuzz_corpus.rs)
#   fuzz/run.sh 600             every target for 10 minutes each (the longer run)
#   fuzz/run.sh 3600 tar_index  one target for an hour
#
# Corpora grow in fuzz/corpus/TARGET (seeds are checked in); a crash is written to
# fuzz/artifacts/TARGET/ and fails the run. Exit status: 0 only if no target crashed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
seconds="${1:-10}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(uri tar_index sidecar manifest decode resync ranges parquet_footer records_index parquet_pages records_codec token_index tfrecord hdf5)
host="$(rustc -vV | sed -n 's/^host: //p')"
# --target keeps the instrumentation off build scripts and proc macros.
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$here/target}"
# Not --locked: fuzz/Cargo.lock pins what it holds, and a dependency stoker gains later is
# added to it (crates.io) instead of failing the suite until someone updates the lock.
cargo build --release --manifest-path "$here/Cargo.toml" --target "$host" --bins
bin="$CARGO_TARGET_DIR/$host/release"
for t in "${targets[@]}"; do
  mkdir -p "$here/corpus/$t" "$here/artifacts/$t"
  dict=()
  [ -f "$here/dict/$t.dict" ] && dict=(-dict="$here/dict/$t.dict")
  echo "fuzz: $t for ${seconds}s"
  # -max_len 64 KiB: shards bigger than that add no new header paths, only slower runs.
  log="$here/artifacts/$t/last-run.log"
  status=0
  "$bin/$t" "$here/corpus/$t" "${dict[@]}" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$here/artifacts/$t/" -print_final_stats=1 >"$log" 2>&1 || status=$?
  grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$log" | sed "s/^/fuzz: $t /"
  if [ "$status" -ne 0 ]; then
    tail -40 "$log" >&2
    echo "fuzz: $t FAILED (exit $status): the input is in $here/artifacts/$t/" >&2
    exit 1
  fi
done
echo "fuzz: no crashes"
