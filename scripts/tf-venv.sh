#!/usr/bin/env bash
# Creates (or reuses) the Python venv with the pinned TensorFlow, outside the
# repository, and prints its path. Reuse is keyed by a stamp holding the
# requirements and the version of this recipe, so changing either rebuilds it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/venv-lib.sh"
req="$here/tf-op/tests/requirements.txt"
# Version 2 compiles bytecode: a venv stamped by version 1 had none, so it is
# made again once.
make_venv "${BRAND_VENV:-$HOME/.cache/brand/venv-py311}" "$req" "$(cat "$req")
# tf-venv 2: bytecode compiled" "TensorFlow and pytest; about a minute"
