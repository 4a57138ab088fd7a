"""BrandDataset over a dataset in object storage: a real S3 server
(tools/s3-server, BRAND_S3_SERVER, via scripts/s3server.py), the dataset
packed to it by `brand pack -o s3://…`; two epochs of the same bytes and
order as the local copy, a checkpointed iterator resumed exactly, and no
read-ahead past the last epoch."""

import os
import sys

import pytest
import tensorflow as tf

from brand.tf import BrandDataset
from conftest import REPO, SAMPLES, brand

sys.path.insert(0, str(REPO / "scripts"))
import s3server  # noqa: E402


@pytest.fixture(scope="module")
def store(small_ds, tmp_path_factory):
    """(the dataset's URL, its server)."""
    binary = os.environ.get("BRAND_S3_SERVER", "")
    if not os.access(binary, os.X_OK):
        pytest.fail("BRAND_S3_SERVER must name tools/s3-server's binary (make python-test sets it)")
    saved = dict(os.environ)
    with s3server.serve(binary) as server:
        os.environ.update(server.env)
        u = f"{server.bucket('bkt')}/ds"
        # The local dataset's own files, uploaded: the same bytes under a URL.
        files = tmp_path_factory.mktemp("s3-src")
        brand("gen", files, "--samples", SAMPLES, "--mean-kib", 4, "--min-kib", 1, "--max-kib", 16,
              "--classes", 5, "--seed", 1)
        brand("pack", files, "-o", u, "--chunk-size", 16, "--seed", 1, "--staging", files)
        try:
            yield u, server
        finally:
            os.environ.clear()
            os.environ.update(saved)


@pytest.fixture(scope="module")
def url(store):
    return store[0]


def elements(ds):
    return [(int(el["id"]), el["data"].numpy()) for el in ds]


def test_a_url_yields_the_local_datasets_elements_in_its_order_for_two_epochs(url, small_ds):
    remote = elements(BrandDataset(url, epochs=2, seed=5))
    local = elements(BrandDataset(small_ds, epochs=2, seed=5))
    assert len(remote) == 2 * SAMPLES
    assert remote == local
    assert sorted(i for i, _ in remote[:SAMPLES]) == list(range(SAMPLES))


def test_a_checkpointed_iterator_over_a_url_resumes_exactly(url, tmp_path):
    whole = [int(el["id"]) for el in BrandDataset(url, seed=6)]
    ds = BrandDataset(url, seed=6)
    it = iter(ds)
    got = [int(next(it)["id"]) for _ in range(37)]
    ckpt = tf.train.Checkpoint(iterator=it)
    path = ckpt.write(str(tmp_path / "it"))
    it2 = iter(BrandDataset(url, seed=6))
    tf.train.Checkpoint(iterator=it2).read(path).assert_consumed()
    got += [int(el["id"]) for el in it2]
    assert got == whole


def test_the_last_epoch_is_not_read_ahead_past(store):
    """epochs=1: the bytes the server sends are the epoch's own, as for
    `brand read --epochs 1` with the same plan (the default 64 MiB of
    read-ahead held the next epoch of this small dataset whole)."""
    u, server = store

    def fetched(run) -> int:
        server.admin("reset-stats")
        run()
        return server.stats()["get_bytes"]

    one = fetched(lambda: elements(BrandDataset(u, epochs=1, seed=5)))
    cli = fetched(lambda: brand("read", u, "--epochs", 1, "--seed", 5))
    # The op opens the dataset twice (its size, then the iterator's loader):
    # one manifest more. An epoch read ahead would be ~2 MB more.
    assert cli <= one <= cli + 16384, f"{one} bytes for one epoch, {cli} as brand read"
