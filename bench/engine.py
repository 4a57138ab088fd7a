#!/usr/bin/env python3
"""The engine against the device: brand read vs fio on the same segment files.

Interleaved rounds (default 5); for each figure the median and [min, max]
over rounds, and same-round ratios:

* tmpfs (/dev/shm): bytes/s and CPU-seconds per GB of brand (`direct` and
  `brand` policies, read gap 0, decode_threads 1 and 2 (and 0 for zstd),
  io_uring and threads) against `fio --rw=randread --bs=128k --iodepth=32
  --ioengine=io_uring --direct=1` on the dataset's segment file; an
  uncompressed and a zstd dataset. Whole runs (2 epochs, fio 2 passes), and
  brand's second epoch against fio's second pass (neither pays start-up:
  brand's first epoch also faults in its memory).
* disk: the best brand variant and the threads backend against fio, each
  brand run against the mean of the fio runs just before and after it.
* the epoch boundary: the wait for each epoch's first batch against the
  P99 of the other batches' waits, for a consumer that takes batches as
  fast as they come and for one that computes on each batch (1.5x the
  loader's mean batch time, measured in the first round).
* peak RSS / (memory + readahead) for an uncompressed, a zstd and a
  size-skewed dataset, with both consumers.
* small (tmpfs) and small-disk: samples of exactly 1, 4 and 16 KiB, where
  requests, not bytes, are the limit: `brand read --policy direct
  --read-gap 0` against `fio --rw=randread --bs=<sample size> --iodepth=32`
  on the same segments for as many operations: samples/s over fio's IOPS,
  read amplification, CPU per sample over fio's CPU per I/O (fio's whole
  process: on tmpfs an io_uring worker thread of it does the copies its own
  usr/sys leaves out). Each build packs its own copy (a build reads only the
  formats it knows), and fio reads the first build's. Issue 26's recipe
  (200,000 x 4 KiB, one epoch): `--parts small --small-mb 800 --small-kib 4
  --small-epochs 1`.

Usage: bench/engine.py [--rounds 5] [--samples 10000] [--disk-dir /var/tmp]
                       [--parts tmpfs,boundary,rss,disk,small,small-disk] [--bin NAME=PATH ...]
                       [--small-mb 400] [--small-kib 1,4,16] [--small-epochs 2]
Needs fio and zstd (apt-get install -y fio zstd) and a release build (cargo build --release
-p brand-cli); BRAND_BIN overrides the binary. `--bin` (repeatable) runs
several builds interleaved in the same rounds (e.g. before/after a change:
`--bin before=/dev/shm/brand-before --bin after=target/release/brand`); the
datasets are made by the first. `--parts` picks the sections to run.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd):
    """Runs cmd; returns (stdout, CPU seconds it used)."""
    before = child_cpu()
    out = sh(cmd).stdout
    return out, child_cpu() - before


def make(brand, root, name, samples, extra_gen=(), extra_pack=()):
    ds = os.path.join(root, name, "ds")
    if os.path.exists(os.path.join(root, name, ".done")):
        return ds
    sh(["rm", "-rf", os.path.join(root, name)])
    src = os.path.join(root, name, "src")
    sh([brand, "gen", src, "--samples", str(samples), "--seed", "7", *extra_gen])
    sh([brand, "pack", src, "-o", ds, "--seed", "7", *extra_pack])
    sh(["rm", "-rf", src])
    open(os.path.join(root, name, ".done"), "w").close()
    return ds


def make_small(bins, root, kib, samples):
    """Samples of exactly `kib` KiB, packed by every build: {build name: dataset}."""
    base = os.path.join(root, f"small-{kib}k-{samples}")
    done = os.path.join(base, ".done")
    out = {bn: os.path.join(base, "ds-" + bn) for bn, _ in bins}
    if os.path.exists(done) and all(os.path.isdir(d) for d in out.values()):
        return out
    sh(["rm", "-rf", base])
    src = os.path.join(base, "src")
    k = str(kib)
    sh([bins[0][1], "gen", src, "--samples", str(samples), "--seed", "7", "--classes", "10",
        "--mean-kib", k, "--min-kib", k, "--max-kib", k])
    for bn, bp in bins:
        sh([bp, "pack", src, "-o", out[bn], "--seed", "7"])
    sh(["rm", "-rf", src])
    open(done, "w").close()
    return out


def fio_small_cmd(segs, kib, ios):
    """fio reading `ios` random `kib` KiB blocks of the segment files, QD 32, never writing them."""
    return ["fio", "--readonly", "--name=r", "--rw=randread", f"--bs={kib}k", "--iodepth=32",
            "--ioengine=io_uring", "--direct=1", "--filename=" + ":".join(segs),
            f"--io_size={ios * kib * 1024}", "--output-format=json"]


def fio_small(ds, kib, samples, loops=2):
    """fio reading `samples * loops` random `kib` KiB blocks, QD 32, O_DIRECT: IOPS, CPU-seconds
    per I/O of the whole process (start-up included), and in-run: the whole process less the
    start-up of the same command reading one block. fio's own usr_cpu + sys_cpu is kept for
    reference only: it counts its job thread alone, and on tmpfs every read is copied by an
    io_uring worker thread of the process (iou-wrk, ~45 % of fio's CPU under perf), which brand
    does on its own io threads."""
    segs = segments(ds)
    cmd = fio_small_cmd(segs, kib, samples * loops)
    out, cpu = timed(cmd)
    _, start_cpu = timed(fio_small_cmd(segs, kib, 1))
    job = json.loads(out)["jobs"][0]
    j = job["read"]
    job_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * j["runtime"] / 1000
    return {"iops": j["iops"], "cpu_per_io": cpu / j["total_ios"],
            "cpu_per_io_run": max(cpu - start_cpu, 0.0) / j["total_ios"],
            "cpu_per_io_job": job_cpu / j["total_ios"]}, cmd


def brand_small(brand, ds, epochs=2):
    """`epochs` epochs of `direct` at read gap 0: samples/s, read amplification and CPU per
    sample of the whole run and (with two or more) of the last epoch."""
    cmd = [brand, "read", ds, "--json", "--epochs", str(epochs), "--policy", "direct", "--read-gap", "0"]
    out, cpu = timed(cmd)
    eps = json.loads(out)
    assert all(e["exactly_once"] for e in eps), "not exactly once"
    samples = sum(e["samples"] for e in eps)
    m = [e["metrics"] for e in eps]
    r = {"sps": samples / sum(e["seconds"] for e in eps), "cpu_per_sample": cpu / samples,
         "amp": sum(x["bytes_read"] for x in m) / sum(x["bytes_served"] for x in m)}
    if all("cpu_seconds" in e for e in eps):
        # The epochs' own CPU (every thread), without start-up: against fio's job.
        r["cpu_per_sample_run"] = sum(e["cpu_seconds"] for e in eps) / samples
    last = eps[-1]
    if len(eps) > 1 and "cpu_seconds" in last:
        r["sps2"] = last["samples"] / last["seconds"]
        r["cpu_per_sample2"] = last["cpu_seconds"] / last["samples"]
    return r, cmd


def segments(ds):
    return sorted(os.path.join(ds, f) for f in os.listdir(ds) if f.endswith(".brd"))


def fio_cmd(segs, loops=2):
    """fio reading the segment files `loops` times over, never writing them."""
    size = sum(os.path.getsize(s) for s in segs)
    # --readonly: fio lays out (rewrites) a file smaller than its share of a
    # --size, which once overwrote a segment. No --size: the files' own sizes
    # are the region, and with --readonly a larger --size aborts the job.
    return ["fio", "--readonly", "--name=r", "--rw=randread", "--bs=128k", "--iodepth=32", "--ioengine=io_uring",
            "--direct=1", "--filename=" + ":".join(segs), f"--io_size={size * loops}", "--output-format=json"]


def fio(ds, loops=2):
    """fio reads the segments `loops` times: as many bytes as brand's 2 epochs, so
    both pay their start-up once for the same work."""
    cmd = fio_cmd(segments(ds), loops)
    out, cpu = timed(cmd)
    j = json.loads(out)["jobs"][0]["read"]
    return {"bps": j["bw_bytes"], "cpu_per_gb": cpu / (j["io_bytes"] / 1e9), "cpu": cpu, "bytes": j["io_bytes"]}, cmd


def fio_steady(one, two):
    """fio's CPU per GB of its second pass: the difference of a 1-pass and a 2-pass run
    (what brand's second epoch is compared with: neither pays start-up there)."""
    return (two["cpu"] - one["cpu"]) / ((two["bytes"] - one["bytes"]) / 1e9)


def brand_steady(run):
    """bytes/s and CPU-seconds per GB of brand's epochs after the first (which also fills
    memory: its page faults alone were ~25 % of a 1-epoch run's CPU here); None for a
    build whose `read --json` has no per-epoch cpu_seconds."""
    eps = run["epochs"][1:]
    if not eps or any("cpu_seconds" not in e for e in eps):
        return None
    read = sum(e["metrics"]["bytes_read"] for e in eps)
    return {"bps": read / sum(e["seconds"] for e in eps), "cpu_per_gb": sum(e["cpu_seconds"] for e in eps) / (read / 1e9)}


def zstd_decompression(brand, root):
    """zstd's own decompression cost on samples like the zstd dataset's (`zstd -b3`, one
    thread, in memory): CPU-seconds per GB of stored (compressed) bytes. Any reader that
    serves those samples decompressed pays at least this on top of the read."""
    src = os.path.join(root, "zstd-floor")
    if not os.path.exists(os.path.join(src, ".done")):
        sh(["rm", "-rf", src])
        sh([brand, "gen", src, "--samples", "600", "--seed", "7", "--compressible", "3"])
        open(os.path.join(src, ".done"), "w").close()
    out = subprocess.run(["zstd", "-b3", "-i2", "-r", "-q", src], capture_output=True, text=True, check=True)
    # "-3   23221519 (2.910) 242.18 MB/s 5203.9 MB/s   600 files"
    for line in (out.stdout + out.stderr).replace("\r", "\n").splitlines():
        f = line.split()
        if len(f) >= 7 and f[0] == "-3" and f[2].startswith("("):
            ratio = float(f[2].strip("()"))
            return ratio / (float(f[5]) / 1e3)
    raise RuntimeError(f"unexpected zstd -b output: {out.stdout!r} {out.stderr!r}")


def brand_read(brand, ds, policy, epochs=2, extra=()):
    cmd = [brand, "read", ds, "--json", "--epochs", str(epochs), "--policy", policy, "--read-gap", "0", *extra]
    out, cpu = timed(cmd)
    eps = json.loads(out)
    read = sum(e["metrics"]["bytes_read"] for e in eps)
    secs = sum(e["seconds"] for e in eps)
    assert all(e["exactly_once"] for e in eps), "not exactly once"
    return {"bps": read / secs, "cpu_per_gb": cpu / (read / 1e9), "epochs": eps}, cmd


def fmt(xs, scale=1.0, unit=""):
    xs = [x * scale for x in xs]
    return f"{statistics.median(xs):8.3f}{unit} [{min(xs):.3f}, {max(xs):.3f}]"


PARTS = ("tmpfs", "boundary", "rss", "disk", "small", "small-disk")
# (KiB, samples per 400 MB) for the small-record parts.
SMALL = ((1, 400_000), (4, 100_000), (16, 25_000))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=10000)
    ap.add_argument("--disk-dir", default=None)
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ", ".join(PARTS))
    ap.add_argument("--small-mb", type=int, default=400,
                    help="bytes of samples (MB) in each small-record dataset")
    ap.add_argument("--small-kib", default="1,4,16",
                    help="sample sizes (KiB, comma-separated) of the small-record parts: 1, 4, 16")
    ap.add_argument("--small-epochs", type=int, default=2,
                    help="epochs brand reads each small-record dataset (fio as many passes)")
    ap.add_argument("--bin", action="append", default=[], metavar="NAME=PATH",
                    help="a brand binary to measure (repeatable; interleaved in each round)")
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    for p in parts:
        if p not in PARTS:
            ap.error(f"unknown part {p!r}: expected some of {', '.join(PARTS)}")
    bins = []
    for b in args.bin:
        name, sep, path = b.partition("=")
        if not sep or not name or not path:
            ap.error(f"--bin {b!r}: expected NAME=PATH")
        bins.append((name, os.path.abspath(path)))
    if not bins:
        bins = [("brand", os.environ.get("BRAND_BIN", os.path.join(HERE, "target/release/brand")))]
    brand = bins[0][1]
    shm = f"/dev/shm/brand-engine-bench-{args.samples}"
    n = args.samples
    args.disk_dir = args.disk_dir or f"/var/tmp/brand-engine-bench-{n}"
    t0 = time.time()
    sets = {}
    if {"tmpfs", "boundary", "rss"} & set(parts):
        sets["plain"] = make(brand, shm, "plain", n)
    if {"tmpfs", "rss"} & set(parts):
        sets["zstd"] = make(brand, shm, "zstd", n, ["--compressible", "3"], ["--zstd", "3"])
    if "rss" in parts:
        sets["skew"] = make(brand, shm, "skew", n // 2, ["--min-kib", "1", "--max-kib", "4096", "--mean-kib", "220"])
    if "disk" in parts:
        sets["disk"] = make(brand, args.disk_dir, "plain", n)
    small_sets = {}
    for part, root in [("small", "/dev/shm/brand-engine-bench-small"),
                       ("small-disk", os.path.join(os.path.dirname(args.disk_dir), "brand-engine-bench-small"))]:
        if part in parts:
            for kib, per_400 in SMALL:
                if str(kib) not in args.small_kib.split(","):
                    continue
                count = per_400 * args.small_mb // 400
                small_sets[(part, kib)] = (make_small(bins, root, kib, count), count)
    print(f"datasets ready in {time.time() - t0:.0f}s", file=sys.stderr)
    variants = []
    for dsn in ["plain", "zstd"]:
        for policy in ["direct", "brand"]:
            # 0 (the reactors decompress) is the default on 2 cores; only zstd uses the pool.
            for dt in (["0"] if dsn == "zstd" else []) + ["1", "2"]:
                variants.append((dsn, policy, ("--decode-threads", dt, "--io-backend", "uring")))
        variants.append((dsn, "direct", ("--decode-threads", "2", "--io-backend", "threads")))
    disk_variants = [("--io-backend", "uring", "--decode-threads", "2"), ("--io-backend", "threads")]
    res = {}
    cmds = {}
    compute_ms = None

    def add(key, v, cmd):
        res.setdefault(key, []).append(v)
        cmds[key] = " ".join(cmd)

    for rnd in range(args.rounds):
        if "tmpfs" in parts:
            res.setdefault("zstd-floor", []).append(zstd_decompression(brand, shm))
            for dsn in ["plain", "zstd"]:
                f, c = fio(sets[dsn])
                add(("fio", dsn), f, c)
                f1, _ = fio(sets[dsn], loops=1)
                res.setdefault(("fio-steady", dsn), []).append(fio_steady(f1, f))
                for vd, policy, extra in variants:
                    if vd != dsn:
                        continue
                    for bn, bp in bins:
                        b, c = brand_read(bp, sets[dsn], policy, extra=extra)
                        add((bn, dsn, policy, extra), b, c)
        if "disk" in parts:
            # fio runs between every two brand runs, and each brand run is
            # compared with the mean of the fio runs either side of it: this
            # disk drifts (0.6-3 GB/s) within minutes, so a reference taken
            # once a round can be far from the conditions a run saw.
            f, c = fio(sets["disk"])
            add(("fio", "disk"), f, c)
            for extra in disk_variants:
                for bn, bp in bins:
                    b, bc = brand_read(bp, sets["disk"], "direct", extra=extra)
                    after, c = fio(sets["disk"])
                    add(("fio", "disk"), after, c)
                    b["fio_bps"] = (f["bps"] + after["bps"]) / 2
                    add((bn, "disk", extra), b, bc)
                    f = after
        if "boundary" in parts or "rss" in parts:
            # Epoch boundary: four epochs of the brand policy, taken as fast
            # as they come and with a training step's compute per batch.
            for bn, bp in bins:
                b, c = brand_read(bp, sets["plain"], "brand", epochs=4, extra=("--batch", "256"))
                add((bn, "boundary", "instant"), b, c)
                if compute_ms is None:
                    # 1.5 x the first build's mean batch time when not waited
                    # for: the consumer asks for 2/3 of what the loader can give.
                    eps = b["epochs"][1:]
                    compute_ms = 1.5e3 * sum(e["seconds"] for e in eps) / sum(-(-e["samples"] // 256) for e in eps)
                b, c = brand_read(bp, sets["plain"], "brand", epochs=4,
                                  extra=("--batch", "256", "--compute-ms", f"{compute_ms:.2f}"))
                add((bn, "boundary", "compute"), b, c)
        if "rss" in parts:
            # Peak RSS against memory + readahead, with a consumer taking
            # batches as they come and one computing (which lets read-ahead
            # fill what the plan leaves free).
            for dsn in ["plain", "zstd", "skew"]:
                for consumer, extra in [("instant", ()), ("compute", ("--compute-ms", f"{compute_ms:.2f}"))]:
                    for bn, bp in bins:
                        b, c = brand_read(bp, sets[dsn], "brand", epochs=1,
                                          extra=("--memory", "256MiB", "--readahead", "64MiB", *extra))
                        add((bn, "rss", dsn, consumer), b, c)
        for (part, kib), (dss, count) in small_sets.items():
            f, c = fio_small(dss[bins[0][0]], kib, count, loops=args.small_epochs)
            add(("fio", part, kib), f, c)
            for bn, _bp in bins:
                b, c = brand_small(dict(bins)[bn], dss[bn], epochs=args.small_epochs)
                add((bn, part, kib), b, c)
        print(f"round {rnd + 1}/{args.rounds} done at {time.time() - t0:.0f}s", file=sys.stderr)

    print(f"# brand engine benchmark: {args.rounds} interleaved rounds, {n} samples (mean 110 KiB), "
          f"parts {','.join(parts)}, builds {', '.join(f'{bn}={bp}' for bn, bp in bins)}")
    print("# median [min, max] over rounds; ratios are per round, then summarised\n")
    if "tmpfs" in parts:
        for dsn in ["plain", "zstd"]:
            fr = res[("fio", dsn)]
            print(f"## tmpfs, {dsn}: fio {fmt([r['bps'] for r in fr], 1e-9, ' GB/s')}, "
                  f"{fmt([r['cpu_per_gb'] for r in fr], 1, ' CPU-s/GB')}; its second pass "
                  f"{fmt(res[('fio-steady', dsn)], 1, ' CPU-s/GB')}")
            print(f"   fio: {cmds[('fio', dsn)]}")
            for vd, policy, extra in variants:
                if vd != dsn:
                    continue
                for bn, _ in bins:
                    br = res[(bn, dsn, policy, extra)]
                    bw = [b["bps"] / f["bps"] for b, f in zip(br, fr)]
                    cpu = [b["cpu_per_gb"] / f["cpu_per_gb"] for b, f in zip(br, fr)]
                    print(f"   {bn:8} {policy:6} {' '.join(extra):36} {fmt([b['bps'] for b in br], 1e-9, ' GB/s')} "
                          f"bytes/s ratio {fmt(bw)}  CPU/GB {fmt([b['cpu_per_gb'] for b in br])} ratio {fmt(cpu)}")
                    steady = [brand_steady(b) for b in br]
                    if all(steady):
                        fs = res[("fio-steady", dsn)]
                        print(f"   {'':8} {'':6} {'  second epoch vs fio second pass':36} "
                              f"{fmt([s['bps'] for s in steady], 1e-9, ' GB/s')} "
                              f"bytes/s ratio {fmt([s['bps'] / f['bps'] for s, f in zip(steady, fr)])}  "
                              f"CPU/GB {fmt([s['cpu_per_gb'] for s in steady])} "
                              f"ratio {fmt([s['cpu_per_gb'] / c for s, c in zip(steady, fs)])}")
                print(f"            {cmds[(bins[-1][0], dsn, policy, extra)]}")
            if dsn == "zstd":
                z = res["zstd-floor"]
                print(f"   zstd -b3 alone (one thread, in memory): {fmt(z, 1, ' CPU-s per stored GB')}; fio + that, "
                      f"over fio: {fmt([(f['cpu_per_gb'] + d) / f['cpu_per_gb'] for f, d in zip(fr, z)])} "
                      "(the CPU/GB ratio no reader that decompresses can beat)")
            print()
    if "disk" in parts:
        fr = res[("fio", "disk")]
        print(f"## disk ({args.disk_dir}): fio {fmt([r['bps'] for r in fr], 1e-9, ' GB/s')} "
              "(every run; each brand run is compared with the mean of the fio runs just before and after it)")
        for bn, _ in bins:
            base = None
            for extra in disk_variants:
                br = res[(bn, "disk", extra)]
                ratio = [b["bps"] / b["fio_bps"] for b in br]
                print(f"   {bn:8} direct {' '.join(extra):36} {fmt([b['bps'] for b in br], 1e-9, ' GB/s')} "
                      f"vs fio {fmt(ratio)}")
                if base is None:
                    base = br
                else:
                    tu = [(t["bps"] / t["fio_bps"]) / (u["bps"] / u["fio_bps"]) for t, u in zip(br, base)]
                    print(f"   {bn:8} threads / io_uring bytes/s (each over its fio) {fmt(tu)}")
    if "boundary" in parts:
        print("\n## epoch boundary (brand policy, 4 epochs, batch 256): first-batch wait of epochs 1-3 vs P99 "
              f"batch wait; consumers: instant, and computing {compute_ms:.2f} ms per batch")
        for consumer in ["instant", "compute"]:
            for bn, _ in bins:
                runs = res[(bn, "boundary", consumer)]
                firsts = [e["first_batch_wait_secs"] for r in runs for e in r["epochs"][1:]]
                p99s = [e["batch_wait_p99_secs"] for r in runs for e in r["epochs"][1:]]
                sps = [e["samples_per_sec"] for r in runs for e in r["epochs"][1:]]
                print(f"   {bn:8} {consumer:7} first batch {fmt(firsts, 1e3, ' ms')}   P99 mid-epoch {fmt(p99s, 1e3, ' ms')}"
                      f"   first - P99 {fmt([a - b for a, b in zip(firsts, p99s)], 1e3, ' ms')}   samples/s {fmt(sps, 1e-3, 'k')}")
                print(f"            {cmds[(bn, 'boundary', consumer)]}")
    if "rss" in parts:
        print("\n## peak RSS / (memory 256 MiB + readahead 64 MiB)")
        bound = (256 + 64) << 20
        for bn, _ in bins:
            for dsn in ["plain", "zstd", "skew"]:
                for consumer in ["instant", "compute"]:
                    rs = res[(bn, "rss", dsn, consumer)]
                    peaks = [max(e["peak_rss_bytes"] for e in r["epochs"]) for r in rs]
                    res_peak = [max(e["metrics"]["peak_resident_bytes"] for e in r["epochs"]) for r in rs]
                    buf_peak = [max(e["metrics"]["peak_read_buffer_bytes"] for e in r["epochs"]) for r in rs]
                    print(f"   {bn:8} {dsn:5} {consumer:7} RSS/bound {fmt([p / bound for p in peaks])}  (RSS - 64 MiB)/bound "
                          f"{fmt([(p - (64 << 20)) / bound for p in peaks])}  "
                          f"peak resident {fmt(res_peak, 2**-20, ' MiB')}  read buffers {fmt(buf_peak, 2**-20, ' MiB')}")
            print(f"            {cmds[(bn, 'rss', 'skew', 'compute')]}")
    if small_sets:
        print(f"\n## small records: direct, read gap 0, {args.small_epochs} epoch(s), vs fio randread at the sample size, QD 32")
        print("   ratios per round: samples/s over fio IOPS, brand CPU per sample over fio CPU per I/O;"
              " amp = bytes read / bytes served; 2nd = second epoch only")
    for (part, kib), (dss, count) in small_sets.items():
        fr = res[("fio", part, kib)]
        print(f"   {part} {kib:2} KiB x {count}: fio {fmt([f['iops'] for f in fr], 1e-3, 'k IOPS')}  "
              f"{fmt([f['cpu_per_io'] for f in fr], 1e6, ' us CPU/IO')}")
        for bn, _ in bins:
            br = res[(bn, part, kib)]
            print(f"   {bn:8} {fmt([b['sps'] for b in br], 1e-3, 'k samples/s')} ratio {fmt([b['sps'] / f['iops'] for b, f in zip(br, fr)])}"
                  f"  amp {fmt([b['amp'] for b in br])}  CPU/sample {fmt([b['cpu_per_sample'] for b in br], 1e6, ' us')}"
                  f" ratio {fmt([b['cpu_per_sample'] / f['cpu_per_io'] for b, f in zip(br, fr)])}")
            if all("sps2" in b for b in br):
                print(f"   {'':8} 2nd {fmt([b['sps2'] / f['iops'] for b, f in zip(br, fr)])} x fio IOPS,"
                      f" CPU/sample {fmt([b['cpu_per_sample2'] / f['cpu_per_io'] for b, f in zip(br, fr)])} x fio")
            if all("cpu_per_sample_run" in b for b in br):
                print(f"   {'':8} in-run CPU (brand's epochs; fio's process less its start-up):"
                      f" {fmt([b['cpu_per_sample_run'] for b in br], 1e6, ' us/sample')}"
                      f" vs {fmt([f['cpu_per_io_run'] for f in fr], 1e6, ' us/IO')},"
                      f" ratio {fmt([b['cpu_per_sample_run'] / f['cpu_per_io_run'] for b, f in zip(br, fr)])}")
                print(f"   {'':8} (fio's own usr+sys, its job thread alone, without the io_uring workers"
                      f" that copy its reads: {fmt([f['cpu_per_io_job'] for f in fr], 1e6, ' us/IO')})")
        print(f"            {cmds[(bins[-1][0], part, kib)]}")
        print(f"            {cmds[('fio', part, kib)]}")
    print(f"\n# total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
