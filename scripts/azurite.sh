#!/usr/bin/env bash
# Installs (or reuses) Azurite, Microsoft's Azure Storage emulator, outside the
# repository, and prints the path of its blob server: the Azure tests
# (python/tests/test_azure.py) run brand against it on 127.0.0.1. Node.js and
# npm come from Debian's apt when missing; Azurite from npm's registry, at the
# pinned version. BRAND_AZURITE_DIR overrides where it goes.
set -euo pipefail
version=3.35.0
dir="${BRAND_AZURITE_DIR:-$HOME/.cache/brand/azurite-$version}"
bin="$dir/node_modules/.bin/azurite-blob"
if [ -x "$bin" ] && [ "$(cat "$dir/.brand-stamp" 2>/dev/null)" = "$version" ]; then
  echo "$bin"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "installing nodejs and npm (apt-get) for Azurite" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
echo "setting up $dir (Azurite $version from npm, ~45 s)" >&2
rm -rf "$dir"
mkdir -p "$dir"
(cd "$dir" && npm install --silent --no-audit --no-fund --no-save "azurite@$version" >&2)
printf '%s' "$version" > "$dir/.brand-stamp"
echo "$bin"
