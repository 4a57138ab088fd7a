"""One dataset in three forms, made once and reused.

    ROOT/<preset>-n<samples>-kib<mean>-s<seed>/
        files/       ImageNet-like ImageFolder (`brand gen`)
        pack/        its brand pack (`brand pack`)
        tfrecord/    TFRecord shards of the same samples (bench/runners/write_tfrecords.py)

Each form has a stamp (`.done-<form>`) written when it is complete, so an
interrupted preparation resumes where it stopped.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .config import RUNNERS, Preset

SHARD_BYTES = 128 << 20  # like ImageNet's usual shards (~140 MB)


@dataclass
class Dataset:
    root: Path
    files: Path
    pack: Path
    tfrecord: Path | None
    samples: int
    stored_bytes: int  # the samples' bytes (what every loader must deliver)
    pack_bytes: int  # the pack's segments on disk (padding included)
    chunk_size: int
    chunks: int
    mean_sample_bytes: float
    mean_chunk_bytes: int  # rounded up to 4 KiB: fio's "chunk-sized" reads
    shards: int

    def all_files(self) -> list[Path]:
        out = [p for p in self.files.rglob("*") if p.is_file()]
        out += [p for p in self.pack.iterdir() if p.is_file()]
        if self.tfrecord and self.tfrecord.exists():
            out += [p for p in self.tfrecord.iterdir() if p.is_file()]
        return out

    def segments(self) -> list[Path]:
        return sorted(self.pack.glob("data-*.brd"))

    def describe(self) -> dict:
        return {
            "root": str(self.root),
            "samples": self.samples,
            "stored_bytes": self.stored_bytes,
            "pack_bytes": self.pack_bytes,
            "chunk_size": self.chunk_size,
            "chunks": self.chunks,
            "mean_sample_bytes": self.mean_sample_bytes,
            "mean_chunk_bytes": self.mean_chunk_bytes,
            "tfrecord_shards": self.shards,
        }


def _run(argv, log):
    log(" ".join(str(a) for a in argv))
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed: {r.stderr.strip()[-2000:]}")
    return r.stdout


def shard_count(stored_bytes: int) -> int:
    return max(8, math.ceil(stored_bytes / SHARD_BYTES))


def prepare(root: Path, p: Preset, brand: Path, python: str | None, log=print) -> Dataset:
    """Makes (or reuses) the three forms; TFRecords only if `python` has TensorFlow."""
    d = root / f"{p.name}-n{p.samples}-kib{p.mean_kib:g}-k{p.chunk_size}-s{p.seed}"
    d.mkdir(parents=True, exist_ok=True)
    files, pack, tfr = d / "files", d / "pack", d / "tfrecord"
    if not (d / ".done-files").exists():
        log(f"generating {p.samples} samples ({p.mean_kib:g} KiB mean) into {files}")
        subprocess.run(["rm", "-rf", str(files)], check=True)
        _run([brand, "gen", files, "--samples", p.samples, "--mean-kib", p.mean_kib, "--min-kib", p.min_kib,
              "--max-kib", p.max_kib, "--classes", p.classes, "--seed", p.seed], log)
        (d / ".done-files").touch()
    if not (d / ".done-pack").exists():
        log(f"packing into {pack}")
        _run([brand, "pack", files, "-o", pack, "--seed", p.seed, "--chunk-size", p.chunk_size, "--force"], log)
        (d / ".done-pack").touch()
    info = json.loads(_run([brand, "inspect", pack, "--json"], lambda *_: None))
    shards = shard_count(info["stored_bytes"])
    if python and not (d / ".done-tfrecord").exists():
        log(f"writing {shards} TFRecord shards into {tfr}")
        _run([python, RUNNERS / "write_tfrecords.py", files, tfr, "--shards", shards, "--seed", p.seed], log)
        (d / ".done-tfrecord").touch()
    os.sync()  # written once, clean from now on: eviction before each run needs no sync
    segs = sorted(pack.glob("data-*.brd"))
    pack_bytes = sum(s.stat().st_size for s in segs)
    chunk = info["data_bytes"] / max(1, info["chunks"])
    return Dataset(
        root=d,
        files=files,
        pack=pack,
        tfrecord=tfr if (d / ".done-tfrecord").exists() else None,
        samples=info["samples"],
        stored_bytes=info["stored_bytes"],
        pack_bytes=pack_bytes,
        chunk_size=info["chunk_size"],
        chunks=info["chunks"],
        mean_sample_bytes=info["mean_sample_bytes"],
        mean_chunk_bytes=int(math.ceil(chunk / 4096) * 4096),
        shards=shards,
    )
