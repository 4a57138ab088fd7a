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

Modules: ``brand.torch`` (a PyTorch ``IterableDataset`` that torchdata's
``StatefulDataLoader`` checkpoints), ``brand.grain`` (a Grain ``IterDataset``),
``brand.tf`` (a ``tf.data`` dataset; its op is compiled against the installed
TensorFlow on first use).

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
    "SampleBuffer",
    "StateMismatchError",
]


def _holds_served_bitmap(state: dict) -> bool:
    """Whether a ``Loader.state_dict()`` is of a loader attached to a cache
    mid-epoch (longer than a count's ``CHECKPOINT_BYTES``: it holds which
    samples were served). Such a loader's batches depend on timing, so a
    position inside one (a batch read again, some of it skipped) is not exact."""
    return len(state.get("checkpoint", "")) > 2 * CHECKPOINT_BYTES


def _refuse_inside_an_attached_batch(brand_state: dict, skip: int, how: str) -> None:
    """Raises ``InvalidStateError`` for a state saved ``skip`` samples into a
    batch of a loader attached to a cache (see ``_holds_served_bitmap``)."""
    if skip and _holds_served_bitmap(brand_state):
        raise InvalidStateError(
            f"this state was saved inside a brand batch ({skip} samples of it handed out) of a loader attached "
            "to a cache (cache=...), whose batches depend on timing: it cannot resume exactly. Save between "
            f"brand batches ({how}): such states resume exactly, attached or alone"
        )
