"""Presets, paths and the programs the harness drives."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
REPO = BENCH.parent
RUNNERS = BENCH / "runners"

GiB = 1 << 30
MiB = 1 << 20


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")


def brand_bin() -> Path:
    return Path(os.environ.get("BRAND_BIN") or target_dir() / "release" / "brand")


def throughput_bin() -> Path:
    return Path(os.environ.get("BRAND_THROUGHPUT_BIN") or target_dir() / "cpp-examples" / "brand_throughput")


# The brand variants measured through the CLI: (policy, read gap).
BRAND_VARIANTS = [
    ("brand", "whole"),
    ("brand", "auto"),
    ("brand-random", "auto"),
    ("direct", "auto"),
    ("chunk-shuffle", "auto"),
]
# Through the C ABI, brand.tf and the Python package (the interfaces' cost, not the policies'):
API_VARIANTS = [("brand", "auto")]

LOADERS = ["fio", "files", "torch", "spdl", "tf-tfrecord", "tf-files", "brand", "capi", "tf-op", "py-numpy", "py-torch",
           "order"]
# brand's own loaders (through the CLI, the C ABI, TensorFlow and the Python package).
BRAND_LOADERS = ("brand", "capi", "tf-op", "py-numpy", "py-torch")


@dataclass
class Preset:
    name: str
    samples: int
    mean_kib: float = 110
    min_kib: float = 10
    max_kib: float = 300
    classes: int = 100
    chunk_size: int = 64
    seed: int = 7
    budgets: list[float] = field(default_factory=lambda: [0.10, 0.25, 1.00])
    # Memory every runtime needs besides its data (interpreter, libraries,
    # PyTorch's 8 worker processes: ~520 MiB anonymous measured here); the
    # memory group of a run is this plus the run's budget.
    allowance: int = 640 * MiB
    fio_seconds: float = 5.0
    rounds: int = 3
    batch_size: int = 64
    threads: int = 8
    timeout: float = 3600.0
    order_epochs: int = 6
    order_seeds: str = "1,2,3"
    # The C ABI and BrandDataset at every budget (True), or only at the
    # smallest (the interfaces' cost shows there already; saves time).
    api_all_budgets: bool = True


PRESETS = {
    # 80,000 ImageNet-like files, 110 KiB mean: about 9.0 GB (8.4 GiB). The
    # interfaces (C ABI, BrandDataset) only at 10 %: their cost shows there,
    # and each extra run costs an epoch of 9 GB per profile and round.
    "full": Preset("full", samples=80_000, classes=1000, fio_seconds=5.0, api_all_budgets=False),
    # About 0.9 GB: larger than the memory group of every run below a 100 %
    # budget (560 MiB + 10 % or 25 %: 0.68 / 0.81 GB); 222 runs, 21 minutes
    # measured on a shared (busy) 2-core machine.
    "small": Preset("small", samples=8_000, classes=100, allowance=560 * MiB, fio_seconds=0.5, timeout=900.0,
                    api_all_budgets=False),
}


# brand's units (crates/format/src/units.rs): every one binary, so "2G", "2GB"
# and "2GiB" mean what `brand --memory 2G` means. Longest first: "kib" is not "b".
_UNITS = [(u + suffix, 1 << (10 * (i + 1))) for suffix in ("ib", "b", "") for i, u in enumerate("kmgt")] + [("b", 1)]
_U64_MAX = (1 << 64) - 1


def parse_size(text: str) -> int:
    """"4096", "64KiB", "2G", "1.5GiB", "7b" -> bytes, as brand reads them;
    fractions round to the nearest byte (halves up)."""
    lower = text.strip().lower()
    number, unit = lower, 1
    for suffix, size in _UNITS:
        if lower.endswith(suffix):
            number, unit = lower[: -len(suffix)].strip(), size
            break
    if not number or any(c not in "0123456789." for c in number):
        raise ValueError(f"not a byte count (e.g. 4096, 64KiB, 512MiB, 2G): {text!r}")
    if "." not in number:
        n = int(number) * unit
    else:
        try:
            x = float(number) * unit
        except ValueError:
            raise ValueError(f"not a number: {text!r}") from None
        if not math.isfinite(x):
            raise ValueError(f"too large: {text!r}")
        whole = math.floor(x)
        # As Rust's f64::round: halves away from zero (Python's round() goes to even).
        n = whole + (x - whole >= 0.5)
    if n > _U64_MAX:
        raise ValueError(f"too large: {text!r}")
    return n


def parse_budgets(text: str) -> list[float]:
    """"10,25,100" or "10%,25%" -> [0.1, 0.25, 1.0]."""
    return [float(x.strip().rstrip("%")) / 100 for x in text.split(",") if x.strip()]


def pct(budget: float | None) -> str:
    return "" if budget is None else f"{budget * 100:g}%"
