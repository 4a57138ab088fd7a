"""brand for PyTorch: ``BrandDataset``, an ``IterableDataset`` over a brand
dataset that torchdata's ``StatefulDataLoader`` checkpoints and resumes
exactly.

Per sample (the default)::

    ds = brand.torch.BrandDataset("/data/ds.brand", memory="10%", seed=1,
                                  epochs=epochs)
    dl = torchdata.stateful_dataloader.StatefulDataLoader(
        ds, batch_size=64, num_workers=4, collate_fn=my_collate)
    for epoch in range(start_epoch, epochs):
        ds.set_epoch(epoch)
        for batch in dl:
            ...
        # dl.state_dict() at any step; dl.load_state_dict(saved) to resume

Each item is ``{"data": uint8 tensor, "label": int, "id": int, "key": str}``
(samples differ in size, so the default collate cannot stack them: pass a
``collate_fn``, or decode to a fixed shape with ``transform``).

Whole batches: ``BrandDataset(path, batched=True, batch_size=256)`` yields
brand's batches as they come, ``{"data": [uint8 tensor, ...], "label":
int64 tensor, "id": int64 tensor, "key": [str, ...], "epoch": int}``; give
the DataLoader ``batch_size=None``.

Ranks and workers: the rank and world come from ``torch.distributed`` when it
is initialised, else from ``RANK`` / ``WORLD_SIZE`` (else 0 and 1); a
``rank``/``world`` keyword overrides them. With ``num_workers=k`` every worker
is a brand rank of its own: world ``world × k``, rank ``rank × k +
worker_id``. Every sample is served exactly once per epoch across all ranks
and workers.

Memory: ``memory`` is what this process may hold, however many workers it
has. Its ``k`` workers share it: each worker's brand rank has ``⌊M / k⌋`` of
the ``M`` slots ``memory`` gives (slots: samples' worth, DESIGN.md §3); the
``M mod k`` left over (fewer than ``k`` samples) are unused, and each has
``readahead / k`` of reads in flight, so the workers together hold at most
``memory + readahead`` (each rank may start one read beyond its share). Because
brand's global order depends on the total slots, not on the number of ranks,
it is the same for every ``num_workers`` that divides ``M`` (``"10%"`` of
20,000 samples is 2,000 slots: 1, 2, 4, 5, 8, 10, ... workers). Each worker
needs one chunk and two of its batches (or its whole share of an epoch, if
less): per sample (``batched=False``) brand's batches are internal and
shrink to half a worker's share; a percentage (the default ``"10%"``) that
gives a worker less than one chunk, or with ``batched=True`` less than its
whole share of a small dataset, rounds each worker's share up to it, with one
warning (``metrics()["memory_slots"]`` of a worker's loader is its real
share), so small datasets work at the defaults. A budget in bytes or slots
that is too small raises ``ConfigError`` naming ``k`` and the least memory
that would. A budget that
holds the whole dataset reads it once only when each worker's share holds
it (``k`` × the dataset): shared by workers, every worker reads its part of
the dataset each epoch.

Epochs: iterating the dataset again in the same process continues with the
next epoch (``num_workers=0``, or ``persistent_workers=True``). DataLoader
workers that are started afresh each epoch start from the dataset object of
the main process: call ``set_epoch(epoch)`` before each epoch, as with
``DistributedSampler``. ``epochs=N``, when the run's length is known, names
its last epoch (``N - 1``): brand otherwise reads the next epoch ahead while
one ends (up to ``readahead`` bytes; GETs on object storage), which after the
last one is read for nothing. An epoch asked for after it is still served.

Checkpoints: ``state_dict()``/``load_state_dict()`` give each worker's exact
position (to the sample), which ``StatefulDataLoader`` saves and restores with
0 or k workers, mid-epoch or after an epoch's end. A state loaded into a
worker wins over ``set_epoch`` unless ``set_epoch`` names a later epoch (so
``set_epoch(e + 1)`` after resuming from the end of epoch ``e`` starts
``e + 1``). Attached to a cache (``cache=...``), whose batches depend on
timing, a state inside a batch is that position (``Loader.state_dict(taken=)``);
one saved inside a batch by a loader alone raises ``InvalidStateError`` when
loaded into an attached one.

Changing ``num_workers`` (or the number of ranks) across a resume is an
elastic resume over ``world × k`` brand ranks: ``StatefulDataLoader`` cannot
restore it (its state is per worker), so take every worker's brand state out
of every rank's saved DataLoader state with ``worker_states(dl_state)``,
gather them from all ranks (``torch.distributed.all_gather_object``), and give
the full list to ``BrandDataset.load_world_state(states)`` of the new run,
whose DataLoader starts fresh (no ``load_state_dict``). brand then continues
the same epoch's global order on the new ``world × k`` ranks, every sample
once. The total memory is kept by construction: the new workers share the
saved run's total slots equally (within ``memory``), so the same ``memory``
resumes on any ``num_workers``; ``StateMismatchError`` names the cases where
it cannot: a saved total more than ``memory`` gives (it names the
``memory`` to pass), or one that the new number of ranks does not divide
(equal slots per rank). The states must be of one global step: every brand
rank saved after the same number of brand batches, i.e. ``batched=True``
and a DataLoader step count that is a multiple of ``num_workers``.

States saved before ``memory`` was the process's (``BrandDataset`` state
version 1, when each worker had all of ``memory``) still resume when the
slots per worker agree; otherwise ``StateMismatchError`` says which
``memory`` resumes them (``k`` × what each worker had).

Tensors view brand's buffers without a copy and must not be written to
(brand may hand the same buffer out again next epoch): ``clone()`` first.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Optional

import torch
import torch.utils.data

import brand

__all__ = ["BrandDataset", "worker_states"]

# 2: ``memory`` is the process's, shared by its DataLoader workers (issue
# 37). 1: each worker had all of ``memory``; still read (see load_state_dict).
_STATE_VERSION = 2
_STATE_VERSIONS = (1, 2)


def _rank_and_world() -> tuple[int, int]:
    """This process's rank and world: torch.distributed, else RANK/WORLD_SIZE."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _tensors(arrays: list) -> list[torch.Tensor]:
    # The arrays are read-only (brand's buffers); torch has no read-only
    # tensors and warns once per array. The caller is told not to write.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return [torch.from_numpy(a) for a in arrays]


class BrandDataset(torch.utils.data.IterableDataset):
    """An ``IterableDataset`` over the brand dataset at ``path``: see the
    module documentation (``help(brand.torch)``).

    ``BrandDataset(path, batched=False, transform=None, epochs=None,
    **config)``: ``config`` is brand's configuration as keywords (as
    ``brand.Loader`` takes them; ``rank`` and ``world`` default to
    torch.distributed's or RANK/WORLD_SIZE). ``batched=False`` yields one
    dict per sample, ``True`` one dict per brand batch. ``transform``, if
    given, is applied to each item before it is yielded. ``epochs``, if
    given, is the number of epochs the run trains (0 to ``epochs - 1``):
    nothing is read ahead past the last.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        batched: bool = False,
        transform: Optional[Callable[[dict], Any]] = None,
        epochs: Optional[int] = None,
        **config: Any,
    ) -> None:
        super().__init__()
        if epochs is not None and (not isinstance(epochs, int) or isinstance(epochs, bool)):
            raise TypeError(f"epochs must be an int or None, not {type(epochs).__name__}")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be at least 1, not {epochs}")
        self.epochs = epochs
        self.path = os.fspath(path)
        self.batched = batched
        self.transform = transform
        self.config = config
        self._epoch: Optional[int] = None
        self._pending: Optional[dict] = None
        self._world_states: Optional[list] = None
        # Per process: (pid, rank, world) -> the loader this worker iterates.
        self._loader: Optional[brand.Loader] = None
        self._loader_key: Optional[tuple] = None
        # This worker's share of ``memory`` (see _open).
        self._share: Optional[dict] = None
        # Where the worker is: the brand state before the batch in hand and
        # how many of its samples were yielded (None: between batches).
        self._before: Optional[dict] = None
        self._taken = 0
        self._batch_len = 0

    # -- where this worker is ------------------------------------------------

    def _process_rank(self) -> tuple[int, int, int, int]:
        """This process's rank and world, and this worker's id and the
        number of workers (0 and 0 without workers)."""
        rank, world = _rank_and_world()
        rank = self.config.get("rank", rank)
        world = self.config.get("world", world)
        info = torch.utils.data.get_worker_info()
        if info is None:
            return rank, world, 0, 0
        return rank, world, info.id, info.num_workers

    def _open(self) -> brand.Loader:
        rank, world, worker, workers = self._process_rank()
        k = max(workers, 1)
        # This worker's brand rank: rank × k + worker id of world × k.
        brand_rank, brand_world = rank * k + worker, world * k
        key = (os.getpid(), brand_rank, brand_world)
        if self._loader is None or self._loader_key != key or self._world_states is not None:
            # A loader inherited from another process is left alone (it
            # belongs to its parent); each worker opens its own. An elastic
            # resume opens one with the saved run's total memory.
            config = dict(self.config, rank=brand_rank, world=brand_world)
            self._share = None
            if k > 1 or self._world_states is not None:
                self._share = _share(
                    self.path, dict(self.config, rank=rank, world=world), k, self.batched, self._world_states
                )
                config["memory"] = f"{self._share['worker_slots']} slots"
                config["readahead"] = self._share["worker_readahead"]
                config["batch_size"] = self._share["worker_batch_size"]
                if self._share["rounded_up"] and worker == 0:
                    warnings.warn(self._share["rounded_up"], stacklevel=2)
            self._loader = brand.Loader(self.path, **config)
            if self.epochs is not None:
                self._loader.set_last_epoch(self.epochs - 1)
            self._loader_key = key
            self._before = None
        return self._loader

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration starts (at its beginning); see the
        module documentation for when this is needed."""
        self._epoch = int(epoch)

    # -- iteration ------------------------------------------------------------

    def __iter__(self):
        loader = self._open()
        skip = 0
        pending, self._pending = self._pending, None
        world_states, self._world_states = self._world_states, None
        if world_states is not None:
            loader.load_state_dict({"world": world_states})
        elif pending is not None and pending.get("brand") is not None:
            saved_epoch = pending["brand"]["epoch"]
            if self._epoch is not None and self._epoch > saved_epoch:
                loader.start_epoch(self._epoch)
            else:
                brand._refuse_inside_an_attached_batch(pending, bool(self.config.get("cache")), "batched=True")
                self._check_memory(pending)
                loader.load_state_dict(pending["brand"])
                skip = pending["skip"]
        elif pending is not None:
            loader.start_epoch(max(pending["epoch"], self._epoch or 0))
        elif self._epoch is not None:
            if loader.state_dict()["epoch"] != self._epoch or loader.state_dict()["served"] != 0:
                loader.start_epoch(self._epoch)
        self._epoch = None
        # Until the generator takes the batch in hand, a state saved now is
        # the resumed one (skip included).
        if skip:
            self._before, self._taken, self._batch_len = dict(pending["brand"]), skip, skip + 1
        else:
            self._before = None
        return self._items(loader, skip)

    def _items(self, loader: brand.Loader, skip: int):
        while True:
            before = loader.state_dict()
            batch = next(loader, None)
            if batch is None:
                self._before = None
                return
            self._before, self._taken, self._batch_len = before, skip, len(batch)
            data = _tensors(batch.samples[skip:])
            if self.batched:
                item = {
                    "data": data,
                    "label": torch.from_numpy(batch.labels[skip:]),
                    "id": torch.from_numpy(batch.ids[skip:].astype("int64")),
                    "key": batch.keys[skip:],
                    "epoch": batch.epoch,
                }
                self._taken = len(batch)
                yield self.transform(item) if self.transform else item
            else:
                labels, ids, keys = batch.labels.tolist(), batch.ids.tolist(), batch.keys
                for i in range(skip, len(batch)):
                    item = {"data": data[i - skip], "label": labels[i], "id": ids[i], "key": keys[i]}
                    # Counted before the yield: a state taken while the item
                    # is out has it as handed out.
                    self._taken = i + 1
                    yield self.transform(item) if self.transform else item
            skip = 0

    def _check_memory(self, state: dict) -> None:
        """Refuses, saying which ``memory`` resumes it, a state saved with
        other slots per worker than this worker has (brand's own check would
        speak of slots per rank)."""
        if self._share is None:
            # A process alone has all of memory: brand's check says it.
            return
        k = max(self._process_rank()[3], 1)
        saved, now = brand._brand._saved_slots(state["brand"]), self._share["worker_slots"]
        if saved == now:
            return
        old = (
            " (a state of version 1, saved when each DataLoader worker had all of memory)"
            if state.get("version") == 1
            else ""
        )
        raise brand.StateMismatchError(
            f"this state was saved with {saved} slots per DataLoader worker{old}; memory={self.config.get('memory')!r} "
            f"is {self._share['process_slots']} slots for this process, {now} for each of its {k} workers: pass "
            f"memory=\"{saved * k} slots\" to resume it (or resume on another number of workers with "
            "worker_states and load_world_state)"
        )

    # -- checkpoints ------------------------------------------------------------

    def state_dict(self) -> dict:
        """This worker's position (JSON-serialisable): brand's state before
        the batch in hand and how many of its samples were yielded."""
        if self._pending is not None or self._world_states is not None or self._loader is None:
            # Not iterating yet: what the next iteration will start from.
            if self._pending is not None:
                return dict(self._pending)
            return {"version": _STATE_VERSION, "brand": None, "skip": 0, "epoch": self._epoch or 0}
        if self._before is None or self._taken >= self._batch_len:
            # Between batches: the loader's own state is exact (and usable
            # for an elastic resume).
            return {"version": _STATE_VERSION, "brand": self._loader.state_dict(), "skip": 0}
        if self.config.get("cache"):
            # Attached: its batches depend on timing and cannot be read again.
            return {"version": _STATE_VERSION, "brand": self._loader.state_dict(taken=self._taken), "skip": 0}
        return {"version": _STATE_VERSION, "brand": dict(self._before), "skip": self._taken, "attached": False}

    def load_state_dict(self, state: dict) -> None:
        """Resumes the next iteration where ``state`` (from ``state_dict``)
        was taken."""
        if not isinstance(state, dict) or state.get("version") not in _STATE_VERSIONS or "brand" not in state:
            raise brand.InvalidStateError(f"not a BrandDataset state: {state!r:.200}")
        self._pending = dict(state)
        self._world_states = None

    def load_world_state(self, states: list[dict]) -> None:
        """Elastic resume: ``states`` are the ``BrandDataset`` states of EVERY
        worker of EVERY rank of the saved run (``worker_states`` of each
        rank's DataLoader state, gathered), in any order. Each worker of this
        run continues that run's global order as its own brand rank."""
        brand_states = []
        for i, s in enumerate(states):
            if not isinstance(s, dict) or s.get("brand") is None:
                raise brand.InvalidStateError(f"state {i} has no brand position: {s!r:.200}")
            if s.get("skip", 0) != 0:
                raise brand.StateMismatchError(
                    f"state {i} was saved inside a brand batch ({s['skip']} samples of it yielded): an elastic "
                    "resume needs every worker between batches (batched=True, and a DataLoader step count "
                    "that is a multiple of num_workers)"
                )
            brand_states.append(s["brand"])
        self._world_states = brand_states
        self._pending = None


def _share(path: str, config: dict, workers: int, batched: bool, world_states: Optional[list]) -> dict:
    """This process's ``memory`` in slots (``process_slots``) and each of
    its ``workers``' share (``worker_slots``, and ``worker_batch_size``: an
    internal batch shrinks to half a small share), ``config`` being the
    process's (its rank and world). An elastic resume (``world_states``, the
    saved brand states) keeps the saved run's total slots, shared equally by
    the ``world × workers`` new ranks, if ``memory`` holds it."""
    share = brand._brand._worker_memory(path, workers, batched, **config)
    if not world_states:
        return share
    saved_world = {int(s.get("world", -1)) for s in world_states}
    slots = {brand._brand._saved_slots(s) for s in world_states}
    if len(saved_world) != 1 or len(slots) != 1:
        return share  # brand's own check names what differs
    total = saved_world.pop() * slots.pop()
    ranks = share["world"] * workers
    if ranks * share["worker_slots"] == total:
        return share
    saved = f"the saved run held {total} slots in total ({len(world_states)} brand ranks)"
    if total > share["world"] * share["process_slots"]:
        raise brand.StateMismatchError(
            f"{saved}, more than memory={config.get('memory')!r} gives {share['world']} process(es) "
            f"({share['process_slots']} slots each): pass memory=\"{-(-total // share['world'])} slots\" to continue "
            "its order (an elastic resume keeps the total memory)"
        )
    if total % ranks:
        raise brand.StateMismatchError(
            f"{saved}, which {share['world']} process(es) × {workers} workers = {ranks} brand ranks cannot share "
            f"equally (ranks of one world hold equal slots): resume on a number of ranks that divides {total}"
        )
    return dict(share, worker_slots=total // ranks)


def worker_states(dataloader_state: dict) -> list[dict]:
    """The ``BrandDataset`` state of every worker in a ``StatefulDataLoader``
    state dict, in worker order (one with ``num_workers=0``): what
    ``BrandDataset.load_world_state`` takes, gathered from every rank."""
    snapshot = dataloader_state.get("_snapshot")
    if snapshot is None:  # num_workers=0
        return [dataloader_state["dataset_state"]]
    workers = snapshot["_worker_snapshots"]
    return [workers[f"worker_{i}"]["dataset_state"] for i in range(len(workers))]
