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
# requirements matches. uv (installed from PyPI into the venv) does the
# install; plain pip if uv cannot be had. Bytecode is compiled at install:
# with PYTHONDONTWRITEBYTECODE set (as on these machines) every `import
# tensorflow` would otherwise compile it again (~20 s of CPU per process).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:-full}
case $kind in
  full) req="$here/bench/requirements.txt" ;;
  test) req="$here/bench/requirements-test.txt" ;;
  *) echo "usage: scripts/bench-venv.sh [full|test]" >&2; exit 2 ;;
esac
hash=$(sha256sum "$req" | cut -c1-12)
venv="${BRAND_BENCH_VENV:-$HOME/.cache/brand/bench-venv-$kind-$hash}"
stamp="$venv/.brand-stamp"
want="$(cat "$req")
# bench-venv 2: bytecode compiled"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv"
  exit 0
fi
if [ "$kind" = full ]; then
  echo "setting up $venv (torch with its CUDA wheels, TensorFlow, spdl: several GB, minutes)" >&2
else
  echo "setting up $venv (matplotlib, pytest)" >&2
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
if "$venv/bin/python" -m pip install --quiet --upgrade pip uv >&2; then
  "$venv/bin/python" -m uv pip install --quiet --compile-bytecode --python "$venv/bin/python" -r "$req" >&2
else
  echo "uv unavailable: installing with pip" >&2
  "$venv/bin/python" -m pip install --quiet -r "$req" >&2  # pip compiles bytecode itself
fi
printf '%s' "$want" > "$stamp"
echo "$venv"
