"""Datasets in Azure Blob Storage: Azurite, Microsoft's emulator
(BRAND_AZURITE, installed by scripts/azurite.sh, started per module on
127.0.0.1 by scripts/azurite.py), the dataset packed to it by `brand pack -o
az://…`, read back by brand.Loader and `brand verify`, and refused with
typed errors: the Azure path of brand-store, through object_store's Azure
client, end to end."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import brand

from conftest import SAMPLES, assert_reads_as_local, brand_bin

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import azurite  # noqa: E402

CFG = dict(batch_size=16, memory="20%", seed=5)


@pytest.fixture(scope="module")
def az(dataset):
    """(emulator, URL of the dataset packed to it, local source files, local dataset);
    the process's environment points at the emulator while the module runs."""
    blob_bin = os.environ.get("BRAND_AZURITE")
    if not blob_bin or not os.access(blob_bin, os.X_OK):
        pytest.fail("BRAND_AZURITE must name Azurite's azurite-blob (scripts/azurite.sh; make py-test sets it)")
    files, ds = dataset
    saved = dict(os.environ)
    with azurite.serve(blob_bin) as server:
        os.environ.update(server.env)
        url = f"{server.container('bkt')}/sets/ds"
        pack = subprocess.run([brand_bin(), "pack", str(files), "-o", url, "--chunk-size", "16", "--seed", "2"],
                              capture_output=True, text=True)
        assert pack.returncode == 0, pack.stderr
        try:
            yield server, url, files, ds
        finally:
            os.environ.clear()
            os.environ.update(saved)


def test_an_azure_url_reads_every_sample_once_per_epoch_with_its_bytes(az):
    _, url, files, ds = az
    assert_reads_as_local(url, files, ds, CFG)


def test_verify_and_inspect_read_the_container(az):
    _, url, _, _ = az
    verify = subprocess.run([brand_bin(), "verify", url], capture_output=True, text=True)
    assert verify.returncode == 0 and f"{SAMPLES} samples, 0 problem(s)" in verify.stdout, verify.stdout + verify.stderr
    inspect = subprocess.run([brand_bin(), "inspect", url, "--json"], capture_output=True, text=True, check=True)
    assert json.loads(inspect.stdout)["samples"] == SAMPLES


def test_a_second_pack_is_refused_and_force_replaces_it_whole(az):
    _, url, files, _ = az
    again = subprocess.run([brand_bin(), "pack", str(files), "-o", url, "--chunk-size", "16", "--seed", "2"],
                           capture_output=True, text=True)
    assert again.returncode != 0 and "already holds a dataset" in again.stderr, again.stderr
    forced = subprocess.run([brand_bin(), "pack", str(files), "-o", url, "--chunk-size", "32", "--seed", "9",
                             "--force"], capture_output=True, text=True)
    assert forced.returncode == 0, forced.stderr
    with brand.Loader(url, **CFG) as loader:
        ids = [i for b in loader for i in b.ids.tolist()]
    assert sorted(ids) == list(range(SAMPLES))
    inspect = subprocess.run([brand_bin(), "inspect", url, "--json"], capture_output=True, text=True, check=True)
    assert json.loads(inspect.stdout)["chunk_size"] == 32


def test_a_missing_container_or_prefix_is_a_typed_error_naming_the_url(az):
    with pytest.raises(brand.NotFoundError, match="az://nocontainer/ds"):
        brand.Loader("az://nocontainer/ds", **CFG)
    with pytest.raises(brand.NotFoundError, match="az://bkt/nope"):
        brand.Loader("az://bkt/nope", **CFG)


def test_a_dataset_of_many_segments_opens_from_the_containers_listing(az, tmp_path):
    """Above 16 segments an open takes their entity tags from one listing, not a HEAD each:
    Azure lists the tags bare and quotes them in a HEAD, which brand reconciles (else it
    falls back to a HEAD per segment, and says so at -v)."""
    server, _, _, _ = az
    files = tmp_path / "large"
    subprocess.run([brand_bin(), "gen", str(files), "--samples", "40", "--mean-kib", "500", "--min-kib", "400",
                    "--max-kib", "600", "--seed", "3"], check=True, capture_output=True)
    url = f"{server.container('many')}/ds"
    pack = subprocess.run([brand_bin(), "pack", str(files), "-o", url, "--chunk-size", "1", "--segment-mib", "1"],
                          capture_output=True, text=True)
    assert pack.returncode == 0, pack.stderr
    inspect = subprocess.run([brand_bin(), "-v", "inspect", url, "--json"], capture_output=True, text=True)
    assert inspect.returncode == 0, inspect.stderr
    assert json.loads(inspect.stdout)["segments"] > 16
    assert "a HEAD per segment instead" not in inspect.stderr, inspect.stderr
    # Every GET pinned (If-Match) to a listed tag, as spelled for it.
    with brand.Loader(url, batch_size=8, memory="50%", seed=1) as loader:
        ids = [i for b in loader for i in b.ids.tolist()]
    assert sorted(ids) == list(range(40))
