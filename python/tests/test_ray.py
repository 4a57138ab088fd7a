"""brand.ray against a real local Ray (ray.init(num_cpus=2)): every execution
is one epoch with every sample once, orders are f(seed, epoch), and
streaming_split covers the dataset."""

import threading

import pytest
import ray

import brand
import brand.ray
from conftest import make_dataset, source_bytes

SAMPLES = 1001  # not a multiple of the read tasks: ranks end on padding


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    # No progress bars in the test output.
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("brand-ray"), samples=SAMPLES, seed=4)


def rows(ds) -> list[dict]:
    return [r for b in ds.iter_batches(batch_size=None, batch_format="pyarrow") for r in b.to_pylist()]


def test_an_execution_is_every_sample_once_with_its_bytes_label_and_key(local_ray, ray_dataset):
    files, path = ray_dataset
    ds = brand.ray.read_brand(path, seed=1, tasks=3, batch_size=32)
    assert ds.schema().names == ["id", "data", "label", "key"]
    got = rows(ds)
    assert sorted(r["id"] for r in got) == list(range(SAMPLES))
    with brand.Loader(path, batch_size=64) as loader:
        truth = {int(i): (k, int(lab)) for b in loader for i, k, lab in zip(b.ids, b.keys, b.labels)}
    for r in got:
        key, label = truth[r["id"]]
        assert (r["key"], r["label"]) == (key, label)
        assert r["data"] == source_bytes(files, key)


def test_each_execution_is_a_new_epoch_and_a_seed_repeats_them(local_ray, ray_dataset):
    _, path = ray_dataset
    orders = []
    for _ in range(2):
        ds = brand.ray.read_brand(path, seed=7, tasks=1, batch_size=32)
        first = [r["id"] for r in rows(ds)]
        second = [r["id"] for r in rows(ds)]
        assert sorted(first) == sorted(second) == list(range(SAMPLES))
        assert first != second, "the second execution served the first one's order"
        orders.append((first, second))
    assert orders[0] == orders[1], "the same seed gave other orders"
    # With one task the order is brand's own: rank 0 of 1, epochs 0 and 1.
    for epoch, order in enumerate(orders[0]):
        with brand.Loader(path, seed=7, batch_size=32) as loader:
            loader.start_epoch(epoch)
            assert order == [int(i) for b in loader for i in b.ids]
    pinned = brand.ray.read_brand(path, seed=7, tasks=1, epoch=1, batch_size=32)
    assert [r["id"] for r in rows(pinned)] == orders[0][1]


def test_streaming_split_gives_every_sample_to_one_consumer(local_ray, ray_dataset):
    _, path = ray_dataset
    ds = brand.ray.read_brand(path, seed=2, tasks=4, batch_size=16)
    seen: list[list[int]] = [[], []]

    def consume(i, it):
        for b in it.iter_batches(batch_size=None, batch_format="pyarrow"):
            seen[i].extend(b.column("id").to_pylist())

    # streaming_split's iterators must be consumed concurrently.
    threads = [threading.Thread(target=consume, args=(i, it)) for i, it in enumerate(ds.streaming_split(2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a streaming_split consumer hung"
    assert seen[0] and seen[1], f"a consumer got nothing: {len(seen[0])}, {len(seen[1])}"
    assert sorted(seen[0] + seen[1]) == list(range(SAMPLES))


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
