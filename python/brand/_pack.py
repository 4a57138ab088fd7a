"""Making datasets from Python: ``brand.pack`` (what ``brand pack`` does, as a
function) and ``brand.Writer`` (samples handed over one by one, packed at the
end). Both run brand's packer in-process: same seed, same dataset as the
command line."""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional, Sequence, Union

from brand import _brand

PathLike = Union[str, "os.PathLike[str]"]
Progress = Callable[[int, int], object]

__all__ = ["PackSummary", "Writer", "pack"]


@dataclasses.dataclass(frozen=True)
class PackSummary:
    """What a pack made: ``samples`` and ``chunks`` in ``segments`` segment
    files holding ``data_bytes`` bytes (``raw_bytes`` of samples before
    compression and padding), at ``path`` (the directory or URL given)."""

    samples: int
    chunks: int
    segments: int
    data_bytes: int
    raw_bytes: int
    path: str


def _summary(result: tuple, out: PathLike) -> PackSummary:
    samples, chunks, segments, data_bytes, raw_bytes = result
    return PackSummary(samples, chunks, segments, data_bytes, raw_bytes, os.fspath(out))


def pack(
    inputs: Union[PathLike, Sequence[PathLike]],
    out: PathLike,
    *,
    source: str = "dir",
    field: Optional[str] = None,
    label: Optional[str] = None,
    label_feature: str = "label",
    seed: int = 0,
    chunk_size: int = _brand.DEFAULT_CHUNK_SIZE,
    zstd: Optional[int] = None,
    segment_mib: int = _brand.DEFAULT_SEGMENT_MIB,
    force: bool = False,
    staging: Optional[PathLike] = None,
    progress: Optional[Progress] = None,
    stall_timeout: Optional[Union[str, float]] = None,
    retries: Optional[int] = None,
) -> PackSummary:
    """Packs ``inputs`` into the dataset ``out``, as ``brand pack`` does (the
    same options, the same bytes for the same inputs and seed).

    ``inputs``: one path, or several for ``source="tfrecord"``, ``"tar"``,
    ``"parquet"`` and ``"arrow"``; for ``"tar"``, ``"mds"``, ``"parquet"`` and
    ``"arrow"`` a URL too (``s3://bucket/shards/``: an object, or a prefix
    listed as a directory), each object read once, in order, by large ranged
    GETs.
    ``out``: the dataset directory to create, or a URL (``s3://bucket/prefix``,
    ``gs://…``, ``az://…``): packed in ``staging`` (default: the system's
    temporary directory), then uploaded.

    ``source`` is ``brand pack --from``: ``"dir"`` (an ImageFolder tree,
    label = class directory), ``"list"`` (a file of ``path<TAB>label``
    lines), ``"tfrecord"``, ``"lmdb"`` or ``"tar"`` (WebDataset shards, tars
    of tars, ``.tar.gz``; ``field`` picks the payload's extensions,
    ``"png;jpg"``, and ``label`` how to find the label: ``"cls"``,
    ``"json:FIELD"``, ``"dir"``). ``label_feature``: TFRecord's int64 label
    feature. ``seed`` is the one pack-time shuffle's; ``chunk_size`` samples
    per chunk (1..=64); ``zstd``: compress each record at this level;
    ``segment_mib``: the largest segment file; ``force`` replaces an
    existing dataset at ``out``.

    ``progress(done, total)`` is called from this thread every few
    milliseconds while samples are packed, and once at the end with
    ``done == total``.

    ``stall_timeout`` (``"10s"``, ``"500ms"`` or seconds; default 10 s) and
    ``retries`` (default 10) bound every request to a store, the inputs'
    and the output's, as ``brand.Loader``'s keys of the same names and
    ``brand pack --stall-timeout/--retries`` do (an upload waits at least
    30 s for an answer).

    The GIL is released while packing. Ctrl-C (``KeyboardInterrupt``), or an
    exception raised by ``progress``, stops the pack: its unfinished output is
    removed before the exception propagates, and no dataset is left. A
    process killed mid-pack (SIGKILL, out of memory) leaves its work
    directory with a checkpoint instead: the same ``brand.pack`` call, or
    ``brand pack`` with the same options, goes on from there. The tar, mds
    and parquet sources keep what they have listed (keys, labels and the
    spooled payloads of ``.tar.gz``, zstd shards, Parquet and objects) in
    ``.OUT.listing`` beside ``out`` until the dataset is in place: after an
    error, Ctrl-C or a kill that came once an input was finished, the same
    call reuses the inputs listed unchanged instead of reading them again
    (delete the directory to start over). Errors
    are ``brand.BrandError`` subclasses naming the file concerned
    (``FormatError`` for a malformed input, ``NotFoundError``,
    ``ConfigError`` for an option or an existing ``out``).

    Returns a ``brand.PackSummary``.
    """
    if isinstance(inputs, (str, bytes, os.PathLike)):
        inputs = [inputs]
    paths = [os.fspath(p) for p in inputs]
    result = _brand._pack(
        paths, os.fspath(out), source=source, field=field, label=label, label_feature=label_feature,
        seed=seed, chunk_size=chunk_size, zstd=zstd, segment_mib=segment_mib, force=force,
        staging=None if staging is None else os.fspath(staging), progress=progress,
        stall_timeout=stall_timeout, retries=retries,
    )
    return _summary(result, out)


class Writer:
    """Writes a dataset from samples handed over one by one (a torchvision or
    Hugging Face dataset, a generator): ``w.write(data, label, key)`` for each,
    then ``close()``, which shuffles and packs them exactly as ``brand pack``
    packs the same samples (the same seed gives the same dataset).

    Use it as a context manager::

        with brand.Writer("/data/train.brand", seed=1) as w:
            for image_bytes, label in samples:
                w.write(image_bytes, label)
        # packed here; an exception inside the block packs nothing

    Memory stays bounded: each sample's bytes go to an anonymous file in
    ``spill_dir`` (default: the directory ``out`` will be in; it needs room
    for every sample's bytes until ``close()`` has packed them); only each
    sample's length, label and key are kept in memory. The spill file has no
    name, so an exception, Ctrl-C or a killed process leaves neither a dataset
    nor a spill file behind (only what a pack killed mid-way leaves beside
    ``out``, as ``brand pack`` does, removed by the next pack into ``out``).

    ``out``: the dataset directory to create, or a URL (packed in ``staging``,
    then uploaded). ``seed``, ``chunk_size``, ``zstd``, ``segment_mib`` and
    ``force`` are ``brand.pack``'s, checked here, before any sample is written
    (so is whether ``out`` exists); so are ``stall_timeout`` and ``retries``,
    for a pack to a URL.
    """

    def __init__(
        self,
        out: PathLike,
        *,
        seed: int = 0,
        chunk_size: int = _brand.DEFAULT_CHUNK_SIZE,
        zstd: Optional[int] = None,
        segment_mib: int = _brand.DEFAULT_SEGMENT_MIB,
        force: bool = False,
        spill_dir: Optional[PathLike] = None,
        staging: Optional[PathLike] = None,
        stall_timeout: Optional[Union[str, float]] = None,
        retries: Optional[int] = None,
    ) -> None:
        self._out = os.fspath(out)
        self._inner = _brand._Writer(
            self._out, seed=seed, chunk_size=chunk_size, zstd=zstd, segment_mib=segment_mib, force=force,
            spill_dir=None if spill_dir is None else os.fspath(spill_dir),
            staging=None if staging is None else os.fspath(staging),
            stall_timeout=stall_timeout, retries=retries,
        )

    def write(self, data: Union[bytes, bytearray], label: int = -1, key: Optional[str] = None) -> None:
        """Adds one sample: its bytes (``bytes`` or ``bytearray``; a numpy
        array's ``.tobytes()``), its class ``label`` (-1: none) and its
        ``key``, the name it is found by (``brand cat --key``; default: its
        number in write order, ``"0"``, ``"1"``, …). A key given twice raises
        ``ConfigError`` naming both samples."""
        self._inner.write(data, label, key)

    def close(self, progress: Optional[Progress] = None) -> PackSummary:
        """Packs the samples written into ``out`` and returns a
        ``brand.PackSummary``; ``progress(done, total)``, Ctrl-C and errors as
        in ``brand.pack`` (an interrupted or failed close leaves no dataset).
        The writer cannot be used afterwards."""
        return _summary(self._inner.close(progress), self._out)

    def abort(self) -> None:
        """Drops the samples written: no dataset is made."""
        self._inner.abort()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` or ``abort()`` was called."""
        return self._inner.closed

    def __len__(self) -> int:
        """Samples written so far."""
        return len(self._inner)

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        """Packs on a normal exit; an exception drops the samples instead."""
        if exc_type is None:
            if not self.closed:
                self.close()
        else:
            self.abort()
        return False

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self)} samples written"
        return f"brand.Writer({self._out!r}, {state})"

