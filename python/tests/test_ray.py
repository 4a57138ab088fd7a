"""brand.ray against a real local Ray (ray.init(num_cpus=2), in a network
namespace of its own: ray_checks.py): every execution is one epoch with every
sample once, orders are f(seed, epoch), and streaming_split covers the
dataset."""

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

import brand
import brand.ray
from conftest import make_dataset, source_bytes

SAMPLES = 1001  # not a multiple of the read tasks: ranks end on padding
CHECKS = pathlib.Path(__file__).with_name("ray_checks.py")


@pytest.fixture(scope="module")
def ray_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("brand-ray"), samples=SAMPLES, seed=4)


@pytest.fixture(scope="module")
def observed(ray_dataset) -> dict:
    """What ray_checks.py saw, run once for the module."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("unshare (util-linux) and ip (iproute2) are needed to run Ray in a namespace of its own")
    _, path = ray_dataset
    cmd = f'ip link set lo up && exec "{sys.executable}" "{CHECKS}" "{path}" {SAMPLES}'
    try:
        run = subprocess.run(["unshare", "--net", "sh", "-c", cmd], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"Ray checks hung (300 s): {(e.stderr or b'')[-2000:]!r}")
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout)


def test_an_execution_is_every_sample_once_with_its_bytes_label_and_key(observed, ray_dataset):
    files, path = ray_dataset
    assert observed["schema"] == ["id", "data", "label", "key"]
    got = observed["rows"]
    assert sorted(r["id"] for r in got) == list(range(SAMPLES))
    with brand.Loader(path, batch_size=64) as loader:
        truth = {int(i): (k, int(lab)) for b in loader for i, k, lab in zip(b.ids, b.keys, b.labels)}
    for r in got:
        key, label = truth[r["id"]]
        assert (r["key"], r["label"]) == (key, label)
        assert bytes.fromhex(r["data"]) == source_bytes(files, key)


def test_each_execution_is_a_new_epoch_and_a_seed_repeats_them(observed, ray_dataset):
    _, path = ray_dataset
    orders = observed["orders"]
    for first, second in orders:
        assert sorted(first) == sorted(second) == list(range(SAMPLES))
        assert first != second, "the second execution served the first one's order"
    assert orders[0] == orders[1], "the same seed gave other orders"
    # With one task the order is brand's own: rank 0 of 1, epochs 0 and 1.
    for epoch, order in enumerate(orders[0]):
        with brand.Loader(path, seed=7, batch_size=32) as loader:
            loader.start_epoch(epoch)
            assert order == [int(i) for b in loader for i in b.ids]
    assert observed["pinned"] == orders[0][1]


def test_streaming_split_gives_every_sample_to_one_consumer(observed):
    assert not observed["split_hung"], "a streaming_split consumer hung"
    a, b = observed["split"]
    assert a and b, f"a consumer got nothing: {len(a)}, {len(b)}"
    assert sorted(a + b) == list(range(SAMPLES))


def test_read_tasks_are_sized_from_the_dataset(ray_dataset):
    _, path = ray_dataset
    source = brand.ray.BrandDatasource(path, min_task_samples=300)
    assert source.tasks_for(200) == SAMPLES // 300
    assert source.tasks_for(2) == 2
    tasks = source.get_read_tasks(3)
    assert [t.metadata.num_rows for t in tasks] == [334, 334, 333]


def test_bad_paths_and_arguments_are_brand_errors(tmp_path, ray_dataset):
    _, path = ray_dataset
    with pytest.raises(brand.NotFoundError, match="nowhere"):
        brand.ray.read_brand(tmp_path / "nowhere")
    with pytest.raises(brand.ConfigError, match="rank"):
        brand.ray.read_brand(path, rank=1)
    with pytest.raises(brand.ConfigError, match="tasks=0"):
        brand.ray.read_brand(path, tasks=0)
