"""Shared fixtures: small datasets made by the brand CLI (BRAND_BIN, built by
`make py-test`), and helpers that read them back from their source files."""

import os
import pathlib
import shutil
import signal
import subprocess
from typing import Optional

import pytest

# The Ctrl-C tests send SIGINT to child processes. A shell that starts a job in
# the background without job control ignores SIGINT, and an ignored signal is
# inherited across exec: their children would never see it. A Python handler
# here is reset to the default in every child at exec instead.
signal.signal(signal.SIGINT, signal.default_int_handler)

SAMPLES = 150


def brand_bin() -> str:
    path = os.environ.get("BRAND_BIN")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("BRAND_BIN must name the brand CLI (make py-test sets it)")
    return path


def s3_server_bin() -> str:
    path = os.environ.get("BRAND_S3_SERVER")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("BRAND_S3_SERVER must name tools/s3-server's binary (make py-test sets it)")
    return path


def make_dataset(root: pathlib.Path, samples: int = SAMPLES, seed: int = 2,
                 chunk_size: Optional[int] = 16) -> tuple[pathlib.Path, pathlib.Path]:
    """Generates `samples` files under root/files and packs them into root/ds
    in chunks of `chunk_size` (None: brand pack's default)."""
    files, ds = root / "files", root / "ds"
    subprocess.run(
        [brand_bin(), "gen", str(files), "--samples", str(samples), "--mean-kib", "4", "--min-kib", "1",
         "--max-kib", "16", "--classes", "5", "--seed", str(seed)],
        check=True, capture_output=True,
    )
    subprocess.run(
        [brand_bin(), "pack", str(files), "-o", str(ds), "--seed", str(seed)]
        + (["--chunk-size", str(chunk_size)] if chunk_size is not None else []),
        check=True, capture_output=True,
    )
    return files, ds


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """(source directory, packed dataset) of SAMPLES samples; tests must not modify it."""
    return make_dataset(tmp_path_factory.mktemp("brand-data"))


@pytest.fixture
def corrupt_copy(dataset, tmp_path) -> pathlib.Path:
    """A copy of the dataset whose first segment has bytes flipped in the middle."""
    _, ds = dataset
    copy = tmp_path / "ds"
    shutil.copytree(ds, copy)
    segments = sorted(p for p in copy.iterdir() if p.is_file() and p.suffix not in (".toml", ".bin"))
    assert segments, f"no segment files in {sorted(copy.iterdir())}"
    seg = segments[0]
    data = bytearray(seg.read_bytes())
    mid = len(data) // 2
    for i in range(mid, mid + 64):
        data[i] ^= 0xFF
    seg.write_bytes(bytes(data))
    return copy


def source_bytes(files: pathlib.Path, key: str) -> bytes:
    return (files / os.fsdecode(os.fsencode(key))).read_bytes()


def assert_reads_as_local(url: str, files: pathlib.Path, ds: pathlib.Path, cfg: dict, epochs: int = 2) -> dict:
    """Reads `url` and its local copy `ds` side by side for `epochs`: the same
    ids in the same order (the order does not depend on where the bytes are),
    each sample's bytes those of its source file, every sample once per epoch,
    and bytes fetched from the store. Returns the URL loader's metrics."""
    import brand

    with brand.Loader(url, **cfg) as loader, brand.Loader(ds, **cfg) as local:
        for epoch in range(epochs):
            seen = []
            for batch in loader:
                same = next(local)
                assert batch.ids.tolist() == same.ids.tolist(), "the order does not depend on where the bytes are"
                for arr, key in zip(batch.samples, batch.keys):
                    assert arr.tobytes() == source_bytes(files, key), key
                seen += batch.ids.tolist()
            assert next(local, None) is None, "the local copy's epoch ends there too"
            assert sorted(seen) == list(range(SAMPLES)), f"epoch {epoch}"
        m = loader.metrics()
    assert m["store_requests"] > 0 and m["store_bytes_fetched"] > 0, m
    return m
