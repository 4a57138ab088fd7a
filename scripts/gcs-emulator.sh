#!/usr/bin/env bash
# Installs (or reuses) gcp-storage-emulator, a pure-Python GCS emulator from
# PyPI, in a venv outside the repository, and prints the path of that venv's
# python: the gs:// tests (crates/cli/tests/objects_gcs.rs) run
# scripts/gcs_emulator.py with it on 127.0.0.1 (that script adds the parts of
# GCS's XML API, which object_store speaks, that the emulator lacks).
# Pinned version; BRAND_GCS_EMULATOR_DIR overrides where it goes.
set -euo pipefail
version=2026.7.19
dir="${BRAND_GCS_EMULATOR_DIR:-$HOME/.cache/brand/gcs-emulator-$version}"
python="$dir/bin/python"
if [ -x "$python" ] && [ "$(cat "$dir/.brand-stamp" 2>/dev/null)" = "$version" ]; then
  echo "$python"
  exit 0
fi
echo "setting up $dir (gcp-storage-emulator $version from PyPI)" >&2
rm -rf "$dir"
python3 -m venv "$dir"
"$dir/bin/pip" install --quiet --disable-pip-version-check "gcp-storage-emulator==$version" >&2
printf '%s' "$version" > "$dir/.brand-stamp"
echo "$python"
