"""brand_tf: brand's loader as a TensorFlow `tf.data` dataset.

    import brand_tf
    ds = brand_tf.BrandDataset("/data/imagenet.brand", batch_size=256, epochs=90)
    for batch in ds:            # {"data": string[n], "label": int64[n], "id": int64[n], "key": string[n]}
        ...

`BrandDataset` is a real `tf.data.Dataset` backed by the C++ op `BrandDataset`
(tf-op/src/brand_dataset_op.cc), which drives brand's C ABI: it works with
`map`/`batch`/`prefetch`/`Options`, inside `tf.function`, serializes to a
graph, has a known cardinality, checkpoints its iterator with
`tf.train.Checkpoint` (symbolic checkpointing included), and shards across
input pipelines (`dataset_fn`).

The op is built against the installed TensorFlow by `python tf-op/build.py`;
it loads only into the TensorFlow major.minor it was built for.
"""

import os
import re
import tomllib

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops

__all__ = ["BrandDataset", "BuildMismatchError", "dataset_fn", "element_spec", "load_ops"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_SO = os.path.join(_HERE, "_brand_tf_ops.so")
_REBUILD = "rebuild with python tf-op/build.py"

_ops = None


class BuildMismatchError(ImportError):
    """The op library is missing or was built for another TensorFlow."""


def _major_minor(version):
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def load_ops():
    """The loaded op module; checks first that it was built for this TensorFlow.

    A .so built for another TF minor fails to load with an undefined-symbol
    error at best; the recorded build version turns that into a clear message.
    """
    global _ops
    try:
        from brand_tf import _build_info
    except ImportError:
        _build_info = None
    if _build_info is None or not os.path.exists(_SO):
        raise BuildMismatchError(f"brand_tf's op library {_SO} is not built: {_REBUILD}")
    built, running = _build_info.TF_VERSION, tf.__version__
    if _major_minor(built) != _major_minor(running):
        raise BuildMismatchError(
            f"brand_tf's op library was built for TensorFlow {built} but TensorFlow {running} "
            f"is running (an op loads only into the TF major.minor it was built for): {_REBUILD}"
        )
    if _ops is None:
        try:
            _ops = tf.load_op_library(_SO)
        except tf.errors.NotFoundError as e:
            raise BuildMismatchError(f"brand_tf's op library does not load ({e}): {_REBUILD}") from e
    return _ops


def element_spec(batched):
    """The element structure: scalars per sample, or vectors per batch."""
    shape = [None] if batched else []
    return {
        "data": tf.TensorSpec(shape, tf.string),
        "id": tf.TensorSpec(shape, tf.int64),
        "key": tf.TensorSpec(shape, tf.string),
        "label": tf.TensorSpec(shape, tf.int64),
    }


def _toml_value(v):
    if isinstance(v, (list, tuple)):
        # `nodes = ["host:port", ...]`
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        # A TOML basic string; escape what TOML requires.
        escaped = v.replace("\\", "\\\\").replace('"', '\\"')
        escaped = "".join(c if c >= " " and c != "\x7f" else f"\\u{ord(c):04x}" for c in escaped)
        return f'"{escaped}"'
    raise TypeError(f"config value {v!r}: expected bool, int, str or a list of them")


def _config_toml(settings):
    return "".join(f"{k} = {_toml_value(v)}\n" for k, v in settings.items() if v is not None)


def _merge_config(keywords, config):
    """The loader TOML: the keyword settings, overridden by `config`."""
    settings = dict(keywords)
    if config:
        try:
            extra = tomllib.loads(config)
        except tomllib.TOMLDecodeError as e:
            raise tf.errors.InvalidArgumentError(None, None, f"brand config is not valid TOML: {e}") from e
        settings.update(extra)
    return settings


class BrandDataset(dataset_ops.DatasetSource):
    """A brand dataset as a `tf.data.Dataset`.

    Args:
      path: a dataset directory made by `brand pack`.
      batch_size: None for one element per sample (scalars); N for one
        element per brand batch (vectors of up to N; the last batch of each
        epoch may be shorter, batches never span epochs). Whole batches are
        much cheaper than per-sample elements plus `.batch()`.
      memory: the loader's memory budget per input pipeline ("10%", "4GiB").
      policy: brand, brand-random, direct, chunk-shuffle or sequential.
      seed: the order's seed; with `epoch` it fixes every epoch's order.
      epoch: the first epoch to emit.
      epochs: how many consecutive epochs to emit, each in its own order
        (None: no end). To train for several epochs use this, not
        `.repeat()`: `.repeat()` replays the same epoch `epoch` (the same
        order) each time.
      read_gap: "auto", "whole" or a byte count such as "16KiB".
      rank, world: this input pipeline's share of each epoch (see
        `dataset_fn` for `tf.distribute`).
      config: loader TOML text; its keys override the keywords (any key
        `brand_open` accepts: drop_last, readahead, queue_depth, verify, ...).

    Multi-node: with `nodes = ["host:port", ...]` and `rank` in `config`, or
    with `TF_CONFIG` in the environment (a `tf.distribute` multi-worker job:
    the chief and workers are the nodes, brand listening on each one's
    TensorFlow port + `tf_port_offset`, default 1000), each worker's
    dataset is one node of a brand job: it reads only the chunks it owns
    and the workers together serve each epoch exactly once. Every worker
    must then iterate the same epochs; `rank`/`world` follow the node list.

    Elements are dicts {"data": tf.string, "label": tf.int64, "id": tf.int64,
    "key": tf.string}: the sample's bytes, its class (-1 if none), its
    position in the packed dataset, and its source key.

    Errors come back as `tf.errors`: a bad path `NotFoundError`, a bad
    config `InvalidArgumentError` (both when the dataset is made), a corrupt
    record `DataLossError` naming segment, chunk and offset (when read).
    """

    def __init__(
        self,
        path,
        *,
        batch_size=None,
        memory="10%",
        policy="brand",
        seed=0,
        epoch=0,
        epochs=1,
        read_gap="auto",
        rank=None,
        world=None,
        config=None,
    ):
        settings = _merge_config(
            {
                "batch_size": batch_size,
                "memory": memory,
                "policy": policy,
                "seed": seed,
                "rank": rank,
                "world": world,
                "read_gap": read_gap,
            },
            config,
        )
        batch = settings.get("batch_size")
        if batch is not None and (not isinstance(batch, int) or isinstance(batch, bool) or batch < 1):
            raise tf.errors.InvalidArgumentError(None, None, f"batch_size must be a positive integer, not {batch!r}")
        if epochs is not None and epochs < 0:
            raise tf.errors.InvalidArgumentError(None, None, f"epochs must be >= 0 or None, not {epochs!r}")
        self._path = path if tf.is_tensor(path) else os.fspath(path)
        self._config = _config_toml(settings)
        self._batch_size = batch
        self._structure = element_spec(batch is not None)
        variant = load_ops().brand_dataset(
            path=self._path,
            config=self._config,
            epoch=tf.convert_to_tensor(epoch, tf.int64),
            epochs=tf.convert_to_tensor(-1 if epochs is None else epochs, tf.int64),
            # 0: per-sample elements; the loader then reads in its default
            # batch size (or config's), which only sets how much is read at once.
            batch_size=tf.convert_to_tensor(batch or 0, tf.int64),
        )
        super().__init__(variant)

    @property
    def element_spec(self):
        return self._structure

    @property
    def config(self):
        """The loader TOML this dataset was opened with."""
        return self._config


def dataset_fn(path, *, global_batch_size=None, **kwargs):
    """A `(tf.distribute.InputContext) -> BrandDataset` for
    `strategy.distribute_datasets_from_function`.

    Each input pipeline reads its own share of every epoch: rank =
    `input_pipeline_id`, world = `num_input_pipelines`. With
    `global_batch_size` each pipeline's batch size is its per-replica share.
    Other keywords go to `BrandDataset`.

    Prefer this to `strategy.experimental_distribute_dataset(BrandDataset(...))`:
    tf.data's auto-sharding does not know brand's files, so it would fall
    back to having every worker read everything and keep every n-th element.
    """
    if "rank" in kwargs or "world" in kwargs:
        raise TypeError("dataset_fn sets rank and world from the InputContext")

    def make(input_context):
        kw = dict(kwargs)
        if global_batch_size is not None:
            kw["batch_size"] = input_context.get_per_replica_batch_size(global_batch_size)
        return BrandDataset(
            path,
            rank=input_context.input_pipeline_id,
            world=input_context.num_input_pipelines,
            **kw,
        )

    return make
