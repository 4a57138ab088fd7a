"""min/median/max, per-round ratios, the recommendation."""

import pytest

from brandbench import recommend, results

from fake import results as fake_results


def test_stats():
    assert results.stats([3, 1, 2, None]) == {"min": 1, "median": 2, "max": 3, "n": 3}
    assert results.stats([4, 1]) == {"min": 1, "median": 2.5, "max": 4, "n": 2}
    assert results.stats([None]) is None and results.stats([]) is None


def _summary():
    res = fake_results()
    runs = [r for r in res["runs"] if r["loader"] != "fio"]
    fio = [r for r in res["runs"] if r["loader"] == "fio"]
    return res, results.summarize(runs, fio, res["dataset"]["stored_bytes"]), fio


def _row(summary, profile, loader, variant, budget):
    return next(r for r in summary if (r["profile"], r["loader"], r["variant"], r["budget"]) ==
                (profile, loader, variant, budget))


def test_ceiling_is_the_best_job_of_each_round():
    _, _, fio = _summary()
    c = results.ceilings(fio)
    assert c[("disk", 0)] == {"mb_per_s": 2500, "job": "seq chunk QD32"}
    assert c[("disk", 1)]["mb_per_s"] == 1250
    assert results.ceiling_summary(fio)["disk"] == {"min": 1250, "median": 1875, "max": 2500, "n": 2}


def test_ratios_are_taken_within_a_round():
    _, summary, _ = _summary()
    auto = _row(summary, "disk", "brand", "brand/auto", 0.1)
    # The device halved in round 2 and brand with it: the ratios stay put.
    assert auto["mb_per_s"] == {"min": 750, "median": 1125, "max": 1500, "n": 2}
    assert auto["x_ceiling"]["min"] == pytest.approx(0.6) and auto["x_ceiling"]["max"] == pytest.approx(0.6)
    assert auto["x_reference"]["median"] == pytest.approx(7.5)
    torch = _row(summary, "disk", "torch", "w8", 0.1)
    assert torch["x_reference"]["median"] == pytest.approx(1.0)
    assert auto["read_amplification"]["median"] == pytest.approx(1.03)
    assert auto["read_gap_used"] == ["8192"]


def test_failures_and_memory_flags():
    _, summary, _ = _summary()
    capi = _row(summary, "disk", "capi", "brand/auto", 0.1)
    assert capi["runs"] == 2 and capi["ok"] == 1 and capi["failures"] == ["failed: exit 1"]
    assert capi["mb_per_s"]["n"] == 1
    assert _row(summary, "disk", "brand", "brand/auto", 0.1)["larger_than_memory"] is True
    assert _row(summary, "disk", "brand", "brand/auto", 1.0)["larger_than_memory"] is False


def test_rows_are_ordered_by_profile_then_loader():
    _, summary, _ = _summary()
    profiles = [r["profile"] for r in summary]
    assert profiles == sorted(profiles, key=["disk", "net"].index)
    disk = [r["loader"] for r in summary if r["profile"] == "disk"]
    assert disk.index("torch") < disk.index("brand") < disk.index("capi")


def test_recommendation_skips_poorly_mixed_orders_and_follows_the_device():
    res, summary, _ = _summary()
    recs = recommend.recommend(summary, res["simulate"])
    by = {(r["profile"], r["budget"]): r for r in recs}
    disk = by[("disk", 0.1)]
    # chunk-shuffle is the fastest on disk but mixes only within a window: not recommended, but named.
    assert (disk["policy"], disk["read_gap"]) == ("brand", "auto")
    assert "chunk-shuffle/auto is faster" in disk["text"] and "8 KiB" in disk["text"]
    net = by[("net", 0.1)]
    assert (net["policy"], net["read_gap"]) == ("brand", "whole")
    assert recs[0]["profile"] == "disk"
    # Without order data every variant competes.
    assert recommend.recommend(summary, {})[0]["variant" if False else "policy"] == "chunk-shuffle"
