"""brand.tf: brand's loader as a TensorFlow ``tf.data`` dataset.

    import brand.tf
    ds = brand.tf.BrandDataset("/data/imagenet.brand", batch_size=256, epochs=90)
    for batch in ds:            # {"data": string[n], "label": int64[n], "id": int64[n], "key": string[n]}
        ...

``BrandDataset`` is a real ``tf.data.Dataset`` backed by the C++ op
``BrandDataset`` (tf-op/src/brand_dataset_op.cc in brand's repository), which
drives brand's C ABI: it works with ``map``/``batch``/``prefetch``/``Options``,
inside ``tf.function``, serializes to a graph, has a known cardinality,
checkpoints its iterator with ``tf.train.Checkpoint`` (symbolic checkpointing
included), shards across input pipelines (``dataset_fn``), and resumes on
another number of ranks or nodes (``saved_state`` + ``resume_world``).

The op is compiled against the installed TensorFlow the first time it is
needed (about half a minute, needs g++ and TensorFlow's headers, which the
PyPI wheels ship) or ahead of time by ``python -m brand.tf build``, and
cached per TensorFlow version (see ``brand.tf._build``).
"""

import json
import os

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops

import brand
from brand.tf._build import Build, BuildError

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

__all__ = ["BrandDataset", "BuildError", "dataset_fn", "element_spec", "load_ops", "saved_state"]

_ops = None


def load_ops(build: bool = True):
    """The loaded op module, compiled first if the cache has none for this
    TensorFlow (``build=False``: raise ``BuildError`` instead)."""
    global _ops
    if _ops is None:
        b = Build(tf)
        if not b.library.is_file() and not build:
            raise BuildError(f"brand.tf: no op library for {b.describe()} at {b.library}: python -m brand.tf build")
        library = b.build()
        try:
            _ops = tf.load_op_library(str(library))
        except tf.errors.NotFoundError as e:
            raise BuildError(
                f"brand.tf: the op library {library} (built for TensorFlow {_built_for(library)}) does not load "
                f"into TensorFlow {tf.__version__} ({e}); rebuild it with python -m brand.tf build --force"
            ) from e
    return _ops


def _built_for(library):
    """The TensorFlow version the build recorded next to `library`."""
    try:
        return json.loads((library.parent / "build.json").read_text())["tf_version"]
    except (OSError, ValueError, KeyError, TypeError):
        return "an unrecorded version"


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
        if tomllib is None:
            raise tf.errors.InvalidArgumentError(None, None, "brand.tf's config= needs Python 3.11 (tomllib)")
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
      policy: brand, brand-random, direct, chunk-shuffle, sequential or tiered.
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
      resume_world: elastic resume: the brand states (bytes, from
        `saved_state`) of EVERY rank or node of a run with another number of
        them, all saved after the same number of batches. This dataset's
        iterators then start where that run stopped, as rank `rank` of the
        new world: together the new ranks serve the rest of that epoch's
        global order, every sample once, then the later epochs. The total
        memory (world x memory per rank) must be the saved run's, and
        `epoch`/`epochs` are those of the saved run. A restore of an iterator
        checkpoint (`tf.train.Checkpoint`) still wins over this.
      splits: under tf.data service's dynamic sharding
        (`processing_mode="distributed_epoch"`, `ShardingPolicy.DYNAMIC`),
        how many splits each epoch is cut into; None: one per 256 samples,
        1 to 64. Split k of S is what rank k of a world of S would serve of
        that epoch under brand's plan, so the splits hold every sample once;
        each costs the worker a round trip to the dispatcher and a loader
        open (which plans the epoch), so keep them coarse: S of about 8 per
        worker. The config must then not set `rank`, `world` or `nodes`.
        Under DYNAMIC `.repeat()` gives new epochs (each repetition the
        next `epochs` epochs), unlike without the service. See
        `brand.tf.service` and docs/DESIGN.md (tf.data service).

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
        resume_world=None,
        splits=None,
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
        if splits is not None and (not isinstance(splits, int) or isinstance(splits, bool) or not 1 <= splits <= 65536):
            raise tf.errors.InvalidArgumentError(None, None, f"splits must be an integer in 1..=65536, not {splits!r}")
        if resume_world is not None:
            resume_world = list(resume_world)
            if not resume_world or not all(isinstance(b, bytes) for b in resume_world):
                raise tf.errors.InvalidArgumentError(
                    None, None, "resume_world must be a non-empty list of brand states (bytes, from saved_state)"
                )
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
            resume_world=tf.constant(resume_world or [], tf.string, shape=[len(resume_world or [])]),
            splits=tf.convert_to_tensor(splits or 0, tf.int64),
        )
        super().__init__(variant)

    @property
    def element_spec(self):
        return self._structure

    @property
    def config(self):
        """The loader TOML this dataset was opened with."""
        return self._config


def saved_state(checkpoint, key="iterator"):
    """The brand state (bytes) of the ``BrandDataset`` iterator saved in a
    ``tf.train.Checkpoint`` (a checkpoint prefix, or a directory: its latest
    checkpoint), where the iterator was the checkpoint's attribute ``key``.
    Gather it from every rank or node of a run and give the list to
    ``BrandDataset(..., resume_world=states)`` to continue on another number
    of them. The iterator must have been saved between brand batches
    (``batch_size`` set), as an elastic resume needs every rank at one step."""
    prefix = os.fspath(checkpoint)
    if os.path.isdir(prefix):
        latest = tf.train.latest_checkpoint(prefix)
        if latest is None:
            raise brand.NotFoundError(f"no checkpoint in {prefix}")
        prefix = latest
    name = f"{key}/.ATTRIBUTES/ITERATOR_STATE"
    try:
        (state,) = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name], shape_and_slices=[""],
                                        dtypes=[tf.variant])
    except tf.errors.NotFoundError as e:
        raise brand.NotFoundError(f"checkpoint {prefix}: no iterator saved as {key!r} ({e.message})") from e
    states, positions, done = load_ops().brand_saved_state(state)
    where = f"checkpoint {prefix}, iterator {key!r}"
    if len(states) == 0:
        raise brand.InvalidStateError(f"{where}: no BrandDataset iterator state in it")
    if len(states) > 1:
        raise brand.InvalidStateError(f"{where}: {len(states)} BrandDataset iterators in one pipeline")
    if int(done[0]):
        raise brand.InvalidStateError(f"{where}: the iterator had emitted all its epochs; nothing to resume")
    if int(positions[0]) != 0:
        raise brand.StateMismatchError(
            f"{where}: saved inside a brand batch ({int(positions[0])} of its samples emitted one by one): an "
            "elastic resume needs every rank between batches (give BrandDataset a batch_size)"
        )
    blob = states[0].numpy()
    if not blob:
        raise brand.InvalidStateError(f"{where}: saved before its first element; start afresh instead")
    return blob


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
