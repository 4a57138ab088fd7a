#!/usr/bin/env bash
# Creates (or reuses) the venv brand's Python package is tested in, outside
# the repository, and prints its path: numpy, torch (PyPI's, with its CUDA
# wheels: ~5 GB, about a minute), torchdata, grain, pytest and maturin, as
# python/tests/requirements.txt pins them. Reuse is keyed by a stamp holding
# the requirements, so changing a pin rebuilds it. BRAND_PY_VENV overrides
# the path.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/venv-lib.sh"
req="$here/python/tests/requirements.txt"
make_venv "${BRAND_PY_VENV:-$HOME/.cache/brand/py-venv-py311}" "$req" "$(cat "$req")" \
  "torch, torchdata, grain, numpy, pytest, maturin: ~5 GB, a minute or two"
