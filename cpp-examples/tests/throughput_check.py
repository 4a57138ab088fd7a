#!/usr/bin/env python3
"""brand_throughput reports what it read: run it for 2 epochs (JSON and text)
and check the epochs, sample counts, byte counts and metrics it prints.

usage: throughput_check.py BRAND_THROUGHPUT DATASET SAMPLES
"""

import json
import subprocess
import sys

CONFIG = 'memory = "50%"\nread_gap = "whole"\nbatch_size = 32\n'


def fail(msg):
    print("throughput_check: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    prog, dataset, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for extra in ([], ["--per-sample"], ["--touch", "all"]):
        run = subprocess.run([prog, dataset, "--config", CONFIG, "--epochs", "2", "--json", *extra],
                             capture_output=True, text=True)
        if run.returncode != 0:
            fail(f"{extra}: exit {run.returncode}: {run.stderr}")
        doc = json.loads(run.stdout)
        epochs, m = doc["epochs"], doc["metrics"]
        if [e["epoch"] for e in epochs] != [0, 1] or any(e["samples"] != n for e in epochs):
            fail(f"{extra}: epochs {epochs}")
        if not all(e["samples_per_sec"] > 0 and e["mb_per_sec"] > 0 for e in epochs):
            fail(f"{extra}: rates {epochs}")
        if not (m["bytes_read"] >= m["bytes_served"] > 0 and m["read_amplification"] >= 1.0):
            fail(f"{extra}: metrics {m}")
    text = subprocess.run([prog, dataset, "--config", CONFIG], capture_output=True, text=True)
    for want in ("samples/s", "read amplification", "stalls", "peak resident"):
        if text.returncode != 0 or want not in text.stdout:
            fail(f"text output lacks {want!r}: {text.stdout} {text.stderr}")
    bad = subprocess.run([prog, dataset + "-missing"], capture_output=True, text=True)
    if bad.returncode != 1 or "BRAND_ERR_NOT_FOUND" not in bad.stderr:
        fail(f"a missing dataset: exit {bad.returncode}, {bad.stderr!r}")
    print("throughput_check: ok")


if __name__ == "__main__":
    main()
