"""Datasets in object storage from Python: a real S3 server (tools/s3-server,
BRAND_S3_SERVER, started per module by scripts/s3server.py), the dataset
packed to it by `brand pack -o s3://…`, read back by brand.Loader and by
brand.torch under DataLoader worker processes (forked after the parent opened
the dataset), resumed from a state, and refused with typed errors."""

import json
import logging
import os
import pathlib
import socket
import subprocess
import sys

import pytest

import brand

from conftest import SAMPLES, assert_reads_as_local, brand_bin, s3_server_bin

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import s3server  # noqa: E402

CFG = dict(batch_size=16, memory="20%", seed=7)


@pytest.fixture(scope="module")
def s3(dataset):
    """(server, URL of the dataset packed to it, local source files, local dataset);
    the process's environment points at the server while the module runs."""
    files, ds = dataset
    saved = dict(os.environ)
    with s3server.serve(s3_server_bin()) as server:
        os.environ.update(server.env)
        bucket = server.bucket("bkt")
        url = f"{bucket}/sets/ds"
        subprocess.run(
            [brand_bin(), "pack", str(files), "-o", url, "--chunk-size", "16", "--seed", "2"],
            check=True, capture_output=True,
        )
        try:
            yield server, url, files, ds
        finally:
            os.environ.clear()
            os.environ.update(saved)


def test_a_url_reads_every_sample_once_per_epoch_with_its_bytes(s3):
    server, url, files, ds = s3
    assert_reads_as_local(url, files, ds, CFG)


def test_a_local_tier_is_filled_once_and_read_by_a_later_loader(s3, tmp_path):
    """disk_cache keeps the dataset's chunks on local disk (issue 56): a
    second loader on the same tier reads every sample from it, sending the
    store no GET, with the same bytes; its keys are checked like any."""
    server, url, files, ds = s3
    tier = tmp_path / "tier"
    cfg = dict(CFG, disk_cache=str(tier), read_gap="whole")
    filled = assert_reads_as_local(url, files, ds, cfg)
    assert filled["tier_kept_chunks"] > 0, filled
    assert filled["tier_held_bytes"] > 0, filled
    with brand.Loader(url, **cfg) as second:
        for _ in second:
            pass
        warm = second.metrics()
    assert warm["store_requests"] == 0, warm
    assert warm["tier_hits"] > 0 and warm["tier_chunks_fetched"] == 0, warm
    # The placement's figures (alone on the tier: nothing evicted; its benefit
    # a share of time when measured, None before a second of its consumer's time).
    for m in (filled, warm):
        assert m["tier_evicted_bytes"] == 0, m
        assert m["tier_benefit"] is None or 0.0 <= m["tier_benefit"] <= 1.0, m
        assert m["tier_owed_bytes"] <= m["tier_limit_bytes"], m
    for bad, match in [(dict(disk_cache_limit="50%"), "disk_cache_limit without disk_cache"),
                       (dict(disk_cache=str(tier), disk_cache_limit="150%"), "disk_cache_limit"),
                       (dict(disk_cache=""), "disk_cache")]:
        with pytest.raises(brand.ConfigError, match=match):
            brand.Loader(url, **CFG, **bad)


def test_a_url_resumes_from_a_state(s3):
    _, url, _, _ = s3
    with brand.Loader(url, **CFG) as loader:
        whole = [b.ids.tolist() for b in loader]
    with brand.Loader(url, **CFG) as first:
        got = [next(first).ids.tolist() for _ in range(3)]
        state = json.loads(json.dumps(first.state_dict()))
    with brand.Loader(url, **CFG) as second:
        second.load_state_dict(state)
        got += [b.ids.tolist() for b in second]
    assert got == whole


def test_gets_in_flight_are_sized_by_default_fixed_when_given_and_checked(s3):
    _, url, _, _ = s3
    with brand.Loader(url, **CFG) as auto, brand.Loader(url, gets_in_flight=8, **CFG) as fixed:
        for loader in (auto, fixed):
            assert sum(len(b.ids) for b in loader) == SAMPLES
        assert 4 <= auto.metrics()["store_gets_in_flight_limit"] <= 256, auto.metrics()
        assert fixed.metrics()["store_gets_in_flight_limit"] == 8, fixed.metrics()
    for wrong in ("many", 0):
        with pytest.raises(brand.ConfigError, match="gets_in_flight"):
            brand.Loader(url, gets_in_flight=wrong, **CFG)


def test_503_bursts_are_retried_and_reported_in_metrics(s3, caplog):
    """Retried, counted, and told as a warning through Python's logging
    (logger "brand"), as the CLI prints it (issue 55: the wheel's log)."""
    server, _, files, _ = s3
    # A copy of its own: a closed reader's GETs still on the wire (the
    # previous tests read ahead into their next epoch) reach the server
    # after their reader is gone, and would take faults meant for this one.
    url = "s3://bkt/sets/ds-503"
    subprocess.run([brand_bin(), "pack", str(files), "-o", url, "--chunk-size", "16", "--seed", "2"],
                   check=True, capture_output=True)
    # The next 4 GETs of that copy's segments answer 503.
    server.admin("faults", fail=4, status=503, key_filter="ds-503/data-")
    with caplog.at_level(logging.WARNING, logger="brand"):
        with brand.Loader(url, **dict(CFG, readahead="1MiB", read_gap="whole")) as loader:
            try:
                ids = [i for b in loader for i in b.ids.tolist()]
                assert sorted(ids) == list(range(SAMPLES))
                assert loader.metrics()["store_retries_by_cause"].get("503") == 4, loader.metrics()
            finally:
                server.admin("clear")
        assert brand._brand._flush_log()
    warned = [r for r in caplog.records if r.name == "brand" and r.levelno == logging.WARNING]
    assert any("503" in r.getMessage() and "retrying" in r.getMessage() for r in warned), [
        r.getMessage() for r in caplog.records]


def test_a_users_stall_timeout_ends_an_open_that_gets_no_answer(s3, monkeypatch):
    """An endpoint that takes connections and never answers: the open gives
    up after the retries of the user's stall_timeout (1 s each: ~40 s with
    the backoff), not the default's 10 s (130 s in all), and says so (issue
    55: the user's store settings reach the open, not only the reads)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # never accepted: the kernel completes the handshakes
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
        with pytest.raises(brand.IoError, match=r"no answer in 1\.0s"):
            brand.Loader(s3[1], stall_timeout="1s", **CFG)


def test_a_users_stall_timeout_and_retries_end_a_pack_whose_inputs_never_answer(s3, monkeypatch, tmp_path):
    """brand.pack takes stall_timeout and retries as brand.Loader does (issue
    55): a pack whose inputs are in a store that takes connections and never
    answers ends after the user's one retry (of a request bounded by the
    1 s stall timeout), not the default's 10 of 10 s, says so, and leaves no
    dataset."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # never accepted: the kernel completes the handshakes
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
        # The prefix's LIST is what never answers: object_store's request
        # timeout, which the stall timeout sets, ends it.
        with pytest.raises(brand.IoError, match=r"s3://bkt/shards.*timed out.*after 1 retries"):
            brand.pack(["s3://bkt/shards/"], tmp_path / "out", source="tar", stall_timeout="1s", retries=1)
        assert not (tmp_path / "out").exists()


def test_a_writer_to_a_bucket_takes_the_store_keywords(s3, tmp_path):
    """brand.Writer's stall_timeout and retries are checked when it is made,
    as a Loader's are, and bound its upload."""
    for bad, match in [(dict(retries=-1), "retries"), (dict(stall_timeout="soon"), "stall_timeout")]:
        with pytest.raises(brand.ConfigError, match=match):
            brand.Writer("s3://bkt/sets/never", **bad)
        with pytest.raises(brand.ConfigError, match=match):
            brand.pack([tmp_path], tmp_path / "never", **bad)
    url = "s3://bkt/sets/written"
    with brand.Writer(url, stall_timeout="5s", retries=2, chunk_size=4) as w:
        for i in range(20):
            w.write(bytes([i]) * (i + 1), label=i % 3)
    with brand.Loader(url, batch_size=4, memory="100%", seed=1) as loader:
        ids = sorted(i for b in loader for i in b.ids.tolist())
    assert ids == list(range(20))


def test_torch_workers_forked_after_the_parent_opened_the_dataset_read_it(s3):
    torch = pytest.importorskip("torch")
    import brand.torch

    _, url, _, _ = s3
    # The parent has a reader of the store running (its runtime, its
    # connections) when the workers fork: each worker makes its own.
    parent = brand.Loader(url, **CFG)
    first = next(parent).ids.tolist()
    ds = brand.torch.BrandDataset(url, batched=True, batch_size=8, memory="40%", seed=3)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    ids = [i for step in loader for i in step["id"].tolist()]
    assert sorted(ids) == list(range(SAMPLES))
    # And the parent's reader goes on after the fork.
    rest = [i for b in parent for i in b.ids.tolist()]
    parent.close()
    assert sorted(first + rest) == list(range(SAMPLES))


def test_missing_buckets_and_refused_credentials_are_typed_errors_without_the_secret(s3):
    server, url, _, _ = s3
    with pytest.raises(brand.NotFoundError, match="bucket nobkt does not exist"):
        brand.Loader("s3://nobkt/ds", **CFG)
    with pytest.raises(brand.NotFoundError, match="nothing under this prefix"):
        brand.Loader("s3://bkt/nope", **CFG)
    os.environ["AWS_SECRET_ACCESS_KEY"] = "wrong-PLUGH"
    try:
        with pytest.raises(brand.BrandError) as e:
            brand.Loader(url, **CFG)
        assert "access refused" in str(e.value) and "PLUGH" not in str(e.value)
    finally:
        os.environ["AWS_SECRET_ACCESS_KEY"] = server.env["AWS_SECRET_ACCESS_KEY"]


def write_shard(path: pathlib.Path, first: int, count: int) -> None:
    """A WebDataset shard of `count` samples: KEY.bin payload, KEY.cls label."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for i in range(first, first + count):
            for ext, data in (("bin", bytes([i % 251]) * (100 + i)), ("cls", str(i % 5).encode())):
                info = tarfile.TarInfo(f"s{i:05d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_brand_pack_reads_its_inputs_from_a_bucket_as_from_local_files(s3, tmp_path):
    server, _, _, _ = s3
    local = tmp_path / "shards"
    local.mkdir()
    write_shard(local / "shard-000.tar", 0, 40)
    write_shard(local / "shard-001.tar", 40, 25)
    # Into the bucket: s3s-fs serves the files of its directory as objects (an
    # entity tag computed per request; small shards, so that costs nothing).
    store = pathlib.Path(server.root) / "store" / "bkt" / "shards"
    store.mkdir(parents=True)
    for f in local.iterdir():
        (store / f.name).write_bytes(f.read_bytes())
    options = dict(source="tar", field="bin", label="cls", chunk_size=8, seed=3)
    from_bucket = brand.pack(["s3://bkt/shards/"], tmp_path / "from-bucket", **options)
    from_disk = brand.pack([local], tmp_path / "from-disk", **options)
    assert from_bucket.samples == from_disk.samples == 65
    for name in ["index.bin", "data-00000.brd"]:
        assert (tmp_path / "from-bucket" / name).read_bytes() == (tmp_path / "from-disk" / name).read_bytes(), name
    with pytest.raises(brand.NotFoundError, match="s3://bkt/no-such-shards"):
        brand.pack(["s3://bkt/no-such-shards/"], tmp_path / "none", **options)
    assert not (tmp_path / "none").exists()
