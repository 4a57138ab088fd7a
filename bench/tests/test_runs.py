"""bench/runs.py: the spread of a served order (disk neighbours' distance over a uniform shuffle's)."""

import importlib.util
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

_spec = importlib.util.spec_from_file_location("runs", Path(__file__).resolve().parent.parent / "runs.py")
runs = importlib.util.module_from_spec(_spec)
sys.modules["runs"] = runs
_spec.loader.exec_module(runs)


def spread_of(order, pairs, tmp_path):
    f = tmp_path / "order.npy"
    np.save(f, np.asarray(order, dtype=np.int64))
    return runs.order_spread(f, pairs)


def test_disk_order_has_no_spread_and_a_shuffle_has_one(tmp_path):
    n = 20_000
    ids = np.arange(n - 1)
    pairs = (ids, ids + 1)  # one file: every id's neighbour is the next
    assert spread_of(np.arange(n), pairs, tmp_path) == pytest.approx(3 / (n + 1))
    shuffled = np.random.default_rng(1).permutation(n)
    assert spread_of(shuffled, pairs, tmp_path) == pytest.approx(1.0, abs=0.03)
    # Neighbours served in pairs (runs of 2), the pairs shuffled: half the pairs are adjacent.
    runs2 = np.random.default_rng(2).permutation(n // 2)
    order = np.stack([2 * runs2, 2 * runs2 + 1], axis=1).ravel()
    assert spread_of(order, pairs, tmp_path) == pytest.approx(0.5, abs=0.03)


def test_a_missing_or_foreign_sample_has_no_spread(tmp_path):
    pairs = (np.array([0, 1]), np.array([1, 2]))
    assert spread_of([0, 1, 1], pairs, tmp_path) is None
    assert spread_of([0, 1, 3], pairs, tmp_path) is None
