#!/usr/bin/env bash
# Creates (or reuses) the object-storage benchmark's Python venv outside the
# repository and prints its path: bench/requirements-objstore.txt
# (s3torchconnector, mosaicml-streaming, litdata, webdataset, boto3, torch with
# its CUDA wheels: several GB, minutes), plus the brand wheel if one is given
# in BRAND_WHEEL. ~/.cache/brand/objstore-venv-<hash> (BRAND_OBJSTORE_VENV
# overrides), reused while its stamp matches (scripts/venv-lib.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/venv-lib.sh"
req="$here/bench/requirements-objstore.txt"
hash=$(sha256sum "$req" | cut -c1-12)
make_venv "${BRAND_OBJSTORE_VENV:-$HOME/.cache/brand/objstore-venv-$hash}" "$req" "$(cat "$req")
# objstore-venv 1" "s3torchconnector, mosaicml-streaming, litdata, webdataset, torch: several GB, minutes"
