#!/usr/bin/env python3
"""Runs of records on the network profile: brand at run length 1 and auto
against tf.data, side by side, interleaved over rounds.

    bench/runs.py [--rounds 5] [--samples 8000] [--mean-kib 110] [--memory-mib 1536] [--no-tf-op]

Each run is one epoch in its own memory group (--memory-mib) behind the
benchmark's "net" blkio throttle (0.38 GB/s and 3,000 read requests/s), the
dataset's pages evicted first: tf.data (TFRecord shards, parallel
interleave, shuffle buffer of 10 % of the samples) and `brand read` (brand
policy, memory 10 %, read gap auto) with `--run-length 1` (record by record),
`auto` (chosen from the probed request cost) and 4, and brand.tf's
`BrandDataset` (the TF op, batches of 64, same settings) at run length 1 and
auto. Prints bytes/s as ratios to tf.data (median, min and max over rounds),
requests per sample, the spread of the order each TF pipeline served (its
disk neighbours' mean distance in the epoch over a uniform shuffle's: 1 =
uniform; disk neighbours are adjacent records of a brand chunk or of a
TFRecord shard), and `brand simulate`'s chunk-mate spread (the same measure)
for run lengths 1 to 16. Root, cgroup v1
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
    ap.add_argument("--no-tf-op", action="store_true", help="leave out brand.tf's BrandDataset")
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

    orders = a.out / "orders"
    orders.mkdir(parents=True, exist_ok=True)
    tf = execute.Item("tf-tfrecord", "shuffle", "tf.data TFRecord + shuffle (10 %)",
                      [sys.executable, str(RUNNERS / "tf_tfrecord.py"), str(ds.tfrecord), "--buffer", str(buf),
                       "--batch-size", "64", "--samples", str(ds.samples), "--order-out",
                       str(orders / "shuffle.npy")], kind="runner")

    def tf_op_item(run_length):
        # The op library stays in the real cache; HOME is the runs' (the read-gap probe's cache).
        env = {"HOME": str(home), "BRAND_CACHE_DIR": os.environ.get("BRAND_CACHE_DIR")
               or str(Path.home() / ".cache" / "brand")}
        return execute.Item("tf-op", f"op-L{run_length}", f"BrandDataset, run length {run_length}",
                            [sys.executable, str(RUNNERS / "tf_brand.py"), str(ds.pack), "--memory", "10%",
                             "--read-gap", "auto", "--run-length", run_length, "--batch-size", "64",
                             "--order-out", str(orders / f"op-L{run_length}.npy")],
                            kind="runner", env=env)

    items = [tf, brand_item("1"), brand_item("auto"), brand_item("4")]
    neighbours = disk_neighbours(ds, a.out)
    try:
        # The read-gap probe, once, outside the measured runs (cached in HOME).
        execute.measure(brand_item("auto"), ctx, limit)
        if not a.no_tf_op:
            built = subprocess.run([sys.executable, "-m", "brand.tf", "build"], capture_output=True, text=True,
                                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            if built.returncode != 0:
                sys.exit(f"brand.tf's op does not build: {built.stderr.strip()[-500:]}")
            # The op decides auto itself (brand_reader::decide, as brand read
            # does), from the probe cached by the warm-up run.
            items += [tf_op_item("1"), tf_op_item("auto")]
        results = {it.variant: [] for it in items}
        for rnd in range(a.rounds):
            k = rnd % len(items)
            for it in items[k:] + items[:k]:
                rec = execute.measure(it, ctx, limit)
                order = orders / f"{it.variant}.npy"
                if it.kind == "runner" and rec["status"] == "ok" and order.exists():
                    rec["spread"] = order_spread(order, neighbours["tf" if it.loader == "tf-tfrecord" else "brand"])
                    order.unlink()
                results[it.variant].append(rec)
                mb = rec.get("useful_mb_per_s")
                print(f"round {rnd + 1} {it.name}: {rec['status']} {mb and round(mb)} MB/s "
                      f"reads {rec.get('reads_issued')} spread {rec.get('spread')}", flush=True)
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
        # Same-round ratios (a failed run leaves its round out).
        ratios = [r["useful_mb_per_s"] / t["useful_mb_per_s"] for r, t in zip(recs, results["shuffle"])
                  if r.get("useful_mb_per_s") and t.get("useful_mb_per_s")]
        reads = [r.get("reads_issued") for r in recs if r.get("reads_issued")]
        dev = [r["device_read_bytes"] / r["bytes"] for r in recs if r.get("device_read_bytes") and r.get("bytes")]
        spreads = [r["spread"] for r in recs if r.get("spread") is not None]
        print(f"{v:>8}: median {statistics.median(mbs):.0f} MB/s (min {min(mbs):.0f}, max {max(mbs):.0f})"
              + (f", vs tf.data median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, "
                 f"max {max(ratios):.2f})" if ratios else "")
              + (f", requests/sample {statistics.median(reads) / ds.samples:.2f}" if reads else "")
              + (f", device bytes/served {statistics.median(dev):.2f}" if dev else "")
              + (f", spread {statistics.median(spreads):.3f} (min {min(spreads):.3f}, max {max(spreads):.3f})"
                 if spreads else ""))
    print("simulate (brand, 10 %): run length -> chunk-mate dispersion, run requests")
    for run_length, s in spread.items():
        print(f"  L={run_length}: {s['chunk_mate_dispersion']:.3f}, {s['run_requests']}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps({"runs": results, "simulate": spread}, indent=1, default=str))


def disk_neighbours(ds, out: Path) -> dict:
    """Pairs of ids stored next to each other: adjacent records of a brand chunk
    (ids are pack positions), and of a TFRecord shard (read from the shards)."""
    import numpy as np

    ids = np.arange(ds.samples - 1)
    same_chunk = ids // ds.chunk_size == (ids + 1) // ds.chunk_size
    brand = (ids[same_chunk], ids[same_chunk] + 1)
    order = out / "tfrecord-order.npz"
    subprocess.run([sys.executable, str(RUNNERS / "tfrecord_order.py"), str(ds.tfrecord), str(order)], check=True)
    with np.load(order) as shards:
        per = [shards[k] for k in shards.files]
    tf = (np.concatenate([s[:-1] for s in per]), np.concatenate([s[1:] for s in per]))
    return {"brand": brand, "tf": tf}


def order_spread(order_file: Path, pairs) -> float | None:
    """Mean distance in serve order of disk neighbours, over (N + 1) / 3 (that
    of two distinct uniform positions): `brand simulate`'s chunk-mate
    dispersion, measured on the order served. None if a sample is missing."""
    import numpy as np

    order = np.load(order_file)
    n = len(order)
    pos = np.full(n, -1, dtype=np.int64)
    if n == 0 or order.max() >= n:
        return None
    pos[order] = np.arange(n)
    if (pos < 0).any():
        return None
    a, b = pairs
    return float(np.abs(pos[a] - pos[b]).mean() / ((n + 1) / 3))


if __name__ == "__main__":
    main()
