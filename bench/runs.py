#!/usr/bin/env python3
"""Runs of records on the network profile: brand at run length 1 and auto
against tf.data, side by side, interleaved over rounds.

    bench/runs.py [--rounds 5] [--samples 8000] [--mean-kib 110] [--memory-mib 1536]

Each run is one epoch in its own memory group (--memory-mib) behind the
benchmark's "net" blkio throttle (0.38 GB/s and 3,000 read requests/s), the
dataset's pages evicted first: tf.data (TFRecord shards, parallel
interleave, shuffle buffer of 10 % of the samples) and `brand read` (brand
policy, memory 10 %, read gap auto) with `--run-length 1` (record by record),
`auto` (chosen from the probed request cost) and 4. Prints bytes/s as ratios to
tf.data (median, min and max over rounds), requests per sample, and
`brand simulate`'s chunk-mate spread at both run lengths. Root, cgroup v1
and the bench venv's Python (scripts/bench-venv.sh), as bench/run.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brandbench import cgroups, config, dataset, execute, parse  # noqa: E402
from run import NET_BPS, NET_IOPS  # noqa: E402

RUNNERS = Path(__file__).resolve().parent / "runners"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=8000)
    ap.add_argument("--mean-kib", type=float, default=110)
    ap.add_argument("--memory-mib", type=int, default=1536)
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/brand-bench"))
    ap.add_argument("--out", type=Path, default=Path("/var/tmp/brand-bench/out-runs"))
    a = ap.parse_args()

    brand = config.brand_bin()
    preset = config.PRESETS["small"]
    preset.samples = a.samples
    preset.mean_kib = a.mean_kib
    preset.min_kib = min(preset.min_kib, a.mean_kib / 2)
    preset.max_kib = max(a.mean_kib * 2, preset.min_kib + 1)
    ds = dataset.prepare(a.data, preset, brand, sys.executable)
    if ds.tfrecord is None:
        sys.exit("no TFRecord shards: run with the bench venv's Python (TensorFlow)")
    layout = cgroups.detect()
    groups = cgroups.Groups(layout, cgroups.block_device(a.data))
    ok, why = groups.throttle_supported()
    if not ok:
        sys.exit(f"no blkio throttle: {why}")
    groups.profile("net", NET_IOPS, NET_BPS)
    home = a.out / "home"
    home.mkdir(parents=True, exist_ok=True)
    ctx = execute.Context(groups, "net", ds.all_files(), log_dir=a.out / "logs")
    limit = a.memory_mib << 20
    buf = max(1, ds.samples // 10)

    def brand_item(run_length):
        return execute.Item("brand", f"L{run_length}", f"brand read, run length {run_length}",
                            [str(brand), "read", str(ds.pack), "--memory", "10%", "--read-gap", "auto",
                             "--run-length", run_length, "--epochs", "1", "--json"],
                            parse=parse.brand_read, env={"HOME": str(home)})

    tf = execute.Item("tf-tfrecord", "shuffle", "tf.data TFRecord + shuffle (10 %)",
                      [sys.executable, str(RUNNERS / "tf_tfrecord.py"), str(ds.tfrecord), "--buffer", str(buf),
                       "--batch-size", "64", "--samples", str(ds.samples)], kind="runner")
    items = [tf, brand_item("1"), brand_item("auto"), brand_item("4")]
    results = {it.variant: [] for it in items}
    try:
        # The read-gap probe, once, outside the measured runs (cached in HOME).
        execute.measure(brand_item("1"), ctx, limit)
        for rnd in range(a.rounds):
            k = rnd % len(items)
            for it in items[k:] + items[:k]:
                rec = execute.measure(it, ctx, limit)
                results[it.variant].append(rec)
                mb = rec.get("useful_mb_per_s")
                print(f"round {rnd + 1} {it.name}: {rec['status']} {mb and round(mb)} MB/s "
                      f"reads {rec.get('reads_issued')}", flush=True)
    finally:
        groups.close()
    spread = {}
    for run_length in (1, 2, 4, 8, 16):
        r = subprocess.run([str(brand), "simulate", str(ds.pack), "--memory", "10%", "--run-length",
                            str(run_length), "--json"], capture_output=True, text=True, check=True)
        e = json.loads(r.stdout)["epochs"][0]
        spread[run_length] = {"chunk_mate_dispersion": e["chunk_mate_dispersion"], "run_requests": e["run_requests"]}
    tf_mb = [r["useful_mb_per_s"] for r in results["shuffle"] if r.get("useful_mb_per_s")]
    print(f"\n{ds.samples} samples of {a.mean_kib:g} KiB mean, net profile, {a.rounds} rounds "
          f"(machine shared with other builds)")
    for v, recs in results.items():
        mbs = [r["useful_mb_per_s"] for r in recs if r.get("useful_mb_per_s")]
        if not mbs:
            print(f"{v}: no result ({[r['status'][:120] for r in recs]})")
            continue
        ratios = [m / t for m, t in zip(mbs, tf_mb)] if tf_mb else []
        reads = [r.get("reads_issued") for r in recs if r.get("reads_issued")]
        print(f"{v:>8}: median {statistics.median(mbs):.0f} MB/s (min {min(mbs):.0f}, max {max(mbs):.0f})"
              + (f", vs tf.data median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, "
                 f"max {max(ratios):.2f})" if ratios else "")
              + (f", requests/sample {statistics.median(reads) / ds.samples:.2f}" if reads else ""))
    print("simulate (brand, 10 %): run length -> chunk-mate dispersion, run requests")
    for run_length, s in spread.items():
        print(f"  L={run_length}: {s['chunk_mate_dispersion']:.3f}, {s['run_requests']}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps({"runs": results, "simulate": spread}, indent=1, default=str))


if __name__ == "__main__":
    main()
