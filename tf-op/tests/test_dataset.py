"""BrandDataset against real TensorFlow: contents, epochs, tf.data integration,
graph serialization, checkpoints, sharding and errors."""

import re

import pytest
import tensorflow as tf

from brand.tf import BrandDataset, dataset_fn
from conftest import SAMPLES, brand, make_dataset


def ids_of(ds):
    """Every id the dataset yields, in order (per-sample or batched)."""
    out = []
    for el in ds:
        out.extend(el["id"].numpy().reshape(-1).tolist())
    return out


def label_of_key(key):
    # brand gen writes class-CCCC/sample-N.bin; pack labels classes by sorted name.
    return int(re.search(rb"class-(\d+)", key).group(1))


# ---------------------------------------------------------------- contents


def test_elements_are_brand_cat_bytes_once_per_epoch(small_ds, small_bytes):
    ds = BrandDataset(small_ds)
    assert ds.element_spec["data"] == tf.TensorSpec([], tf.string)
    seen = []
    for el in ds:
        i = int(el["id"])
        assert el["data"].numpy() == small_bytes[i], f"sample {i}"
        assert int(el["label"]) == label_of_key(el["key"].numpy())
        seen.append(i)
    assert sorted(seen) == list(range(SAMPLES))
    # A shuffled order, not the packed one.
    assert seen != sorted(seen)


def test_batched_yields_whole_batches(small_ds, small_bytes):
    ds = BrandDataset(small_ds, batch_size=32)
    assert ds.element_spec["data"] == tf.TensorSpec([None], tf.string)
    sizes, seen = [], []
    for el in ds:
        n = int(tf.size(el["id"]))
        assert [int(tf.size(el[k])) for k in ("data", "key", "label")] == [n] * 3
        for i, data, label, key in zip(el["id"].numpy(), el["data"].numpy(), el["label"].numpy(), el["key"].numpy()):
            assert data == small_bytes[int(i)]
            assert label == label_of_key(key)
        sizes.append(n)
        seen.extend(el["id"].numpy().tolist())
    assert sizes == [32] * (SAMPLES // 32) + [SAMPLES % 32]
    assert sorted(seen) == list(range(SAMPLES))
    # Same plan, same order, whatever the batching.
    assert seen == ids_of(BrandDataset(small_ds))


def test_epochs_each_have_their_own_order(small_ds):
    ds = BrandDataset(small_ds, epochs=3)
    ids = ids_of(ds)
    assert len(ids) == 3 * SAMPLES
    epochs = [ids[k * SAMPLES:(k + 1) * SAMPLES] for k in range(3)]
    for e in epochs:
        assert sorted(e) == list(range(SAMPLES))
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2] and epochs[0] != epochs[2]
    # `epoch` starts later in the same sequence of epochs.
    assert ids_of(BrandDataset(small_ds, epoch=1, epochs=2)) == epochs[1] + epochs[2]
    # .repeat() replays one epoch, which is why `epochs` exists.
    assert ids_of(BrandDataset(small_ds).repeat(2)) == epochs[0] + epochs[0]
    # Another seed, another order.
    assert ids_of(BrandDataset(small_ds, seed=7)) != epochs[0]


def test_batched_epochs_never_share_a_batch(small_ds):
    ds = BrandDataset(small_ds, batch_size=64, epochs=2)
    sizes = [int(tf.size(el["id"])) for el in ds]
    per_epoch = [64, 64, 64, SAMPLES - 192]
    assert sizes == per_epoch * 2


@pytest.mark.parametrize(
    "kw, expected",
    [
        ({}, SAMPLES),
        ({"epochs": 3}, 3 * SAMPLES),
        ({"batch_size": 32, "epochs": 2}, 2 * 7),  # 6 full + 1 partial batch per epoch
        ({"batch_size": 50}, 4),
        ({"epochs": 0}, 0),
        ({"epochs": None}, tf.data.INFINITE_CARDINALITY),
        ({"world": 2, "rank": 1, "batch_size": 32}, 4),  # 100 samples per rank
    ],
)
def test_cardinality(small_ds, kw, expected):
    ds = BrandDataset(small_ds, **kw)
    assert int(ds.cardinality()) == expected
    if expected >= 0:
        assert sum(1 for _ in ds) == expected


def test_endless_epochs(small_ds):
    ids = ids_of(BrandDataset(small_ds, epochs=None).take(2 * SAMPLES + 5))
    assert ids == ids_of(BrandDataset(small_ds, epochs=3))[: 2 * SAMPLES + 5]


# ---------------------------------------------------------------- tf.data


def test_map_batch_prefetch_options(small_ds, small_bytes):
    opts = tf.data.Options()
    opts.autotune.enabled = True
    opts.experimental_optimization.map_parallelization = True
    opts.threading.private_threadpool_size = 2
    ds = (
        BrandDataset(small_ds)
        .map(lambda el: (el["id"], tf.strings.length(el["data"], unit="BYTE")), num_parallel_calls=tf.data.AUTOTUNE)
        .batch(16)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(opts)
    )
    got = {}
    for ids, lens in ds:
        got.update(zip(ids.numpy().tolist(), lens.numpy().tolist()))
    assert got == {i: len(b) for i, b in small_bytes.items()}


def test_inside_tf_function(small_ds):
    @tf.function
    def total(ds):
        acc = tf.constant(0, tf.int64)
        for el in ds:
            acc += tf.reduce_sum(el["id"]) + tf.reduce_sum(el["label"]) * 0
        return acc

    want = SAMPLES * (SAMPLES - 1) // 2
    assert int(total(BrandDataset(small_ds, batch_size=16))) == want

    @tf.function
    def built_inside():
        # The dataset made in the graph: the op's kernel runs at call time.
        ds = BrandDataset(str(small_ds), epochs=2)
        return ds.reduce(tf.constant(0, tf.int64), lambda acc, el: acc + el["id"])

    assert int(built_inside()) == 2 * want


def test_graph_serialization_round_trip(small_ds):
    ds = BrandDataset(small_ds, batch_size=32, seed=3, epoch=1)
    graph_def = tf.raw_ops.DatasetToGraphV2(input_dataset=ds._variant_tensor)
    parsed = tf.compat.v1.GraphDef.FromString(graph_def.numpy())
    assert "BrandDataset" in [n.op for n in parsed.node]
    variant = tf.raw_ops.DatasetFromGraph(graph_def=graph_def)
    rebuilt = tf.data.experimental.from_variant(variant, structure=ds.element_spec)
    assert ids_of(rebuilt) == ids_of(ds)


def test_save_and_load(small_ds, tmp_path):
    ds = BrandDataset(small_ds, batch_size=40)
    ds.save(str(tmp_path / "saved"))
    loaded = tf.data.Dataset.load(str(tmp_path / "saved"))
    assert ids_of(loaded) == ids_of(ds)


# ---------------------------------------------------------------- checkpoints


def resume(ds, take, tmp_path, symbolic, name):
    """(what a fresh iterator restored after `take` elements yields, what the
    original iterator yielded after the save)."""
    opts = tf.data.Options()
    opts.experimental_symbolic_checkpoint = symbolic
    ds = ds.with_options(opts)
    it = iter(ds)
    for _ in range(take):
        next(it)
    path = tf.train.Checkpoint(it=it).save(str(tmp_path / name))
    rest = [el["id"].numpy().reshape(-1).tolist() for el in it]
    fresh = iter(ds)
    tf.train.Checkpoint(it=fresh).restore(path).assert_consumed()
    restored = [el["id"].numpy().reshape(-1).tolist() for el in fresh]
    return restored, rest


@pytest.mark.parametrize("symbolic", [False, True], ids=["plain", "symbolic"])
@pytest.mark.parametrize(
    "kw, take",
    [
        ({}, 37),  # per-sample, mid-way through one of brand's internal batches
        ({}, 0),
        ({"batch_size": 32}, 3),
        ({"epochs": 2}, SAMPLES + 11),  # in the second epoch
        ({"batch_size": 32, "epochs": 2}, 7),  # at the epoch boundary
        ({"epochs": 2, "config": "batch_size = 8"}, 13),  # config's batch_size makes it batched
    ],
)
def test_checkpoint_resumes_exactly(small_ds, tmp_path, symbolic, kw, take):
    restored, rest = resume(BrandDataset(small_ds, **kw), take, tmp_path, symbolic, "ckpt")
    assert restored == rest
    full = ids_of(BrandDataset(small_ds, **kw))
    assert sum(restored, []) == full[len(full) - len(sum(rest, [])):]
    assert len(rest) == int(BrandDataset(small_ds, **kw).cardinality()) - take


@pytest.mark.parametrize("symbolic", [False, True], ids=["plain", "symbolic"])
def test_checkpoint_with_prefetch_resumes_after_what_was_consumed(small_ds, tmp_path, symbolic):
    ds = BrandDataset(small_ds).map(lambda el: el).prefetch(8)
    restored, rest = resume(ds, 50, tmp_path, symbolic, "pf")
    assert restored == rest and len(rest) == SAMPLES - 50


@pytest.mark.parametrize("symbolic", [False, True], ids=["plain", "symbolic"])
def test_checkpoint_at_the_end_stays_at_the_end(small_ds, tmp_path, symbolic):
    # After the last batch (end not yet seen), and after the end was seen.
    restored, rest = resume(BrandDataset(small_ds, batch_size=64, epochs=2), 8, tmp_path, symbolic, "last")
    assert restored == rest == []
    opts = tf.data.Options()
    opts.experimental_symbolic_checkpoint = symbolic
    ds = BrandDataset(small_ds, batch_size=64, epochs=2).with_options(opts)
    it = iter(ds)
    assert len(list(it)) == 8
    path = tf.train.Checkpoint(it=it).save(str(tmp_path / "done"))
    fresh = iter(ds)
    tf.train.Checkpoint(it=fresh).restore(path)
    assert list(fresh) == []


def test_checkpoint_of_another_dataset_is_refused(small_ds, tmp_path):
    it = iter(BrandDataset(small_ds, seed=1))
    next(it)
    path = tf.train.Checkpoint(it=it).save(str(tmp_path / "seed1"))
    other = iter(BrandDataset(small_ds, seed=2))
    with pytest.raises(tf.errors.FailedPreconditionError, match=r"seed 1 in the state, 2 now.*BRAND_ERR_STATE_MISMATCH"):
        tf.train.Checkpoint(it=other).restore(path)


# ---------------------------------------------------------------- sharding


def test_two_input_pipelines_split_each_epoch(small_ds):
    fn = dataset_fn(small_ds, global_batch_size=20, epochs=2)
    shards = []
    for pipeline in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
        ds = fn(ctx)
        assert ds.element_spec["id"].shape.as_list() == [None]
        batches = [el["id"].numpy().tolist() for el in ds]
        assert {len(b) for b in batches} == {10}  # per-replica batch of the global 20
        shards.append(sum(batches, []))
    for epoch in range(2):
        a = shards[0][epoch * 100:(epoch + 1) * 100]
        b = shards[1][epoch * 100:(epoch + 1) * 100]
        assert len(a) == len(b) == SAMPLES // 2
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(SAMPLES))


def test_distribute_datasets_from_function(small_ds):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    dist = strategy.distribute_datasets_from_function(dataset_fn(small_ds, global_batch_size=50))
    seen = []
    for el in dist:
        seen.extend(strategy.experimental_local_results(el["id"])[0].numpy().tolist())
    assert sorted(seen) == list(range(SAMPLES))


# ---------------------------------------------------------------- errors


def test_corrupt_record_is_data_loss_naming_chunk_and_offset(tmp_path):
    ds_dir = make_dataset(tmp_path, 64, seed=5)
    # Find sample 10's bytes in the segment (no Python reader of the format
    # needed) and flip one in its middle: padding between chunks would not
    # be noticed.
    seg = ds_dir / "data-00000.brd"
    raw = bytearray(seg.read_bytes())
    sample = brand("cat", ds_dir, 10)
    at = raw.find(sample)
    assert at > 0 and raw.find(sample, at + 1) == -1
    raw[at + len(sample) // 2] ^= 0xFF
    seg.write_bytes(bytes(raw))
    ds = BrandDataset(ds_dir, batch_size=8, memory="50%")
    with pytest.raises(tf.errors.DataLossError) as e:
        for _ in ds:
            pass
    msg = str(e.value)
    # Chunk 0 holds samples 0..16; brand names the record's byte offset in the segment.
    assert f"data-00000.brd: chunk 0 at byte {at}, sample 10: crc32c mismatch" in msg, msg
    assert "BRAND_ERR_CORRUPT" in msg


def test_bad_path_is_not_found(tmp_path):
    with pytest.raises(tf.errors.NotFoundError, match="no-such-dataset"):
        BrandDataset(tmp_path / "no-such-dataset")


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"policy": "lru"}, "lru"),
        ({"memory": "lots"}, "lots"),
        ({"config": "bogus = 1"}, "bogus"),
        ({"rank": 2, "world": 2}, "rank 2"),
        ({"config": "batch_size = ["}, "TOML"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_config_is_invalid_argument(small_ds, kw, word):
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(word)):
        BrandDataset(small_ds, **kw)


def test_error_inside_tf_function_is_the_same_class(tmp_path):
    @tf.function
    def count():
        return BrandDataset(str(tmp_path / "missing")).reduce(tf.constant(0, tf.int64), lambda a, _: a + 1)

    with pytest.raises(tf.errors.NotFoundError, match="missing"):
        count()


# ---------------------------------------------------------------- metadata and cancellation


def test_making_the_dataset_reads_metadata_only(tmp_path):
    # The epoch length (cardinality) comes from manifest.toml and index.bin:
    # without its segment file the dataset is still made; reading fails.
    ds_dir = make_dataset(tmp_path, 40, seed=4)
    (ds_dir / "data-00000.brd").unlink()
    ds = BrandDataset(ds_dir, epochs=2)
    assert int(ds.cardinality()) == 80
    with pytest.raises((tf.errors.NotFoundError, tf.errors.UnavailableError), match="data-00000.brd"):
        next(iter(ds))


def test_a_cancelled_prefetching_iterator_stops(small_ds):
    # Deleting an iterator whose prefetch thread is reading cancels it: the
    # loader is closed from the cancellation callback (no lock, no double
    # close with the iterator's own), the iterator goes away without waiting
    # for the endless input, and a new one works.
    import gc
    import time

    for _ in range(3):
        it = iter(BrandDataset(small_ds, epochs=None, batch_size=8).prefetch(16))
        next(it)
        start = time.monotonic()
        del it
        gc.collect()
        assert time.monotonic() - start < 10
    assert len(ids_of(BrandDataset(small_ds))) == SAMPLES
