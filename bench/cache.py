#!/usr/bin/env python3
"""K jobs on one machine, alone against attached to one `brand cache`.

Each job is `brand read` with its own seed. "alone": K jobs, each with a
memory budget of M/K, each reading the dataset itself. "cache": one
`brand cache` holding M, and K jobs attached to it (`--cache SOCKET`); the
cache fills its memory with the reads of its own plan of the same policy
and read gap as the lone jobs (`--policy`, `--read-gap`), so attached and
lone compare on the same policy. "chunk-shuffle": one lone job of that
policy, the order-quality reference of a shuffle buffer.
Every process runs in a memory group of its budget plus a runtime
allowance; all of them share one blkio group throttled as network storage
(default 0.38 GB/s and 3,000 IOPS: one device for the machine), whose read
bytes are the device bytes. CPU is the cpuacct group's (every process of the
run, the cache included).

For K in --jobs and both modes, interleaved in --rounds rounds (the order
rotates each round), the page cache of the dataset evicted before each run:
per-job samples/s (each job's mean over its epochs), device bytes per epoch
(the run's bytes / epochs), CPU seconds, and each job's order quality as
`brand read` reports it (`brand simulate`'s metrics on the served order,
one function for both): chunk-mate dispersion (1 = uniform shuffle),
Spearman of positions against the job's previous epoch, label diversity. Ratios are taken per round, then the
median: attached device bytes per epoch against one job alone, attached
per-job throughput against a lone job's (K = 1 alone). With --laggard-ms,
the largest K attached again with job 1 computing that long per batch: the
others' samples/s, the laggard's, the samples the cache dropped while the
laggard still needed them and the device bytes that cost.

    sudo python3 bench/cache.py --brand target/release/brand --work /var/tmp/brand-cache-bench
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brandbench.cgroups import Groups, block_device, detect, evict  # noqa: E402

# The harness's runtime allowance (bench/brandbench/config.py).
ALLOWANCE = 640 << 20


def prepare(args) -> Path:
    ds = args.work / "ds"
    if (args.work / ".done").exists():
        return ds
    args.work.mkdir(parents=True, exist_ok=True)
    src = args.work / "files"
    subprocess.run([args.brand, "gen", str(src), "--samples", str(args.samples), "--seed", "5", "--force"], check=True)
    subprocess.run([args.brand, "pack", str(src), "-o", str(ds), "--seed", "5", "--force"], check=True)
    subprocess.run(["rm", "-rf", str(src)], check=True)
    os.sync()
    (args.work / ".done").write_text("")
    return ds


def dataset_bytes(ds: Path) -> int:
    return sum(p.stat().st_size for p in ds.glob("data-*.brd"))


def run(args, groups: Groups, ds: Path, mode: str, k: int) -> dict:
    evict(sorted(ds.glob("data-*.brd")))
    total = args.memory_bytes
    common = ["--epochs", str(args.epochs), "--batch", "256", "--read-gap", args.read_gap, "--json"]
    policy = "chunk-shuffle" if mode == "chunk-shuffle" else args.policy
    procs = []
    cache = None
    sock = args.work / f"cache-{os.getpid()}.sock"
    before = groups.run_group("net", None)  # the profile's counters (shared by every group of the run)
    start_counters = before.counters()
    attached = mode in ("cache", "laggard")
    if attached:
        g = groups.run_group("net", total + ALLOWANCE)
        cache = subprocess.Popen(
            g.wrap([args.brand, "cache", str(ds), "--memory", str(total), "--socket", str(sock), "--read-gap", args.read_gap,
                    "--policy", policy, "--json"]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        t0 = time.monotonic()
        while not sock.exists():
            if cache.poll() is not None or time.monotonic() - t0 > 30:
                raise RuntimeError(f"brand cache did not start: {cache.stderr.read() if cache.stderr else ''}")
            time.sleep(0.05)
    for j in range(k):
        if attached:
            argv = [args.brand, "read", str(ds), "--cache", str(sock), "--seed", str(j + 1)] + common
            if mode == "laggard" and j == 0:
                argv += ["--compute-ms", str(args.laggard_ms)]
            limit = ALLOWANCE
        else:
            argv = [args.brand, "read", str(ds), "--memory", str(total // k), "--seed", str(j + 1)]
            argv += ["--policy", policy] + common
            limit = total // k + ALLOWANCE
        g = groups.run_group("net", limit)
        procs.append(subprocess.Popen(g.wrap(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    per_job = []
    quality = {"chunk_mate_dispersion": [], "spearman_vs_previous": [], "label_diversity": []}
    once = True
    for j, p in enumerate(procs):
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"{mode} K={k}: a job failed: {err.strip()}")
        epochs = json.loads(out)
        rate = statistics.mean(e["samples_per_sec"] for e in epochs)
        if mode == "laggard" and j == 0:
            laggard_rate = rate
        else:
            per_job.append(rate)
        once = once and all(e["exactly_once"] for e in epochs)
        for e in epochs:
            for key, values in quality.items():
                if e["order"].get(key) is not None:
                    values.append(e["order"][key])
    report = None
    if cache is not None:
        cache.send_signal(2)
        out, err = cache.communicate(timeout=60)
        report = json.loads(out) if cache.returncode == 0 and out.strip() else None
    end = before.counters()
    return {
        "laggard_samples_per_sec": laggard_rate if mode == "laggard" else None,
        "dropped_needed": report["dropped_needed"] if report else None,
        "mode": mode,
        "k": k,
        "per_job_samples_per_sec": statistics.mean(per_job),
        "device_bytes_per_epoch": (end.device_read_bytes - start_counters.device_read_bytes) / args.epochs,
        "cpu_seconds": end.cpu_seconds - start_counters.cpu_seconds,
        "exactly_once": once,
        # Means over the run's jobs and epochs (Spearman: epochs after the first).
        **{key: statistics.mean(v) if v else None for key, v in quality.items()},
        "cache": report,
    }


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.3g} ({min(xs):,.3g}-{max(xs):,.3g})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brand", default="target/release/brand")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/brand-cache-bench"))
    ap.add_argument("--samples", type=int, default=8000, help="samples of mean 110 KiB (default 8000: ~0.9 GB)")
    ap.add_argument("--memory", default="10%", help="total memory, as a percentage of the dataset's bytes")
    ap.add_argument("--jobs", default="1,2,4")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--read-gap", default="auto", help="the lone jobs' and the cache's (default: brand's)")
    ap.add_argument("--policy", default="brand", help="the lone jobs' and the cache's fill plan's (default: brand's)")
    ap.add_argument("--iops", type=int, default=3000)
    ap.add_argument("--bps", type=int, default=380_000_000)
    ap.add_argument("--laggard-ms", type=float, default=0,
                    help="also run the largest K attached with job 1 computing this long per batch (a laggard)")
    ap.add_argument("--out", type=Path, default=None, help="write the runs as JSON here")
    args = ap.parse_args(argv)
    ds = prepare(args)
    args.memory_bytes = int(dataset_bytes(ds) * float(args.memory.rstrip("%")) / 100)
    layout = detect()
    groups = Groups(layout, block_device(ds))
    ok, why = groups.throttle_supported()
    if not ok:
        print(f"not throttled: {why}", file=sys.stderr)
    groups.profile("net", args.iops, args.bps)
    ks = [int(k) for k in args.jobs.split(",")]
    configs = [("alone", k) for k in ks] + [("cache", k) for k in ks] + [("chunk-shuffle", 1)]
    if args.laggard_ms > 0:
        configs.append(("laggard", max(ks)))
    runs = []
    try:
        for rnd in range(args.rounds):
            order = configs[rnd % len(configs):] + configs[: rnd % len(configs)]
            for mode, k in order:
                r = run(args, groups, ds, mode, k)
                r["round"] = rnd
                runs.append(r)
                print(json.dumps({key: v for key, v in r.items() if key != "cache"}), flush=True)
    finally:
        groups.close()
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1))
    print(f"\n{dataset_bytes(ds) / 1e9:.2f} GB dataset, {args.memory} total memory ({args.memory_bytes / 1e6:.0f} MB), "
          f"{args.epochs} epochs, {args.rounds} rounds, {args.bps / 1e6:.0f} MB/s + {args.iops} IOPS, "
          f"policy {args.policy} (lone jobs and the cache's fill), read gap {args.read_gap}\n")
    print("| mode | K | per-job samples/s | device GB per epoch | CPU s | exactly once | dropped while needed "
          "| dispersion | Spearman vs previous epoch | label diversity |")
    print("|---|---|---|---|---|---|---|---|---|---|")

    def col(rs, key, scale=1.0):
        xs = [r[key] * scale for r in rs if r.get(key) is not None]
        return spread(xs) if xs else "-"

    for mode, k in configs:
        rs = [r for r in runs if r["mode"] == mode and r["k"] == k]
        print(f"| {mode} | {k} | {col(rs, 'per_job_samples_per_sec')} | {col(rs, 'device_bytes_per_epoch', 1e-9)} | "
              f"{col(rs, 'cpu_seconds')} | {all(r['exactly_once'] for r in rs)} | {col(rs, 'dropped_needed')} | "
              f"{col(rs, 'chunk_mate_dispersion')} | {col(rs, 'spearman_vs_previous')} | {col(rs, 'label_diversity')} |")
    lag = [r for r in runs if r["mode"] == "laggard"]
    if lag:
        print(f"\nlaggard (job 1 computing {args.laggard_ms} ms per batch): its samples/s "
              f"{spread([r['laggard_samples_per_sec'] for r in lag])}; the others' in the table")
    print()
    for k in ks:
        dev, thr, thr_alone, disp = [], [], [], []
        for rnd in range(args.rounds):
            one = next(r for r in runs if r["round"] == rnd and r["mode"] == "alone" and r["k"] == 1)
            alone = next(r for r in runs if r["round"] == rnd and r["mode"] == "alone" and r["k"] == k)
            att = next(r for r in runs if r["round"] == rnd and r["mode"] == "cache" and r["k"] == k)
            dev.append(att["device_bytes_per_epoch"] / max(one["device_bytes_per_epoch"], 1))
            if att["chunk_mate_dispersion"] is not None and one["chunk_mate_dispersion"]:
                disp.append(att["chunk_mate_dispersion"] / one["chunk_mate_dispersion"])
            thr.append(att["per_job_samples_per_sec"] / one["per_job_samples_per_sec"])
            thr_alone.append(alone["per_job_samples_per_sec"] / one["per_job_samples_per_sec"])
        print(f"K={k}: attached device bytes/epoch vs one lone job {spread(dev)}; per-job samples/s vs a lone job: "
              f"attached {spread(thr)}, alone {spread(thr_alone)}; attached dispersion vs a lone job's "
              f"{spread(disp) if disp else '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
