#!/usr/bin/env bash
# Runs every fuzz target (or those named) for FUZZ_SECONDS each (default 60)
# with libFuzzer on stable Rust: sanitizer-coverage instrumentation through
# -Cpasses=sancov-module, no ASan (Rust code is memory-safe; a panic, an
# abort, a timeout or running out of FUZZ_RSS_MB is the finding).
#
#   fuzz/run.sh [TARGET...]     FUZZ_SECONDS=600 fuzz/run.sh index
#
# Each target starts from fuzz/corpus/TARGET and its dictionary
# fuzz/dict/TARGET.dict; what it finds new goes to a scratch corpus under the
# target directory, crashes to fuzz/artifacts/TARGET/. Copy a crash into
# fuzz/corpus/TARGET/ with the fix so `make test` replays it forever.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
seconds=${FUZZ_SECONDS:-60}
rss=${FUZZ_RSS_MB:-2048}
target_dir=${CARGO_TARGET_DIR:-$here/../target}/fuzz
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(index chunk_header manifest state loader_toml tfrecord lmdb lmdb_page tar arrow flatbuffers nodes cache_wire)
fi
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares"
# An explicit --target keeps RUSTFLAGS off build scripts and proc macros.
triple=$(rustc -vV | sed -n 's/^host: //p')
cargo build --release --locked --manifest-path "$here/Cargo.toml" --target-dir "$target_dir" \
  --target "$triple" --features libfuzzer --bins
status=0
for t in "${targets[@]}"; do
  work="$target_dir/corpus/$t"
  artifacts="$here/artifacts/$t"
  mkdir -p "$work" "$artifacts"
  echo "== fuzz $t for ${seconds}s"
  RUST_BACKTRACE=1 "$target_dir/$triple/release/$t" "$work" "$here/corpus/$t" \
    -dict="$here/dict/$t.dict" -max_total_time="$seconds" -rss_limit_mb="$rss" -timeout=10 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 || status=$?
done
exit "$status"
