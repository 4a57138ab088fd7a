"""bench/dist.py: parsing brand serve / brand read output, totals, spreads, the table."""

import importlib.util
import json
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("dist", Path(__file__).resolve().parent.parent / "dist.py")
dist = importlib.util.module_from_spec(_spec)
sys.modules["dist"] = dist  # dataclasses look their module up
_spec.loader.exec_module(dist)


def serve_json(samples, seconds, bytes_read, stalls=2, p50=0.001, p99=0.004):
    return json.dumps(
        {
            "epochs": [{"epoch": 0, "rank": 0, "samples": samples, "seconds": seconds, "metrics": {}}],
            "closed": {
                "bytes_read": bytes_read,
                "stalls": stalls,
                "stall_p50_secs": p50,
                "stall_p99_secs": p99,
            },
        }
    )


def read_json(samples, seconds, bytes_read):
    m = {"bytes_read": bytes_read, "stalls": 0, "stall_p50_secs": 0.0, "stall_p99_secs": 0.0}
    return json.dumps([{"samples": samples, "seconds": seconds, "metrics": m}])


def test_parsers_take_samples_time_and_metrics():
    r = dist.parse_serve(2, serve_json(300, 2.0, 1_000_000))
    assert (r.node, r.samples, r.bytes_read, r.stalls) == (2, 300, 1_000_000, 2)
    assert r.samples_per_sec == 150.0
    assert (r.stall_p50_secs, r.stall_p99_secs) == (0.001, 0.004)
    r = dist.parse_read(1, read_json(100, 4.0, 5))
    assert (r.samples_per_sec, r.bytes_read) == (25.0, 5)


def test_total_uses_the_slowest_node_and_sums_bytes():
    run = dist.Run("dist-partitioned", 0)
    run.nodes = [
        dist.parse_serve(0, serve_json(100, 1.0, 10, p99=0.002)),
        dist.parse_serve(1, serve_json(100, 4.0, 20, p99=0.009)),
    ]
    t = run.total()
    assert t["samples_per_sec"] == 50.0  # 200 samples over the slowest 4 s
    assert t["bytes_read"] == 30
    assert t["device_read_bytes"] is None  # not throttled: unknown, not zero
    assert t["stall_p99_secs"] == 0.009
    assert t["stalls"] == 4


def test_summary_spreads_over_rounds_and_leaves_out_failed_runs():
    runs = []
    for rnd, secs in enumerate([1.0, 2.0, 4.0]):
        r = dist.Run("independent", rnd)
        r.nodes = [dist.parse_read(0, read_json(100, secs, 7))]
        runs.append(r)
    runs.append(dist.Run("independent", 3, error="node 0 exited 1"))
    s = dist.summarise(runs)["independent"]
    assert (s["runs"], s["failed"]) == (3, 1)
    sps = s["rows"]["node 0"]["samples_per_sec"]
    assert (sps["median"], sps["min"], sps["max"], sps["n"]) == (50.0, 25.0, 100.0, 3)
    table = dist.markdown({"independent": s})
    assert "| independent | node 0 | 50 (25–100) |" in table
    assert "1 failed run(s)" in table


def test_ratios_are_against_independent():
    def one(config, secs, bytes_read):
        r = dist.Run(config, 0)
        r.nodes = [dist.parse_read(0, read_json(100, secs, bytes_read))]
        return r

    s = dist.summarise([one("independent", 2.0, 300), one("dist-shared", 1.0, 100)])
    r = dist.ratios(s)
    assert r["dist-shared"]["samples_per_sec_vs_independent"] == 2.0
    assert abs(r["dist-shared"]["bytes_read_vs_independent"] - 1 / 3) < 1e-12
    assert dist.ratios(dist.summarise([one("single", 1.0, 1)])) == {}
