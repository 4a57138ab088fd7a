#!/usr/bin/env bash
# Creates (or reuses) the venv brand's Python package is tested in, outside
# the repository, and prints its path: numpy, torch (PyPI's, with its CUDA
# wheels: ~5 GB, about a minute), torchdata, grain, pytest and maturin, as
# python/tests/requirements.txt pins them. Reuse is keyed by a stamp holding
# the requirements, so changing a pin rebuilds it. BRAND_PY_VENV overrides
# the path.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
req="$here/python/tests/requirements.txt"
venv="${BRAND_PY_VENV:-$HOME/.cache/brand/py-venv-py311}"
stamp="$venv/.brand-stamp"
want=$(cat "$req")
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv"
  exit 0
fi
echo "setting up $venv (torch, torchdata, grain, numpy, pytest, maturin: ~5 GB, a minute or two)" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip uv >&2
# Bytecode compiled at install: with PYTHONDONTWRITEBYTECODE set, every
# `import torch` would otherwise compile it again in each test process.
"$venv/bin/python" -m uv pip install --quiet --compile-bytecode --python "$venv/bin/python" -r "$req" >&2
printf '%s' "$want" > "$stamp"
echo "$venv"
