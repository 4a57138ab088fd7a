"""brand.grain.BrandIterDataset against the real Grain: every sample once per
epoch with its bytes, zero copy, get_state/set_state resuming exactly (also
through Grain transformations chained after it), and Grain's worker
processes sharing the process's memory."""

import json

import grain
import numpy as np
import pytest
from absl import flags

# With JAX installed, Grain's multiprocessing reads one of its absl flags
# (worker profiling), which absl refuses before flags are parsed; programs run
# under absl.app have them parsed, a test process has not.
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()

import brand
from brand.grain import BrandIterDataset

from conftest import SAMPLES, source_bytes

CFG = dict(batch_size=16, memory="20%", seed=11, io_backend="threads")
# 64 slots: 32 for each of 2 workers (two batches and two chunks).
MP_CFG = dict(batch_size=8, memory="64 slots", seed=11, io_backend="threads")


def test_is_a_grain_iter_dataset_serving_every_sample_once_per_epoch(dataset):
    files, ds_path = dataset
    ds = BrandIterDataset(ds_path, num_epochs=2, **CFG)
    assert isinstance(ds, grain.IterDataset)
    items = list(ds)
    assert len(items) == 2 * SAMPLES
    for epoch in (items[:SAMPLES], items[SAMPLES:]):
        assert sorted(it["id"] for it in epoch) == list(range(SAMPLES))
    for it in items[:20]:
        arr = it["data"]
        assert arr.dtype == np.uint8 and not arr.flags.owndata and arr.ctypes.data % 64 == 0
        assert isinstance(arr.base, brand.SampleBuffer)
        assert arr.tobytes() == source_bytes(files, it["key"])
    assert [it["id"] for it in items[:SAMPLES]] != [it["id"] for it in items[SAMPLES:]]


def test_first_epoch_and_batched_items(dataset):
    _, ds_path = dataset
    epoch1 = [it["id"] for it in BrandIterDataset(ds_path, num_epochs=2, **CFG)][SAMPLES:]
    batches = list(BrandIterDataset(ds_path, batched=True, first_epoch=1, **CFG))
    assert all(b["epoch"] == 1 for b in batches)
    assert [i for b in batches for i in b["id"].tolist()] == epoch1


def test_an_iterator_of_num_epochs_reads_nothing_of_the_epoch_after(dataset):
    _, ds_path = dataset
    cfg = dict(CFG, read_gap="whole", readahead=64 << 20)
    it = iter(BrandIterDataset(ds_path, batched=True, num_epochs=1, **cfg))
    served = [i for b in it for i in b["id"].tolist()]
    with brand.Loader(str(ds_path), **dict(cfg, readahead=0)) as alone:
        assert [i for b in alone for i in b.ids.tolist()] == served
        own = alone.metrics()["reads_issued"]
    # (Without the hint, 64 MiB of read-ahead reads on into epoch 1.)
    assert it._loader.metrics()["reads_issued"] == own


def ids(items):
    return [it["id"] if isinstance(it, dict) else it for it in items]


@pytest.mark.parametrize("cut", [0, 1, 15, 16, 17, 149, 150, 151, 299])
def test_set_state_resumes_exactly(dataset, cut):
    """Two epochs of 150 samples in batches of 16: cuts inside a batch, at its
    edges, at the epoch's end and just after."""
    _, ds_path = dataset
    ds = BrandIterDataset(ds_path, num_epochs=2, **CFG)
    whole = ids(ds)
    it = iter(ds)
    got = [next(it)["id"] for _ in range(cut)]
    state = json.loads(json.dumps(it.get_state()))
    fresh = iter(BrandIterDataset(ds_path, num_epochs=2, **dict(CFG, batch_size=16, queue_depth=2)))
    fresh.set_state(state)
    got += ids(fresh)
    assert got == whole


def test_state_survives_grain_transformations(dataset):
    _, ds_path = dataset
    pipeline = BrandIterDataset(ds_path, **CFG).map(lambda item: item["id"] * 10).batch(7)
    whole = [b.tolist() for b in pipeline]
    it = iter(pipeline)
    got = [next(it).tolist() for _ in range(5)]
    state = it.get_state()
    resumed = iter(BrandIterDataset(ds_path, **CFG).map(lambda item: item["id"] * 10).batch(7))
    resumed.set_state(state)
    got += [b.tolist() for b in resumed]
    assert got == whole


def test_a_state_that_is_not_brands_is_refused(dataset):
    _, ds_path = dataset
    it = iter(BrandIterDataset(ds_path, **CFG))
    with pytest.raises(brand.InvalidStateError):
        it.set_state({"something": 1})


def mp(ds, workers):
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))


def test_worker_processes_share_memory_and_serve_brands_global_order(dataset):
    """Two Grain worker processes: brand ranks 0 and 1 of 2 with 32 slots
    each, interleaved by Grain into the order one process serves."""
    _, ds_path = dataset
    alone = ids(BrandIterDataset(ds_path, **MP_CFG))
    pipeline = mp(BrandIterDataset(ds_path, **MP_CFG).map(lambda item: (item["id"], item["data"].size)), 2)
    it = iter(pipeline)
    try:
        got = [i for i, _ in it]
    finally:
        it.close()
    assert sorted(got) == list(range(SAMPLES))
    assert got == alone


def test_a_worker_is_a_brand_rank_with_its_share(dataset):
    _, ds_path = dataset
    ds = BrandIterDataset(ds_path, **MP_CFG)
    ds.set_slice(slice(1, None, 2))
    it = iter(ds)
    assert (it._loader.rank, it._loader.world) == (1, 2)
    state = it.get_state()
    assert brand._brand._saved_slots(state["brand"]) == 32
    assert ids(it) == ids(BrandIterDataset(ds_path, **MP_CFG))[1::2]
    # A slice of a slice: worker 1 of 2 within worker 1 of 2 is 3 of 4.
    ds.set_slice(slice(1, None, 2))
    assert (iter(ds)._loader.rank, iter(ds)._loader.world) == (3, 4)
    with pytest.raises(brand.ConfigError, match="sliced into workers only"):
        ds.set_slice(slice(0, 10, 2))


def test_a_budget_too_small_for_the_workers_is_refused(dataset):
    _, ds_path = dataset
    ds = BrandIterDataset(ds_path, **dict(MP_CFG, memory="40 slots"))
    ds.set_slice(slice(0, None, 4))
    with pytest.raises(brand.ConfigError, match=r"its 4 workers: 10 each.*\"64 slots\""):
        iter(ds)
