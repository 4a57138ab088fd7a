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


def net_serve_json(samples, seconds, stalls, warm, pushed, received, later=0):
    """Two epochs: epoch 0 with `stalls` waits (`warm` after its first batch), epoch 1 with `later`."""
    half = {"samples": samples // 2, "seconds": seconds / 2}
    return json.dumps(
        {
            "epochs": [
                {"epoch": 0, **half, "stalls": stalls, "stalls_warm": warm},
                {"epoch": 1, **half, "stalls": later, "stalls_warm": max(later - 1, 0)},
            ],
            "closed": {
                "bytes_read": 1,
                "stalls": stalls + later,
                "stall_p50_secs": 0.0,
                "stall_p99_secs": 0.002,
                "bytes_pushed": pushed,
                "bytes_received": received,
            },
        }
    )


def test_profiles_parse_and_refuse_what_is_not_one():
    p = dist.parse_profile("1gbit/2/0.1")
    assert (p.rate, p.rtt_ms, p.loss_percent) == ("1gbit", 2.0, 0.1)
    assert dist.parse_profile("10gbit/0.2/0%").loss_percent == 0.0
    for bad in ("1gbit", "1gbit/x/0", "1gbit/2/0.1/5"):
        try:
            dist.parse_profile(bad)
        except ValueError as e:
            assert bad in str(e)
        else:
            raise AssertionError(bad)
    assert dist.parse_builds("before=/a,after=/b") == [("before", "/a"), ("after", "/b")]


def test_link_totals_are_differences_over_every_link():
    before = {"node 0": {"up": {"bytes": 10, "dropped": 1}, "down": {"bytes": 5, "dropped": 0}}}
    after = {"node 0": {"up": {"bytes": 110, "dropped": 3}, "down": {"bytes": 50, "dropped": 2}}}
    assert dist.link_totals(before, after) == (100, 4)


def test_network_summary_counts_warm_waits_and_bytes_per_epoch():
    runs = []
    for rnd, (warm, build) in enumerate([(3, "before"), (0, "after"), (5, "before"), (0, "after")]):
        r = dist.NetRun("1gbit/2/0.1", 20.0, rnd // 2, build=build, epochs=2)
        r.nodes = [
            dist.parse_serve(n, net_serve_json(100, 2.0, warm + 1, warm, 4_000_000, 2_000_000, later=2 if warm else 0))
            for n in range(2)
        ]
        r.wire_bytes = 9_000_000
        runs.append(r)
    runs.append(dist.NetRun("1gbit/2/0.1", 20.0, 2, build="after", error="node 1 exited 1"))
    rows = dist.net_summary(runs)
    total = {r["build"]: r for r in rows if r["node"] == "total"}
    assert total["before"]["stalls_warm"]["median"] == 10  # 2 nodes x (3 + 1, 5 + 1) -> (8, 12)
    assert total["before"]["stalls_epoch0_warm"]["median"] == 8  # 2 nodes x (3, 5)
    assert total["before"]["stalls_later_per_epoch"]["median"] == 4  # 2 nodes x 2, one later epoch
    assert total["after"]["stalls_warm"]["max"] == 0
    assert total["after"]["failed"] == 1 and total["after"]["runs"] == 2
    assert total["before"]["net_bytes_per_epoch"]["median"] == 4_000_000  # 2 nodes x 4 MB over 2 epochs
    assert total["before"]["wire_bytes_per_epoch"]["median"] == 4_500_000
    node = next(r for r in rows if r["node"] == "node 0" and r["build"] == "after")
    assert node["net_bytes_per_epoch"]["median"] == 1_000_000
    table = dist.net_markdown(rows)
    assert "| 1gbit/2/0.1 | 20 ms/batch | after | total | 100 | 4.0 | 4.5 | 2 | 0 | 0 | 0.0 | 2.00 |" in table
    assert "(1 failed run(s) left out)" in table


def test_netns_link_qdisc_shapes_and_drops_as_asked():
    spec = importlib.util.spec_from_file_location(
        "netns", Path(__file__).resolve().parent.parent.parent / "scripts" / "netns.py"
    )
    netns = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(netns)
    assert netns.link_qdisc("ns", "eth0", None, 0.0) == []
    (only,) = netns.link_qdisc("ns", "eth0", "1gbit", 0.0)
    assert only[-7:] == ["tbf", "rate", "1gbit", "burst", str(256 << 10), "latency", "20ms"]
    cmds = netns.link_qdisc("ns", "eth0", "10gbit", 0.01)
    text = [" ".join(c) for c in cmds]
    assert any("pfifo limit 0" in t for t in text), text
    bpf = next(c for c in cmds if "bpf" in c)
    keep = int(bpf[bpf.index("bytecode") + 1].split(",")[2].split()[3])
    assert abs(keep / 2**32 - 0.99) < 1e-6
    # 10 Gbit/s needs a bigger bucket than 1 (1 ms of the rate).
    tbf = next(c for c in cmds if "tbf" in c)
    assert int(tbf[tbf.index("burst") + 1]) == 10**10 // 8 // 1000
    assert netns.rate_bps("500mbit") == 500 * 10**6
    try:
        netns.rate_bps("fast")
    except ValueError as e:
        assert "fast" in str(e)
    else:
        raise AssertionError("fast")
