# Sourced by the venv scripts (tf-venv.sh, py-venv.sh, bench-venv.sh): the
# one recipe for a venv outside the repository, reused while its stamp holds
# what the caller wants (the requirements, and a recipe version where one is
# given), so changing a pin rebuilds it.

# make_venv VENV REQUIREMENTS WANT WHAT: prints VENV, after creating it from
# REQUIREMENTS unless its stamp holds WANT; WHAT says what is installed.
make_venv() {
  local venv=$1 req=$2 want=$3 what=$4
  local stamp="$venv/.brand-stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
    echo "$venv"
    return 0
  fi
  echo "setting up $venv ($what)" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  # Bytecode compiled at install: with PYTHONDONTWRITEBYTECODE set (as on
  # these machines), every `import tensorflow` or `import torch` would
  # otherwise compile it again in each process (~20 s of CPU for TensorFlow).
  if "$venv/bin/python" -m pip install --quiet --upgrade pip uv >&2; then
    "$venv/bin/python" -m uv pip install --quiet --compile-bytecode --python "$venv/bin/python" -r "$req" >&2
  else
    echo "uv unavailable: installing with pip" >&2
    "$venv/bin/python" -m pip install --quiet -r "$req" >&2  # pip compiles bytecode itself
  fi
  printf '%s' "$want" > "$stamp"
  echo "$venv"
}
