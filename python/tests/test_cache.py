"""brand.Loader attached to a `brand cache` (cache="PATH"): two jobs with their
own seeds share one cache and each serves every sample once per epoch, bytes
equal to the sources, as zero-copy views of the shared memory."""

import os
import pathlib
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

import brand

from conftest import SAMPLES, brand_bin, source_bytes


@pytest.fixture
def cache_socket(dataset, tmp_path):
    """A running `brand cache` over the dataset; stopped (SIGTERM) afterwards. Its
    memory holds what two jobs keep at once (a Python loader holds up to 3
    batches: the user's, the previous one not yet collected, one fetched
    ahead); at 25 % two such jobs can fill it and wait on each other."""
    _, ds = dataset
    path = tmp_path / "cache.sock"
    proc = subprocess.Popen(
        [brand_bin(), "cache", str(ds), "--memory", "60%", "--read-gap", "whole", "--socket", str(path)],
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
                _, err = proc.communicate()
                pytest.fail(f"brand cache did not listen: {err.decode(errors='replace')}")
            time.sleep(0.02)
    yield path
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("brand cache did not stop on SIGTERM within 10 s")
    assert proc.returncode == 0, proc.stderr.read().decode(errors="replace")
    assert not path.exists(), "the stopped cache left its socket"


def read_epochs(loader, files, epochs, out, errors):
    try:
        for _ in range(epochs):
            seen = []
            for batch in loader:
                for arr, key in zip(batch.samples, batch.keys):
                    # A view of the cache's shared memory, not a copy.
                    assert not arr.flags.owndata and not arr.flags.writeable
                    assert arr.tobytes() == source_bytes(files, key), key
                seen += batch.ids.tolist()
            out.append(seen)
    except BaseException as e:  # reported by the main thread
        errors.append(e)


def test_two_attached_jobs_each_serve_every_sample_once_per_epoch(dataset, cache_socket):
    files, ds = dataset
    loaders = [brand.Loader(ds, batch_size=8, seed=s, cache=str(cache_socket)) for s in (3, 4)]
    results = [[], []]
    errors = []
    threads = [
        threading.Thread(target=read_epochs, args=(l, files, 2, r, errors)) for l, r in zip(loaders, results)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "an attached job hung"
    assert not errors, errors
    for epochs in results:
        assert len(epochs) == 2
        for seen in epochs:
            assert sorted(seen) == list(range(SAMPLES))
    assert results[0][0] != results[1][0], "two seeds served one order"
    for l in loaders:
        l.close()


@pytest.mark.parametrize("resume", ["attached", "alone"])
def test_an_attached_jobs_state_mid_epoch_resumes_attached_or_alone_exactly_once(dataset, cache_socket, resume):
    files, ds = dataset
    with brand.Loader(ds, batch_size=8, seed=5, cache=str(cache_socket)) as loader:
        start = loader.state_dict()  # at the epoch's start: a count is the whole state
        assert len(bytes.fromhex(start["checkpoint"])) == brand.CHECKPOINT_BYTES
        it = iter(loader)
        before = [next(it) for _ in range(3)]
        # The loader has fetched a fourth batch ahead: the state is where the
        # user is, with the bitmap of the 24 samples handed out.
        state = loader.state_dict()
    assert (state["epoch"], state["served"]) == (0, 24)
    assert len(bytes.fromhex(state["checkpoint"])) == brand.CHECKPOINT_BYTES + 8 * ((SAMPLES + 63) // 64)
    seen = [i for b in before for i in b.ids.tolist()]
    config = {"cache": str(cache_socket)} if resume == "attached" else {"read_gap": "whole"}
    with brand.Loader(ds, batch_size=8, seed=5, **config) as again:
        again.load_state_dict(state)
        for batch in again:
            for arr, key in zip(batch.samples, batch.keys):
                assert arr.tobytes() == source_bytes(files, key), key
            seen += batch.ids.tolist()
        assert again.state_dict()["epoch"] == 1
    assert sorted(seen) == list(range(SAMPLES)), f"{resume}: the epoch exactly once"


def test_a_cache_that_is_not_there_is_a_typed_error_naming_the_socket(dataset, tmp_path):
    _, ds = dataset
    missing = tmp_path / "nobody.sock"
    with pytest.raises(brand.BrandError, match=str(missing)):
        loader = brand.Loader(ds, cache=str(missing))
        next(iter(loader))


def test_torch_batched_state_of_an_attached_job_resumes_exactly_once(dataset, cache_socket):
    import brand.torch

    files, ds = dataset
    attached = {"batch_size": 8, "seed": 6, "cache": str(cache_socket)}
    first = brand.torch.BrandDataset(ds, batched=True, **attached)
    it = iter(first)
    seen = [i for _ in range(4) for i in next(it)["id"].tolist()]
    state = first.state_dict()
    assert state["skip"] == 0 and state["brand"]["served"] == 32
    it.close()
    first._loader.close()
    again = brand.torch.BrandDataset(ds, batched=True, batch_size=8, seed=6, read_gap="whole")
    again.load_state_dict(state)
    for item in again:
        for data, key in zip(item["data"], item["key"]):
            assert data.numpy().tobytes() == source_bytes(files, key), key
        seen += item["id"].tolist()
    assert sorted(seen) == list(range(SAMPLES)), "the epoch exactly once"


@pytest.mark.parametrize("resume", ["attached", "alone"])
def test_torch_and_grain_per_sample_states_inside_an_attached_batch_resume_exactly_once(dataset, cache_socket, resume):
    import brand.grain
    import brand.torch

    _, ds = dataset
    attached = {"batch_size": 8, "seed": 7, "cache": str(cache_socket)}
    config = attached if resume == "attached" else {"batch_size": 8, "seed": 7, "read_gap": "whole"}

    first = brand.torch.BrandDataset(ds, **attached)
    it = iter(first)
    seen = [next(it)["id"] for _ in range(11)]  # 3 samples into the second batch
    state = first.state_dict()
    assert state["skip"] == 0 and state["brand"]["served"] == 11
    it.close()
    first._loader.close()
    again = brand.torch.BrandDataset(ds, **config)
    again.load_state_dict(state)
    seen += [item["id"] for item in again]
    assert sorted(seen) == list(range(SAMPLES)), f"torch, {resume}: the epoch exactly once"

    grain_it = iter(brand.grain.BrandIterDataset(ds, **attached))
    seen = [next(grain_it)["id"] for _ in range(11)]
    saved = grain_it.get_state()
    grain_it.close()
    fresh = iter(brand.grain.BrandIterDataset(ds, **config))
    fresh.set_state(saved)
    seen += [item["id"] for item in fresh]
    fresh.close()
    assert sorted(seen) == list(range(SAMPLES)), f"grain, {resume}: the epoch exactly once"


def test_a_state_inside_a_batch_of_a_loader_alone_is_refused_by_an_attached_one(dataset, cache_socket):
    import brand.torch

    _, ds = dataset
    alone = brand.torch.BrandDataset(ds, batch_size=8, seed=7, read_gap="whole")
    it = iter(alone)
    for _ in range(3):
        next(it)
    state = alone.state_dict()
    assert state["skip"] == 3
    it.close()
    attached = brand.torch.BrandDataset(ds, batch_size=8, seed=7, cache=str(cache_socket))
    attached.load_state_dict(state)
    with pytest.raises(brand.InvalidStateError, match=r"inside a brand batch \(3 samples.*attached to a cache"):
        iter(attached)
