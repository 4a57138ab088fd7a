"""BrandDataset attached to a `brand cache` (config `cache = "PATH"`): its
iterator's checkpoint mid-epoch holds the samples served, and a restore
continues attached or alone, every sample once in the epoch with its bytes."""

import socket
import subprocess
import time

import pytest
import tensorflow as tf

from brand.tf import BrandDataset
from conftest import BRAND, SAMPLES


def flat(t):
    """A per-sample scalar or a batch's vector as a list."""
    return tf.reshape(t, [-1]).numpy().tolist()


@pytest.fixture
def cache_socket(small_ds, tmp_path):
    """A running `brand cache` over the small dataset; stopped (SIGTERM) after.
    Its memory (more than the dataset) holds 2 batches of brand's default 256
    samples: the per-sample elements come from such batches."""
    path = tmp_path / "cache.sock"
    proc = subprocess.Popen(
        [BRAND, "cache", str(small_ds), "--memory", "8MiB", "--read-gap", "whole", "--socket", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"brand cache did not listen: {proc.communicate()[1].decode(errors='replace')}")
            time.sleep(0.02)
    yield path
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("brand cache did not stop on SIGTERM within 10 s")
    assert proc.returncode == 0, proc.stderr.read().decode(errors="replace")


@pytest.mark.parametrize("symbolic", [False, True], ids=["plain", "symbolic"])
@pytest.mark.parametrize("resume", ["attached", "alone"])
@pytest.mark.parametrize("batch_size, take", [(8, 5), (None, 37)], ids=["batched", "per-sample"])
def test_an_attached_iterator_checkpoint_mid_epoch_resumes_exactly_once(
    small_ds, small_bytes, cache_socket, tmp_path, resume, symbolic, batch_size, take
):
    # Per sample, 37 elements are inside brand's first batch (of its
    # default 256, or the epoch's 200): the state is that position in it.
    attached = f'cache = "{cache_socket}"'
    opts = tf.data.Options()
    opts.experimental_symbolic_checkpoint = symbolic
    it = iter(BrandDataset(small_ds, batch_size=batch_size, seed=3, config=attached).with_options(opts))
    seen = [i for _ in range(take) for i in flat(next(it)["id"])]
    path = tf.train.Checkpoint(it=it).save(str(tmp_path / "attached"))
    del it  # detaches from the cache
    config = attached if resume == "attached" else 'read_gap = "whole"'
    fresh = iter(BrandDataset(small_ds, batch_size=batch_size, seed=3, config=config).with_options(opts))
    tf.train.Checkpoint(it=fresh).restore(path).assert_consumed()
    for el in fresh:
        for i, d in zip(flat(el["id"]), flat(el["data"])):
            assert d == small_bytes[i], i
            seen.append(i)
    assert sorted(seen) == list(range(SAMPLES)), f"{resume}: the epoch exactly once"
