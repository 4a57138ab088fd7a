"""brand for Ray Data: ``read_brand``, a ``ray.data.Dataset`` over a brand
dataset whose every execution is one epoch.

::

    import ray, brand.ray

    ds = brand.ray.read_brand("/data/ds.brand", seed=1, memory="10%")
    for epoch in range(3):
        for batch in ds.iter_batches(batch_size=256):   # one epoch per pass
            ...                                         # batch["data"]: the samples' bytes

    # Ray Train: each worker gets disjoint samples, all of them per epoch.
    splits = ds.streaming_split(2)

Rows have the columns ``id`` (int64: the sample's index in the dataset),
``data`` (binary: its original bytes), ``label`` (int64, -1 for none) and
``key`` (string: its name in the source it was packed from).

**Epochs.** Each execution of the dataset (an ``iter_batches`` pass, a
``streaming_split`` epoch, ``materialize()``) serves every sample exactly
once, in an order that is a function of ``(seed, epoch)``; the epoch is
``first_epoch`` plus the number of executions of this dataset that finished
before (Ray's own count, the one its file shuffles use), so a new execution
is a new order and a new run with the same seed repeats them. Pass
``epoch=E`` to pin every execution to epoch ``E``.

**Read tasks.** An execution is cut into ``tasks`` read tasks: task ``r``
serves what rank ``r`` of a brand world of ``tasks`` ranks serves (brand's
plan, which gives each sample to exactly one rank; the one padding repeat a
rank may end on, when ``tasks`` does not divide the dataset, is left out),
each reading whole chunks within its ``memory``. ``tasks`` defaults to
Ray's requested parallelism, bounded so that each task has at least
``min_task_samples`` samples. Ray places and retries the tasks: a task that
failed and is retried serves its rank's samples again from the start, so a
retried task's rows can appear twice within one execution (Ray documents no
exactly-once contract for retries). Within a task the order is brand's;
Ray's streaming executor interleaves tasks' blocks.

What Ray's object store adds is outside brand's ``memory`` bound: blocks
wait there until consumed (Ray's ``DataContext`` bounds it). ``config`` is
brand's configuration as keywords, as ``brand.Loader`` takes them, except
``rank`` and ``world`` (the read tasks are the ranks).
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional

import pyarrow as pa
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

import brand

__all__ = ["BrandDatasource", "read_brand"]

# Rows of a task's blocks: Ray's default target block size is 128 MiB; a
# block is cut at this many bytes of samples, after a whole brand batch.
_BLOCK_BYTES = 32 << 20

SCHEMA = pa.schema([("id", pa.int64()), ("data", pa.binary()), ("label", pa.int64()), ("key", pa.string())])


def _real_samples(samples: int, rank: int, world: int) -> int:
    """The samples rank ``rank`` of ``world`` serves that are not padding.

    brand's plan (docs/DESIGN.md, "Steps") gives rank ``r`` the epoch's
    positions ``r, r + world, …`` up to ``world × ⌈N/world⌉``; positions at
    or past ``N`` repeat earlier samples. So the real ones are the positions
    below ``N``, and the repeat, if any, is the rank's last serve."""
    return max(0, -(-(samples - rank) // world))


class BrandDatasource(Datasource):
    """A ``ray.data.Datasource`` over the brand dataset at ``path``: see
    ``help(brand.ray)``. Use ``read_brand`` unless you need the datasource
    itself (``ray.data.read_datasource(BrandDatasource(...))``)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        seed: int = 0,
        epoch: Optional[int] = None,
        first_epoch: int = 0,
        min_task_samples: int = 1024,
        **config: Any,
    ) -> None:
        super().__init__()
        for name in ("rank", "world", "nodes"):
            if name in config:
                raise brand.ConfigError(
                    f"brand.ray: {name}= is not taken: the read tasks are the ranks of one brand world"
                )
        if min_task_samples < 1:
            raise brand.ConfigError(f"brand.ray: min_task_samples={min_task_samples}: must be at least 1")
        self._path = os.fspath(path)
        self._seed = int(seed)
        self._epoch = None if epoch is None else int(epoch)
        self._first_epoch = int(first_epoch)
        self._min_task_samples = int(min_task_samples)
        self._config = dict(config)
        # Opening checks the path, the configuration and the credentials
        # here, on the driver, rather than in the first read task.
        with brand.Loader(self._path, seed=self._seed, **self._config) as probe:
            self._samples = int(probe.epoch_len)
        # Executions planned by this object, for a Ray without the count.
        self._planned = 0

    def get_name(self) -> str:
        return "Brand"

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return None

    def _epoch_of(self, data_context: Any) -> int:
        if self._epoch is not None:
            return self._epoch
        # Ray counts finished executions in its DataContext (private, used
        # by its own per-execution file shuffles); without it, count here.
        executions = getattr(data_context, "_execution_idx", None)
        if not isinstance(executions, int):
            executions = self._planned
        return self._first_epoch + executions

    def tasks_for(self, parallelism: int) -> int:
        """How many read tasks (brand ranks) an execution is cut into."""
        most = max(1, self._samples // self._min_task_samples)
        return max(1, min(int(parallelism), most, self._samples))

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: Optional[int] = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        epoch = self._epoch_of(data_context)
        self._planned += 1
        world = self.tasks_for(parallelism)
        path, seed, config = self._path, self._seed, self._config
        tasks = []
        for rank in range(world):
            rows = _real_samples(self._samples, rank, world)

            def read(rank: int = rank, rows: int = rows) -> Iterator[pa.Table]:
                return _read_rank(path, seed, epoch, rank, world, rows, config)

            meta = BlockMetadata(num_rows=rows, size_bytes=None, input_files=None, exec_stats=None)
            tasks.append(ReadTask(read, meta, schema=SCHEMA, per_task_row_limit=per_task_row_limit))
        return tasks


def _read_rank(
    path: str, seed: int, epoch: int, rank: int, world: int, rows: int, config: dict
) -> Iterator[pa.Table]:
    """Rank ``rank``'s samples of ``epoch`` as Arrow tables (a read task)."""
    left = rows
    ids: list[int] = []
    data: list[bytes] = []
    labels: list[int] = []
    keys: list[str] = []
    held = 0
    with brand.Loader(path, seed=seed, rank=rank, world=world, **config) as loader:
        loader.start_epoch(epoch)
        # A read task reads one epoch: nothing ahead into the next.
        loader.set_last_epoch(epoch)
        for batch in loader:
            n = min(len(batch), left)
            ids.extend(batch.ids[:n].tolist())
            labels.extend(batch.labels[:n].tolist())
            keys.extend(batch.keys[:n])
            for arr in batch.samples[:n]:
                data.append(arr.tobytes())
                held += arr.nbytes
            left -= n
            if held >= _BLOCK_BYTES or left == 0:
                yield pa.table([ids, data, labels, keys], schema=SCHEMA)
                ids, data, labels, keys, held = [], [], [], [], 0
            if left == 0:
                return
    if ids:
        yield pa.table([ids, data, labels, keys], schema=SCHEMA)
    if left:
        raise brand.InvalidStateError(
            f"{path}: rank {rank} of {world} ended epoch {epoch} after {rows - left} of its {rows} samples"
        )


def read_brand(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    epoch: Optional[int] = None,
    first_epoch: int = 0,
    tasks: Optional[int] = None,
    min_task_samples: int = 1024,
    **config: Any,
) -> "ray.data.Dataset":
    """A ``ray.data.Dataset`` of the brand dataset at ``path`` (a directory
    or a URL), one epoch per execution: see ``help(brand.ray)``.

    ``seed`` and the epoch fix the order; ``epoch`` pins every execution to
    one epoch (default: ``first_epoch`` plus the executions finished so
    far). ``tasks`` is the number of read tasks (default: Ray's parallelism,
    bounded so that each has at least ``min_task_samples`` samples). ``config``: brand's
    configuration as keywords (``memory``, ``batch_size``, ``readahead``, …),
    without ``rank``/``world``. Raises ``brand.BrandError`` subclasses for a
    dataset that cannot be opened (``NotFoundError``, ``ConfigError``, …).
    """
    if tasks is not None and tasks < 1:
        raise brand.ConfigError(f"brand.ray: tasks={tasks}: must be at least 1")
    # Tasks asked for are not bounded by min_task_samples (only by the samples).
    least = 1 if tasks is not None else min_task_samples
    source = BrandDatasource(path, seed=seed, epoch=epoch, first_epoch=first_epoch, min_task_samples=least, **config)
    return ray.data.read_datasource(source, override_num_blocks=tasks)
