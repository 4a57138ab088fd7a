"""brand for Grain: ``BrandIterDataset``, a ``grain.IterDataset`` over a brand
dataset whose iterator checkpoints with ``get_state``/``set_state``.

::

    import grain, brand.grain

    ds = brand.grain.BrandIterDataset("/data/ds.brand", num_epochs=None,
                                      rank=jax.process_index(), world=jax.process_count(),
                                      memory="10%", seed=1)
    it = iter(ds.map(decode))
    for step, item in zip(range(steps), it):
        ...
    saved = it.get_state()          # a small dict; later: it.set_state(saved)

Items are ``{"data": numpy.uint8 array, "label": int, "id": int, "key":
str}``, the array a read-only view of brand's buffer (no copy; ``copy()``
it to write). With ``batched=True`` each item is one brand batch: ``{"data":
[arrays], "label": int64 array, "id": uint64 array, "key": [str], "epoch":
int}``.

An iterator yields the epochs ``first_epoch`` to ``first_epoch + num_epochs
- 1`` (``num_epochs=None``: without end), in brand's order: every sample
once per epoch on each rank (``rank``/``world`` keywords, as for
``brand.Loader``; in a JAX program of several processes they default to
``jax.process_index()``/``jax.process_count()``). Every rank serves the same
number of samples, ⌈N / world⌉ (the last one of a rank may repeat an
earlier sample, as ``DistributedSampler`` pads), or ⌊N / world⌋ with
``drop_last=True`` (the tail left out), so JAX processes in lockstep take the
same number of batches. Its state is exact to the sample and a fresh iterator of
the same dataset resumes from it, also after Grain transformations chained
after it (``map``, ``batch``, ...), whose iterators carry it in theirs.
Attached to a cache (``cache=...``), whose batches depend on timing, a state
inside a batch is that position (``Loader.state_dict(taken=)``); one saved
inside a batch by a loader alone raises ``InvalidStateError`` in ``set_state``
of an attached one.

Each iterator opens its own ``brand.Loader`` in the process that iterates
(brand reads and decodes on its own threads already). Under Grain's
multiprocess prefetch (``ds.mp_prefetch(grain.MultiprocessingOptions(
num_workers=k))``), Grain gives worker ``i`` of ``k`` its slice of the
dataset (``set_slice``): that worker is brand rank ``rank × k + i`` of ``world
× k``, and ``memory`` is the process's, shared by its ``k`` workers: each has
``⌊M / k⌋`` of the ``M`` slots ``memory`` gives (the rest, fewer than ``k``
samples, unused), so the workers hold at most ``memory`` (plus each one's
``readahead``) together, and the global order is the same for every ``k``
that divides ``M``. A share too small for one chunk and two batches is
fitted as in ``brand.torch`` (an internal batch shrinks, a percentage rounds
up with one warning); a budget in bytes or slots that cannot give every
worker one chunk (and, with ``batched=True``, two batches) raises
``ConfigError`` naming ``k`` and the least memory that would. Grain's interleaving of the ``k`` workers' items then follows brand's
global order, one item from each worker in turn; ``sequential_slice`` makes
no difference (brand's order is its own). Not for a node of a multi-node job
(``nodes``): one process is one node.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Optional

import grain

import brand

__all__ = ["BrandIterDataset", "BrandDatasetIterator"]

_STATE_VERSION = 1


class BrandIterDataset(grain.IterDataset):
    """A Grain ``IterDataset`` over the brand dataset at ``path``: see
    ``help(brand.grain)``.

    ``BrandIterDataset(path, batched=False, first_epoch=0, num_epochs=1,
    **config)``; ``config`` is brand's configuration as ``brand.Loader``
    takes it.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        batched: bool = False,
        first_epoch: int = 0,
        num_epochs: Optional[int] = 1,
        **config: Any,
    ) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.batched = batched
        self.first_epoch = int(first_epoch)
        self.num_epochs = num_epochs
        self.config = config
        # This copy's slice of the dataset (set_slice): worker `_worker` of
        # `_workers` (0 of 1: all of it).
        self._worker, self._workers = 0, 1

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Makes this dataset (a copy in one of Grain's worker processes)
        worker ``sl.start`` of ``sl.step``: a brand rank of its own with its
        share of ``memory`` (see ``help(brand.grain)``). A slice of a slice
        is one of ``step × step`` workers. ``sequential_slice`` makes no
        difference."""
        start, stop, step = sl.start or 0, sl.stop, sl.step or 1
        if stop is not None or step < 1 or not 0 <= start < step:
            raise brand.ConfigError(
                f"BrandIterDataset can be sliced into workers only (slice(i, None, k) with 0 <= i < k), not {sl}"
            )
        self._worker, self._workers = self._worker + self._workers * start, self._workers * step

    def _process_config(self) -> dict:
        """The configuration as given, with this JAX process's rank and world
        (``jax.process_index()``/``process_count()``) when neither was given
        and the program uses JAX (already imported: brand never imports it).
        Read when iteration starts, so after ``jax.distributed.initialize``."""
        jax = sys.modules.get("jax")
        if jax is None or "rank" in self.config or "world" in self.config:
            return self.config
        world = int(jax.process_count())
        if world == 1:
            return self.config
        return dict(self.config, rank=int(jax.process_index()), world=world)

    def _loader_config(self) -> dict:
        """brand.Loader's keywords for this worker: its rank, world and share
        of memory and of readahead (the configuration as given without workers)."""
        config = self._process_config()
        k = self._workers
        if k == 1:
            return config
        share = brand._brand._worker_memory(self.path, k, self.batched, **config)
        if share["rounded_up"] and self._worker == 0:
            warnings.warn(share["rounded_up"], stacklevel=3)
        return dict(config, rank=share["rank"] * k + self._worker, world=share["world"] * k,
                    memory=f"{share['worker_slots']} slots", readahead=share["worker_readahead"],
                    batch_size=share["worker_batch_size"])

    def __iter__(self) -> "BrandDatasetIterator":
        return BrandDatasetIterator(self)

    def __str__(self) -> str:
        worker = f", worker {self._worker} of {self._workers}" if self._workers > 1 else ""
        return f"BrandIterDataset({self.path!r}, batched={self.batched}{worker})"


class BrandDatasetIterator(grain.DatasetIterator):
    """The iterator of a ``BrandIterDataset``: a ``brand.Loader`` and where
    in its current batch it is."""

    def __init__(self, dataset: BrandIterDataset) -> None:
        super().__init__()
        self._dataset = dataset
        self._loader = brand.Loader(dataset.path, **dataset._loader_config())
        if dataset.first_epoch:
            self._loader.start_epoch(dataset.first_epoch)
        self._end = None if dataset.num_epochs is None else dataset.first_epoch + dataset.num_epochs
        if self._end is not None:
            # Nothing is read ahead into an epoch this iterator never yields.
            self._loader.set_last_epoch(self._end - 1)
        self._batch: Optional[brand.Batch] = None
        self._before: Optional[dict] = None  # the loader's state before _batch
        self._taken = 0  # samples of _batch handed out
        self._skip = 0  # samples of the next batch to leave out (after set_state)

    def __next__(self):
        while self._batch is None or self._taken >= len(self._batch):
            self._fetch()
        b, i = self._batch, self._taken
        if self._dataset.batched:
            self._taken = len(b)
            return {"data": b.samples[i:], "label": b.labels[i:], "id": b.ids[i:], "key": b.keys[i:],
                    "epoch": b.epoch}
        self._taken = i + 1
        return {"data": self._arrays[i], "label": int(self._labels[i]), "id": int(self._ids[i]),
                "key": self._keys[i]}

    def _fetch(self) -> None:
        before = self._loader.state_dict()
        if self._end is not None and before["epoch"] >= self._end:
            raise StopIteration
        batch = next(self._loader, None)  # None: the epoch ended, the loader is at the next
        if batch is None:
            self._batch = None
            return
        self._batch, self._before, self._taken, self._skip = batch, before, self._skip, 0
        self._arrays, self._labels, self._ids, self._keys = batch.samples, batch.labels, batch.ids, batch.keys

    def get_state(self) -> dict[str, Any]:
        """Where the iterator is: brand's state before the batch in hand and
        how many of its samples were handed out (JSON-serialisable)."""
        if self._batch is not None and self._taken < len(self._batch):
            if self._dataset.config.get("cache"):
                # Attached: its batches depend on timing and cannot be read again.
                return {"version": _STATE_VERSION, "brand": self._loader.state_dict(taken=self._taken), "skip": 0}
            return {"version": _STATE_VERSION, "brand": dict(self._before), "skip": self._taken, "attached": False}
        if self._batch is None and self._skip:
            return {"version": _STATE_VERSION, "brand": self._loader.state_dict(), "skip": self._skip,
                    "attached": bool(self._dataset.config.get("cache"))}
        return {"version": _STATE_VERSION, "brand": self._loader.state_dict(), "skip": 0}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues exactly where the iterator that gave ``state`` was."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION or "brand" not in state:
            raise brand.InvalidStateError(f"not a BrandDatasetIterator state: {state!r:.200}")
        brand._refuse_inside_an_attached_batch(state, bool(self._dataset.config.get("cache")), "batched=True")
        self._loader.load_state_dict(state["brand"])
        self._batch, self._before, self._taken = None, None, 0
        self._skip = int(state["skip"])

    def close(self) -> None:
        loader = getattr(self, "_loader", None)  # None: its opening failed
        if loader is not None:
            loader.close()
        super().close()

    def __str__(self) -> str:
        return f"BrandDatasetIterator({self._dataset.path!r})"
