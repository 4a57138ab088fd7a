"""brand: a training-data loader for datasets far larger than memory.

Samples are packed into chunks (``brand pack``), read with O_DIRECT and
io_uring, and served once per epoch in a provably random order within a
memory budget.

Quick start::

    import brand

    loader = brand.Loader("/data/imagenet.brand", batch_size=256, memory="10%", seed=1)
    for epoch in range(3):
        for batch in loader:              # one epoch per loop
            for arr, label in zip(batch.samples, batch.labels):
                ...                       # arr: read-only numpy.uint8 view, no copy
        state = loader.state_dict()       # JSON-serialisable; resume with load_state_dict

Making datasets: ``brand.pack(inputs, out, source="dir", seed=…)`` is ``brand
pack`` as a function, and ``brand.Writer(out)`` packs samples handed over one
by one (``with brand.Writer(out) as w: w.write(data, label, key)``); the wheel
also installs the ``brand`` command (``brand pack``, ``brand inspect``, …).

Modules: ``brand.torch`` (a PyTorch ``IterableDataset`` that torchdata's
``StatefulDataLoader`` checkpoints), ``brand.grain`` (a Grain ``IterDataset``),
``brand.tf`` (a ``tf.data`` dataset; its op is compiled against the installed
TensorFlow on first use; ``brand.tf.service`` runs it in tf.data service),
``brand.ray`` (``read_brand``, a Ray Data dataset, one epoch per execution).

Errors are ``brand.BrandError`` and its subclasses: ``ConfigError``,
``NotFoundError``, ``IoError``, ``FormatError``, ``DataLossError`` (a corrupt
record), ``InvalidStateError`` and ``StateMismatchError``.
"""

from brand._brand import (
    CHECKPOINT_BYTES,
    Batch,
    BrandError,
    ConfigError,
    DataLossError,
    FormatError,
    InvalidStateError,
    IoError,
    Loader,
    NotFoundError,
    SampleBuffer,
    StateMismatchError,
    __version__,
)
from brand._pack import PackSummary, Writer, pack

__all__ = [
    "CHECKPOINT_BYTES",
    "Batch",
    "BrandError",
    "ConfigError",
    "DataLossError",
    "FormatError",
    "InvalidStateError",
    "IoError",
    "Loader",
    "NotFoundError",
    "PackSummary",
    "SampleBuffer",
    "StateMismatchError",
    "Writer",
    "pack",
]



def _refuse_inside_an_attached_batch(state: dict, attached_now: bool, how: str) -> None:
    """Raises ``InvalidStateError`` for a ``brand.torch``/``brand.grain`` state
    saved inside a brand batch (``skip`` samples of it handed out) when the
    loader that saved it or the one resuming it is attached to a cache: its
    batches depend on timing, so the batch read again would be another one."""
    skip = int(state.get("skip", 0))
    brand_state = state.get("brand") or {}
    saved_attached = state.get("attached") or len(brand_state.get("checkpoint", "")) > 2 * CHECKPOINT_BYTES
    if skip and (saved_attached or attached_now):
        raise InvalidStateError(
            f"this state was saved inside a brand batch ({skip} samples of it handed out) and the loader that "
            "saved it or this one is attached to a cache (cache=...), whose batches depend on timing: it cannot "
            f"resume exactly. Save between brand batches ({how}): such states resume exactly, attached or alone"
        )
