#!/usr/bin/env bash
# Creates (or reuses) the Python venv with the pinned TensorFlow, outside the
# repository, and prints its path. Reuse is keyed by a stamp holding the
# requirements and the version of this recipe, so changing either rebuilds it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
req="$here/tf-op/tests/requirements.txt"
venv="${BRAND_VENV:-$HOME/.cache/brand/venv-py311}"
stamp="$venv/.brand-stamp"
# Version 2 compiles bytecode: a venv stamped by version 1 had none, so it is
# made again once.
want="$(cat "$req")
# tf-venv 2: bytecode compiled"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv"
  exit 0
fi
echo "setting up $venv (TensorFlow and pytest; about a minute)" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip uv >&2
# Bytecode compiled at install: each `import tensorflow` would otherwise
# compile it again in every test process (~20 s of CPU).
"$venv/bin/python" -m uv pip install --quiet --compile-bytecode --python "$venv/bin/python" -r "$req" >&2
printf '%s' "$want" > "$stamp"
echo "$venv"
