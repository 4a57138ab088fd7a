#!/usr/bin/env python3
"""What a process pays per sample, at scale (issue 34): 10,000,000 small
samples, packed and read at `memory = 1%`.

* pack: `brand pack --from tfrecord` of the generated shards: peak RSS
  (VmHWM, /usr/bin/time's figure) and wall time.
* one reader: `brand read --memory 1% --readahead 4MiB --epochs 1
  --no-order --json`, its /proc/PID/smaps_rollup polled every 50 ms: peak
  anonymous memory, peak RSS and peak file-backed resident memory (the
  mapped index and the binary), and from its report the time from open to
  the first batch, the plan's and the index's bytes.
* eight readers at once (seeds 0..7, the same dataset): each one's peak
  anonymous memory, and the most PSS the eight held together (the index's
  pages shared by all of them count 1/8 in each).

Goals (the issue's): each reader's anonymous memory <= budget + readahead
+ 16 bytes a sample + a few MiB (16 MiB here); eight readers' PSS <= 8 x
that + 1.5 x the index; open to first batch <= 1 s; pack <= 1 GiB peak.
Interleaved rounds (default 5) for the single reader and open times; the
pack and the eight readers run `--pack-rounds` and `--group-rounds` times
(each costs minutes on two cores). Median and [min, max] per figure.

Usage: bench/scale.py [--samples 10000000] [--mean-bytes 512] [--dir /var/tmp/brand-bench/scale]
                      [--rounds 5] [--pack-rounds 1] [--group-rounds 1] [--readers 8]
Writes docs/bench/scale-results.md and .json. BRAND_BIN overrides the binary
(default target/release/brand).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("BRAND_BIN", os.path.join(HERE, "target/release/brand"))
MIB = 1 << 20


def rollup(pid):
    """Anonymous, Rss and Pss of a process now, in bytes (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].rstrip(":") in ("Anonymous", "Rss", "Pss"):
            out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out if len(out) == 3 else None


class Poller:
    """Polls processes' smaps_rollup until they end: per-process peaks and
    the peak of their PSS summed at one instant."""

    def __init__(self, procs, every=0.05):
        self.procs, self.every = procs, every
        self.peak = [{"Anonymous": 0, "Rss": 0, "file": 0} for _ in procs]
        self.pss_sum_peak = 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while any(p.poll() is None for p in self.procs):
            pss = 0
            for i, p in enumerate(self.procs):
                r = rollup(p.pid) if p.poll() is None else None
                if r is None:
                    continue
                pk = self.peak[i]
                pk["Anonymous"] = max(pk["Anonymous"], r["Anonymous"])
                pk["Rss"] = max(pk["Rss"], r["Rss"])
                pk["file"] = max(pk["file"], r["Rss"] - r["Anonymous"])
                pss += r["Pss"]
            self.pss_sum_peak = max(self.pss_sum_peak, pss)
            time.sleep(self.every)

    def join(self):
        self.thread.join()


def read_cmd(ds, seed, memory, readahead):
    return [BIN, "read", ds, "--memory", memory, "--readahead", readahead, "--epochs", "1",
            "--no-order", "--json", "--seed", str(seed)]


def run_readers(ds, seeds, memory, readahead):
    procs = [subprocess.Popen(read_cmd(ds, s, memory, readahead), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for s in seeds]
    poller = Poller(procs)
    outs = [p.communicate() for p in procs]
    poller.join()
    reports = []
    for p, (out, err) in zip(procs, outs):
        if p.returncode != 0:
            sys.exit(f"brand read failed ({p.returncode}): {err}")
        reports.append(json.loads(out)[0])
    return reports, poller


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def fmt(s, unit=MIB, digits=0):
    f = f"{{:.{digits}f}}"
    return f"{f.format(s['median'] / unit)} [{f.format(s['min'] / unit)}, {f.format(s['max'] / unit)}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--mean-bytes", type=int, default=512)
    ap.add_argument("--dir", default="/var/tmp/brand-bench/scale")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pack-rounds", type=int, default=1)
    ap.add_argument("--group-rounds", type=int, default=1)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--memory", default="1%")
    ap.add_argument("--readahead", default="4MiB")
    ap.add_argument("--out", default=os.path.join(HERE, "docs/bench/scale-results"))
    a = ap.parse_args()

    os.makedirs(a.dir, exist_ok=True)
    src = os.path.join(a.dir, f"tf-{a.samples}-{a.mean_bytes}")
    if not os.path.isdir(src):
        lo, hi = a.mean_bytes // 2, a.mean_bytes * 2
        subprocess.run([BIN, "gen", src, "--format", "tfrecord", "--samples", str(a.samples),
                        "--mean-bytes", str(a.mean_bytes), "--min-bytes", str(lo), "--max-bytes", str(hi),
                        "--classes", "1000", "--seed", "1"], check=True)
    ds = os.path.join(a.dir, f"ds-{a.samples}")

    pack = []
    for r in range(max(a.pack_rounds, 1)):
        t = time.monotonic()
        p = subprocess.run(["/usr/bin/time", "-f", "%M", BIN, "pack", "--from", "tfrecord", src, "-o", ds,
                            "--force"], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"pack failed: {p.stderr}")
        pack.append({"seconds": time.monotonic() - t, "peak_rss": int(p.stderr.strip().splitlines()[-1]) * 1024})
        print(f"pack round {r}: {pack[-1]['seconds']:.1f} s, {pack[-1]['peak_rss'] / MIB:.0f} MiB", flush=True)

    with open(os.path.join(ds, "manifest.toml")) as f:
        manifest = f.read()
    raw = int(next(l for l in manifest.splitlines() if l.startswith("raw_bytes")).split("=")[1])
    index_bytes = os.path.getsize(os.path.join(ds, "index.bin"))
    n = a.samples

    single = []
    for r in range(a.rounds):
        (rep,), poller = run_readers(ds, [r], a.memory, a.readahead)
        m = rep["metrics"]
        pk = poller.peak[0]
        single.append({
            "peak_anon": pk["Anonymous"], "peak_rss": pk["Rss"], "peak_file": pk["file"],
            "anon_at_end": rep["anon_bytes"], "meter": rep["meter_bytes"],
            "open_secs": rep["open_secs"], "first_batch_secs": rep["open_secs"] + rep["first_batch_wait_secs"],
            "samples_per_sec": rep["samples_per_sec"], "exactly_once": rep["exactly_once"],
            "plan_peak": m["plan_peak_bytes"], "index_heap": m["index_heap_bytes"],
            "budget": m["peak_resident_bytes"], "readahead_peak": m["peak_readahead_bytes"],
        })
        s = single[-1]
        print(f"reader round {r}: anon {s['peak_anon'] / MIB:.0f} MiB, open->first batch "
              f"{s['first_batch_secs']:.2f} s, {s['samples_per_sec']:.0f} samples/s", flush=True)

    group = []
    for r in range(a.group_rounds):
        reps, poller = run_readers(ds, list(range(a.readers)), a.memory, a.readahead)
        group.append({"peak_anon_each": [p["Anonymous"] for p in poller.peak], "pss_sum_peak": poller.pss_sum_peak,
                      "exactly_once": all(x["exactly_once"] for x in reps)})
        print(f"{a.readers} readers round {r}: PSS together {poller.pss_sum_peak / MIB:.0f} MiB, anon each max "
              f"{max(group[-1]['peak_anon_each']) / MIB:.0f} MiB", flush=True)

    budget = raw * 0.01 if a.memory == "1%" else None
    readahead = 4 * MIB
    goal_anon = budget + readahead + 16 * n + 16 * MIB
    result = {
        "samples": n, "raw_bytes": raw, "index_bytes": index_bytes, "budget_bytes": budget,
        "goal_anon_bytes": goal_anon, "goal_group_pss_bytes": a.readers * goal_anon + 1.5 * index_bytes,
        "pack": pack, "single": single, "group": group,
    }
    with open(a.out + ".json", "w") as f:
        json.dump(result, f, indent=1)

    anon = stats([s["peak_anon"] for s in single])
    lines = [
        f"# Scale: {n:,} samples of ~{a.mean_bytes} B (issue 34)",
        "",
        f"`bench/scale.py --samples {n} --mean-bytes {a.mean_bytes} --rounds {a.rounds}`; figures in MiB, "
        "median [min, max] over rounds.",
        f"Dataset: {raw / MIB:.0f} MiB of samples, index.bin {index_bytes / MIB:.0f} MiB "
        f"({index_bytes / n:.1f} bytes a sample, keys included); budget at {a.memory}: {budget / MIB:.1f} MiB.",
        "",
        "| figure | measured | goal |",
        "|---|---|---|",
        f"| `brand pack` peak RSS | {fmt(stats([p['peak_rss'] for p in pack]))} | ≤ 1024 |",
        f"| `brand pack` seconds | {fmt(stats([p['seconds'] for p in pack]), 1, 1)} | |",
        f"| one reader: peak anonymous | {fmt(anon)} | ≤ {goal_anon / MIB:.0f} |",
        f"| one reader: of which `brand read`'s own exactly-once bits | "
        f"{fmt(stats([s['meter'] for s in single]), MIB, 1)} | |",
        f"| one reader: plan at peak | {fmt(stats([s['plan_peak'] for s in single]))} | |",
        f"| one reader: peak RSS | {fmt(stats([s['peak_rss'] for s in single]))} | |",
        f"| one reader: peak file-backed resident (mapped index, binary) | "
        f"{fmt(stats([s['peak_file'] for s in single]))} | |",
        f"| one reader: open to first batch (s) | {fmt(stats([s['first_batch_secs'] for s in single]), 1, 2)} | ≤ 1 |",
        f"| one reader: samples/s | {fmt(stats([s['samples_per_sec'] for s in single]), 1)} | |",
    ]
    if group:
        lines += [
            f"| {a.readers} readers: PSS together | {fmt(stats([g['pss_sum_peak'] for g in group]))} | "
            f"≤ {result['goal_group_pss_bytes'] / MIB:.0f} |",
            f"| {a.readers} readers: peak anonymous of each (max over readers) | "
            f"{fmt(stats([max(g['peak_anon_each']) for g in group]))} | ≤ {goal_anon / MIB:.0f} |",
        ]
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
