#!/usr/bin/env bash
# Creates (or reuses) the benchmark harness's Python venv outside the
# repository and prints its path.
#
#   scripts/bench-venv.sh          bench/requirements.txt: torch (PyPI's default,
#                                  CUDA wheels: several GB), spdl, tensorflow-cpu,
#                                  matplotlib, scikit-learn, pytest
#   scripts/bench-venv.sh test     bench/requirements-test.txt: matplotlib and
#                                  pytest only, for bench/tests (seconds to make)
#
# The venv is ~/.cache/brand/bench-venv-<name>-<hash of the requirements>
# (BRAND_BENCH_VENV overrides the path), reused while a stamp holding the
# requirements matches (the recipe: scripts/venv-lib.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/venv-lib.sh"
kind=${1:-full}
case $kind in
  full) req="$here/bench/requirements.txt" what="torch with its CUDA wheels, TensorFlow, spdl: several GB, minutes" ;;
  test) req="$here/bench/requirements-test.txt" what="matplotlib, pytest" ;;
  *) echo "usage: scripts/bench-venv.sh [full|test]" >&2; exit 2 ;;
esac
hash=$(sha256sum "$req" | cut -c1-12)
make_venv "${BRAND_BENCH_VENV:-$HOME/.cache/brand/bench-venv-$kind-$hash}" "$req" "$(cat "$req")
# bench-venv 2: bytecode compiled" "$what"
