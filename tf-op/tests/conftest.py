"""Shared fixtures: the brand CLI makes small datasets once per session.

BRAND_BIN names the brand CLI (tf-op/test.sh sets it). brand.tf comes from
the brand wheel installed in this venv (tf-op/test.sh builds and installs
it); its op is compiled on first use into $BRAND_CACHE_DIR/tf-op.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

TF_OP = Path(__file__).resolve().parents[1]
REPO = TF_OP.parent

BRAND = os.environ.get("BRAND_BIN", str(REPO / "target" / "release" / "brand"))

# The small dataset most tests read: an even sample count (two shards split
# it exactly) that is not a multiple of the batch sizes used (partial last
# batches) nor of the chunk size.
SAMPLES = 200
CLASSES = 5


def brand(*args):
    r = subprocess.run([BRAND, *map(str, args)], capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"brand {' '.join(map(str, args))} failed: {r.stderr.decode(errors='replace')}")
    return r.stdout


def make_dataset(root, samples, seed, chunk_size=16):
    files, ds = root / "files", root / "ds"
    brand("gen", files, "--samples", samples, "--mean-kib", 4, "--min-kib", 1, "--max-kib", 16,
          "--classes", CLASSES, "--seed", seed)
    brand("pack", files, "-o", ds, "--chunk-size", chunk_size, "--seed", seed)
    return ds


@pytest.fixture(scope="session")
def small_ds(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("small"), SAMPLES, seed=1)


@pytest.fixture(scope="session")
def small_bytes(small_ds):
    """id -> the sample's bytes, as `brand cat` prints them."""
    info = json.loads(brand("inspect", "--json", small_ds))
    assert info["samples"] == SAMPLES
    return {i: brand("cat", small_ds, i) for i in range(SAMPLES)}
