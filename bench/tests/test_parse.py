"""Parsers of the programs' JSON output, on real outputs (abridged)."""

import json

import pytest

from brandbench import execute, orderq, parse

BRAND_READ = json.dumps([{
    "epoch": 0, "samples": 1000, "seconds": 0.286, "samples_per_sec": 3494.0, "useful_mb_per_sec": 393.5,
    "read_mb_per_sec": 405.3, "read_amplification": 1.03, "exactly_once": True, "peak_rss_bytes": 173027328,
    "metrics": {"bytes_read": 116015104, "bytes_served": 112640020, "samples_served": 1000, "reads_issued": 816,
                "refills": 131, "stalls": 116, "stall_p50_secs": 6.97e-06, "stall_p95_secs": 0.01,
                "stall_p99_secs": 0.0357, "stall_max_secs": 0.0402, "peak_resident_bytes": 10337237,
                "buffered_fallback": False, "read_gap": 8192}}])


def test_brand_read():
    r = parse.brand_read(BRAND_READ)
    assert r["samples"] == 1000 and r["bytes"] == 112640020 and r["seconds"] == 0.286
    assert r["loader_read_bytes"] == 116015104 and r["read_gap_used"] == 8192
    assert r["stall_p99_s"] == 0.0357 and r["exactly_once"] is True
    whole = json.loads(BRAND_READ)
    whole[0]["metrics"]["read_gap"] = None
    assert parse.brand_read(json.dumps(whole))["read_gap_used"] == "whole"


def test_bench_files():
    r = parse.bench_files('{"files": 1000, "bytes": 112640020, "threads": 8, "seconds": 0.0577, '
                          '"samples_per_sec": 17333.6, "useful_mb_per_sec": 1952.4, "cache_dropped": false}')
    assert (r["samples"], r["bytes"], r["threads"], r["seconds"]) == (1000, 112640020, 8, 0.0577)


def test_brand_throughput():
    out = ('{"epochs": [{"epoch": 0, "samples": 1000, "seconds": 0.5, "cpu_seconds": 0.2, '
           '"samples_per_sec": 2000.0, "mb_per_sec": 225.28}], "metrics": {"bytes_read": 120000000, '
           '"bytes_served": 112640020, "read_amplification": 1.0653, "reads_issued": 800, "stalls": 10, '
           '"stall_p50_secs": 0.0001, "stall_p99_secs": 0.02, "stall_max_secs": 0.03, '
           '"peak_resident_bytes": 11000000, "buffered_fallback": 0}}\n')
    r = parse.brand_throughput(out)
    assert r["samples"] == 1000 and r["bytes"] == 112640020 and r["seconds"] == 0.5
    assert r["loader_read_amplification"] == 1.0653 and r["buffered_fallback"] is False


def test_fio_with_warnings_before_json():
    job = {"jobs": [{"jobname": "ceiling", "job_runtime": 1000, "usr_cpu": 10.0, "sys_cpu": 30.0,
                     "read": {"io_bytes": 2_000_000_000, "bw_bytes": 2_000_000_000, "iops": 15258.8, "runtime": 1000,
                              "clat_ns": {"percentile": {"50.000000": 1_500_000, "99.000000": 4_000_000}}}}]}
    r = parse.fio("fio: note: both iodepth >= 1 and synchronous I/O engine are selected\n" + json.dumps(job))
    assert r["bw_bytes"] == 2e9 and r["iops"] == 15258.8 and r["seconds"] == 1.0
    assert r["fio_cpu_seconds"] == pytest.approx(0.4)
    assert r["clat_p50_s"] == pytest.approx(0.0015) and r["clat_p99_s"] == pytest.approx(0.004)


def test_runner_lines_ignore_library_noise():
    out = ("some library banner\n@@brandbench {\"ready\": true}\nWARNING: x\n"
           "@@brandbench {\"result\": {\"samples\": 3}}\n@@brandbench {broken\n")
    assert parse.runner_lines(out) == [{"ready": True}, {"result": {"samples": 3}}]


def test_finish_derives_rates_amplification_cpu():
    r = execute.finish({"bytes": 2_000_000_000, "seconds": 4.0, "samples": 1000, "device_read_bytes": 3_000_000_000,
                        "cpu_seconds": 5.0})
    assert r["useful_mb_per_s"] == 500 and r["samples_per_s"] == 250
    assert r["read_amplification"] == 1.5 and r["cpu_s_per_gb"] == 2.5
    # Without device counters, the loader's own count stands in.
    r = execute.finish({"bytes": 100, "seconds": 1.0, "loader_read_bytes": 200, "device_read_bytes": None})
    assert r["read_amplification"] == 2.0


def test_order_quality_interpretation():
    ok = ('@@brandbench {"unavailable": {"brand": "brand_tf: not built"}}\n'
          '@@brandbench {"result": {"methods": {"full-shuffle": {"accuracy": [0.9, 1.0], "labels_per_batch": 9}}}}\n')
    r = orderq.interpret(0, ok)
    assert r["status"] == "ok" and r["unavailable"] == {"brand": "brand_tf: not built"}
    assert orderq.summary(r)["full-shuffle"] == {"mean": 0.95, "min": 0.9, "max": 1.0}
    bad = orderq.interpret(1, '@@brandbench {"error": "ImportError: no sklearn"}\n', "Traceback\nImportError")
    assert bad["status"].startswith("failed: ImportError: no sklearn")
