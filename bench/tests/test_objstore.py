"""bench/objstore.py: order quality of served ids (brand's OrderMeter definition), summaries, goals."""

import importlib.util
import random
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("objstore", Path(__file__).resolve().parent.parent / "objstore.py")
objstore = importlib.util.module_from_spec(_spec)
sys.modules["objstore"] = objstore
_spec.loader.exec_module(objstore)


def test_dispersion_matches_order_rs():
    # crates/plan/src/order.rs: chunk-mates one position apart in the identity order give 1 / ((N+1)/3).
    q = objstore.order_quality(list(range(100)), 100, 10)
    assert q["exactly_once"] and q["missing"] == 0 and q["duplicates"] == 0
    assert abs(q["chunk_mate_dispersion"] - 3.0 / 101.0) < 1e-12


def test_dispersion_uniform_near_one_and_whole_chunk_low():
    n, k = 6400, 64
    ids = list(range(n))
    random.Random(1).shuffle(ids)
    assert 0.9 < objstore.order_quality(ids, n, k)["chunk_mate_dispersion"] < 1.1
    chunks = list(range(n // k))
    random.Random(2).shuffle(chunks)
    whole = [c * k + j for c in chunks for j in range(k)]
    assert objstore.order_quality(whole, n, k)["chunk_mate_dispersion"] < 0.01


def test_missing_and_duplicates():
    q = objstore.order_quality([0, 1, 1, 3, 7], 4, 2)
    assert not q["exactly_once"]
    assert q["missing"] == 1 and q["duplicates"] == 1
    assert q["chunk_mate_dispersion"] is not None  # the pair (0, 1) is served


def test_summary_and_goals():
    assert objstore.summary([3, None, 1, 2]) == {"median": 2, "min": 1, "max": 3, "n": 3}
    assert objstore.summary([None]) is None
    row = lambda sps, disp, frac: {"samples_per_sec": objstore.summary([sps]),
                                   "chunk_mate_dispersion": objstore.summary([disp]),
                                   "useful_mb_per_sec": objstore.summary([1.0]),
                                   "link_fraction": objstore.summary([frac])}
    g = objstore.goals({"brand": row(1300, 0.8, 0.95), "mds": row(1000, 0.3, 0.7)}, {})
    assert "met" in g[0] and "NOT" not in g[0]
    assert "1.30×" in g[1] and "NOT" not in g[1]
    assert "NOT" not in g[2]
