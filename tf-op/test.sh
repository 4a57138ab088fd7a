#!/usr/bin/env bash
# Builds the brand wheel, installs it into the TensorFlow venv and runs every
# test against real TensorFlow (tf-op/tests: brand.tf's op, compiled on first
# use against the installed TF as users get it, and TFRecords written by TF).
#
#   tf-op/test.sh [PYTHON]     (or PYTHON=...; BRAND_BIN=... for the brand CLI)
#
# PYTHON is the venv with TensorFlow, pytest and maturin (scripts/tf-venv.sh
# makes it); BRAND_BIN defaults to target/release/brand under CARGO_TARGET_DIR
# or the repo. The op is cached in $CARGO_TARGET_DIR/brand-cache between runs
# (keyed by TF version and source digest); the fresh-venv test builds its own.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
python=${1:-${PYTHON:-}}
if [ -z "$python" ]; then
  echo "usage: tf-op/test.sh PYTHON (or set PYTHON)" >&2
  exit 2
fi
target=${CARGO_TARGET_DIR:-$repo/target}
export CARGO_TARGET_DIR=$target
# Relative paths are taken from the repository root, as the Makefile passes them.
brand_bin=${BRAND_BIN:-$target/release/brand}
case $brand_bin in /*) ;; *) brand_bin=$repo/$brand_bin ;; esac
export BRAND_BIN=$brand_bin

cd "$repo"
if [ ! -x "$BRAND_BIN" ]; then
  echo "tf-op/test.sh: no brand CLI at $BRAND_BIN (cargo build --release -p brand-cli)" >&2
  exit 1
fi
export BRAND_WHEELS=$target/wheels-tf
rm -rf "$BRAND_WHEELS"
"$(dirname "$python")/maturin" build --release --locked --quiet --manifest-path python/Cargo.toml -o "$BRAND_WHEELS"
"$python" -m uv pip install --quiet --python "$python" --no-deps --reinstall "$BRAND_WHEELS"/brand-*.whl
export BRAND_CACHE_DIR=$target/brand-cache
TF_CPP_MIN_LOG_LEVEL=2 "$python" -m brand.tf build

# The tests that hit a caught Rust panic or an error would print backtraces.
export RUST_BACKTRACE=0
# One pytest process for all but tf.data service (importing TensorFlow costs
# seconds). tf.data service's dispatcher and workers listen on every address
# (TensorFlow's gRPC servers take a port, not an address), so its tests run in
# a network namespace of their own, where only a loopback exists.
status=0
"$python" -m pytest -q -p no:cacheprovider --ignore="$here/tests/test_service.py" "$here/tests" || status=$?
if [ "$status" -eq 5 ]; then
  echo "tf-op/test.sh: pytest collected no tests" >&2
  exit 1
fi
service=0
unshare --net sh -c 'ip link set lo up && exec "$0" -m pytest -q -p no:cacheprovider "$1"' \
  "$python" "$here/tests/test_service.py" || service=$?
if [ "$service" -ne 0 ]; then
  echo "tf-op/test.sh: the tf.data service tests failed (status $service)" >&2
  [ "$status" -ne 0 ] || status=$service
fi
exit "$status"
