"""Parsers of what the measured programs print (pure functions, tested)."""

from __future__ import annotations

import json

from .execute import TAG


def brand_read(stdout: str) -> dict:
    """`brand read --json --epochs 1`: a list with one object per epoch."""
    e = json.loads(stdout)[0]
    m = e["metrics"]
    return {
        "samples": e["samples"],
        "bytes": m["bytes_served"],
        "seconds": e["seconds"],
        "exactly_once": e["exactly_once"],
        "loader_read_bytes": m["bytes_read"],
        "loader_read_amplification": e["read_amplification"],
        "loader_peak_rss_bytes": e.get("peak_rss_bytes"),
        "stall_p50_s": m.get("stall_p50_secs"),
        "stall_p99_s": m.get("stall_p99_secs"),
        "stall_max_s": m.get("stall_max_secs"),
        "reads_issued": m.get("reads_issued"),
        # None: whole chunks; else the gap in bytes the engine used.
        "read_gap_used": "whole" if m.get("read_gap") is None else m["read_gap"],
        "run_length": m.get("run_length"),
        "buffered_fallback": m.get("buffered_fallback"),
    }


def bench_files(stdout: str) -> dict:
    """`brand bench files --json`."""
    r = json.loads(stdout)
    return {
        "samples": r["files"],
        "bytes": r["bytes"],
        "seconds": r["seconds"],
        "threads": r["threads"],
        "exactly_once": None,
    }


def brand_throughput(stdout: str) -> dict:
    """cpp-examples' `brand_throughput --json --epochs 1`."""
    r = json.loads(stdout)
    e = r["epochs"][0]
    m = r["metrics"]
    return {
        "samples": e["samples"],
        "bytes": m["bytes_served"],
        "seconds": e["seconds"],
        "consumer_cpu_seconds": e.get("cpu_seconds"),
        "exactly_once": None,
        "loader_read_bytes": m["bytes_read"],
        "loader_read_amplification": m["read_amplification"],
        "loader_peak_rss_bytes": None,
        "stall_p50_s": m.get("stall_p50_secs"),
        "stall_p99_s": m.get("stall_p99_secs"),
        "stall_max_s": m.get("stall_max_secs"),
        "reads_issued": m.get("reads_issued"),
        "buffered_fallback": bool(m.get("buffered_fallback")),
    }


def fio(stdout: str) -> dict:
    """fio --output-format=json (one job, group reporting): read figures."""
    # fio may print warnings before the JSON.
    start = stdout.find("{")
    r = json.loads(stdout[start:])
    j = r["jobs"][0]
    rd = j["read"]
    runtime_s = rd.get("runtime", j.get("job_runtime", 0)) / 1000.0
    cpu = (j.get("usr_cpu", 0.0) + j.get("sys_cpu", 0.0)) / 100.0 * runtime_s
    clat = rd.get("clat_ns", {}).get("percentile", {})
    return {
        "bw_bytes": rd["bw_bytes"],
        "iops": rd["iops"],
        "bytes": rd["io_bytes"],
        "seconds": runtime_s,
        "fio_cpu_seconds": cpu,
        "clat_p50_s": clat.get("50.000000", 0) / 1e9 if clat else None,
        "clat_p99_s": clat.get("99.000000", 0) / 1e9 if clat else None,
    }


def runner_lines(stdout: str) -> list[dict]:
    """Every protocol line a runner printed."""
    out = []
    for line in stdout.splitlines():
        if line.startswith(TAG):
            try:
                out.append(json.loads(line[len(TAG):]))
            except json.JSONDecodeError:
                pass
    return out
