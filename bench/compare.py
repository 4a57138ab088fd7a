#!/usr/bin/env python3
"""Side-by-side benchmark of brand against the device and a per-file loader.

Everything is measured in one run, interleaved over rounds, and reported as
medians and ratios (never against a table from another day):

  fio      random 128 KiB O_DIRECT reads, io_uring, QD 32, over the packed
           segments: the device's ceiling for this access size
  files    every source file once, random order, open/read/close, 8 threads,
           page cache dropped first (PyTorch-style)
  brand    `brand read` one epoch per policy / read gap

Usage: bench/compare.py [--dir DIR] [--samples N] [--memory 10%] [--rounds 3]
Needs a release build (cargo build --release) and fio (apt-get install fio).
The dataset is generated once into DIR and reused.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRAND = os.environ.get("BRAND_BIN", os.path.join(ROOT, "target", "release", "brand"))


def sh(*args, capture=True):
    r = subprocess.run([str(a) for a in args], capture_output=capture, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, args))}\n{r.stderr}")
    return r.stdout


def ensure_dataset(d, samples):
    files, ds = os.path.join(d, "files"), os.path.join(d, "dataset")
    stamp = os.path.join(d, f".samples-{samples}")
    if not os.path.exists(stamp):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        print(f"generating {samples} samples (110 KiB mean) in {files} ...", flush=True)
        sh(BRAND, "gen", files, "--samples", samples, "--classes", 1000, "--seed", 7, capture=False)
        sh(BRAND, "pack", files, "-o", ds, "--seed", 7, capture=False)
        open(stamp, "w").close()
    return files, ds


def fio_cmd(ds, seconds):
    segs = sorted(f for f in os.listdir(ds) if f.endswith(".brd"))
    return [
        # --readonly: fio must never lay out (write) the dataset's segments.
        "fio", "--readonly", "--name=ceiling", "--filename=" + ":".join(os.path.join(ds, s) for s in segs),
        "--rw=randread", "--bs=128k", "--iodepth=32", "--ioengine=io_uring", "--direct=1",
        f"--runtime={seconds}", "--time_based", "--group_reporting", "--output-format=json",
    ]


def fio(ds, seconds):
    out = sh(*fio_cmd(ds, seconds))
    return json.loads(out)["jobs"][0]["read"]["bw_bytes"] / 1e6


def files_baseline(files):
    r = json.loads(sh(BRAND, "bench", "files", files, "--threads", 8, "--drop-caches", "--json"))
    return r["useful_mb_per_sec"]


def brand_read(ds, memory, policy, gap):
    r = json.loads(sh(BRAND, "read", ds, "--memory", memory, "--policy", policy, "--read-gap", gap, "--json"))[0]
    assert r["exactly_once"], "brand read served a sample twice or not at all"
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default="/var/tmp/brand-bench")
    p.add_argument("--samples", type=int, default=80000, help="80,000 x 110 KiB = 8.8 GB")
    p.add_argument("--memory", default="10%")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fio-seconds", type=int, default=10)
    p.add_argument("--skip-whole", action="store_true", help="skip the (slow, ~9x) whole-chunk run")
    a = p.parse_args()
    if not shutil.which("fio"):
        sys.exit("fio is needed: apt-get install fio")
    files, ds = ensure_dataset(a.dir, a.samples)
    info = json.loads(sh(BRAND, "inspect", ds, "--json"))
    budget = info["stored_bytes"] * float(a.memory.rstrip("%")) / 100 if a.memory.endswith("%") else None
    print(f"dataset: {info['samples']} samples, {info['stored_bytes'] / 1e9:.2f} GB; memory {a.memory}", flush=True)

    variants = [("brand", "auto"), ("brand", "0"), ("direct", "0")]
    res = {"fio": [], "files": []}
    details = {}
    for r in range(a.rounds):
        res["fio"].append(fio(ds, a.fio_seconds))
        res["files"].append(files_baseline(files))
        for pol, gap in variants:
            rep = brand_read(ds, a.memory, pol, gap)
            res.setdefault(f"{pol}/{gap}", []).append(rep["useful_mb_per_sec"])
            details[f"{pol}/{gap}"] = rep
        line = "  ".join(f"{k} {v[-1]:.0f}" for k, v in res.items())
        print(f"round {r + 1}: {line} (MB/s useful)", flush=True)
    if not a.skip_whole:
        rep = brand_read(ds, a.memory, "brand", "whole")
        res["brand/whole"] = [rep["useful_mb_per_sec"]]
        details["brand/whole"] = rep

    med = {k: statistics.median(v) for k, v in res.items()}
    best = max((k for k in med if k.startswith("brand/")), key=lambda k: med[k])
    print("\nmedian useful MB/s (brand: bytes served; fio: bytes read)")
    for k, v in med.items():
        extra = ""
        if k in details:
            d = details[k]
            m = d["metrics"]
            extra = (f"  amp {d['read_amplification']:.2f}  gap {m['read_gap']}  stall p99 "
                     f"{m['stall_p99_secs'] * 1e3:.1f} ms  peak RSS {d['peak_rss_bytes'] / 2**20:.0f} MiB")
        print(f"  {k:14s} {v:8.0f}{extra}")
    print(f"\nbest brand variant: {best}")
    print(f"  vs fio (device ceiling):  {med[best] / med['fio']:.2f}x")
    print(f"  vs per-file, 8 threads:   {med[best] / med['files']:.2f}x")
    if "brand/whole" in med:
        print(f"  vs whole-chunk reads:     {med[best] / med['brand/whole']:.2f}x")
    if budget:
        limit = 1.1 * budget + 64 * 2**20
        rss = details[best]["peak_rss_bytes"]
        print(f"  peak RSS {rss / 2**20:.0f} MiB vs 1.1 x budget + 64 MiB = {limit / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
