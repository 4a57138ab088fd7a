#!/usr/bin/env python3
"""brand bench: brand against the device and the usual Python loaders, in one run.

    bench/run.py [--small] [--out DIR] [--rounds N] [--profiles disk,net] [--skip LOADER ...]

Makes or reuses one dataset in three forms (ImageNet-like files, its brand
pack, TFRecord shards), then, interleaved over rounds and storage profiles,
measures fio's device sweep, the peer loaders and brand's policies and
interfaces, each one epoch in its own memory group with the data's page
cache cold; trains a small model for the order-quality experiment; and
writes results.json, results.md and PNG plots into --out, printing the
tables and a policy recommendation at the end. See bench/README.md.

Run it as root (cgroups, throttling) with the venv's Python
(scripts/bench-venv.sh). Loaders that cannot run here are reported as
unavailable, never fatal. Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brandbench import cgroups, config, dataset, device, execute, loaders, orderq, recommend, report, results  # noqa: E402
from brandbench.config import pct  # noqa: E402

NET_BPS = 380_000_000  # the paper's NAS: 0.38 GB/s
NET_IOPS = 3000  # a typical network volume's read IOPS (e.g. a cloud block/NFS volume's baseline)


def args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="the small preset (~1.1 GB, ~15 min on 2 cores)")
    ap.add_argument("--out", type=Path, default=None, help="results directory (default DATA/out-PRESET)")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/brand-bench"), help="where datasets are made")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved repetitions (default 3)")
    ap.add_argument("--profiles", default="disk,net", help="storage profiles: disk, net")
    ap.add_argument("--skip", nargs="*", default=[], metavar="LOADER",
                    help=f"loaders to leave out: {' '.join(config.LOADERS)} (commas also work)")
    ap.add_argument("--samples", type=int, default=None, help="override the preset's sample count")
    ap.add_argument("--budgets", default=None, help="memory budgets, %% of the dataset (default 10,25,100)")
    ap.add_argument("--allowance", default=None,
                    help="memory for a runtime besides its data; a run's memory group = allowance + budget "
                         "(default: 640MiB full preset, 560MiB small)")
    ap.add_argument("--net-bps", type=int, default=NET_BPS, help="net profile: read bytes/s (default 0.38 GB/s)")
    ap.add_argument("--net-iops", type=int, default=NET_IOPS, help="net profile: read requests/s (default 3000)")
    ap.add_argument("--fio-seconds", type=float, default=None)
    ap.add_argument("--drop-caches", choices=["data", "all"], default="data",
                    help="before each run, evict the dataset's pages (data, default) or also "
                         "echo 3 > drop_caches after the runner's imports (all)")
    ap.add_argument("--python", default=sys.executable, help="the Python of the runners (the bench venv)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run")
    ap.add_argument("--report-only", type=Path, default=None, metavar="RESULTS_JSON",
                    help="only rewrite results.md and the plots from a results.json")
    a = ap.parse_args(argv)
    a.skip = {s for x in a.skip for s in x.split(",") if s}
    bad = a.skip - set(config.LOADERS)
    if bad:
        ap.error(f"unknown loader(s) {sorted(bad)}; known: {config.LOADERS}")
    return a


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def finish_results(res: dict, out: Path) -> dict:
    """Summaries, recommendation, results.json, results.md and plots."""
    runs = [r for r in res["runs"] if r["loader"] != "fio"]
    fio = [r for r in res["runs"] if r["loader"] == "fio"]
    res["summary"] = results.summarize(runs, fio, res.get("dataset", {}).get("stored_bytes"))
    res["fio_summary"] = results.fio_summary(fio)
    res["ceiling"] = results.ceiling_summary(fio)
    res["recommendation"] = recommend.recommend(res["summary"], res.get("simulate"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "results.md").write_text(report.markdown(res))
    try:
        res["plots"] = [str(p) for p in report.plots(res, out)]
    except ImportError as e:
        res["plots"] = []
        log(f"no plots: {e}")
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def simulate(brand: Path, pack: Path, policies, budgets) -> dict:
    """brand simulate (no I/O): order quality and read amplification per policy and budget."""
    out = {}
    for pol in policies:
        for b in budgets:
            r = subprocess.run([str(brand), "simulate", str(pack), "--memory", pct(b), "--policy", pol, "--json"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                e = json.loads(r.stdout)["epochs"][0]
                out.setdefault(pol, {})[pct(b)] = {k: e.get(k) for k in (
                    "chunk_mate_dispersion", "label_diversity", "amplification_whole", "amplification_sparse")}
    return out


def main(argv=None):
    a = args(argv)
    if a.report_only:
        res = json.loads(a.report_only.read_text())
        res = finish_results(res, a.report_only.parent)
        print(report.markdown(res))
        return 0

    preset = config.PRESETS["small" if a.small else "full"]
    if a.samples:
        preset.samples = a.samples
    if a.budgets:
        preset.budgets = config.parse_budgets(a.budgets)
    if a.allowance:
        preset.allowance = config.parse_size(a.allowance)
    if a.rounds:
        preset.rounds = a.rounds
    if a.fio_seconds:
        preset.fio_seconds = a.fio_seconds
    if a.timeout:
        preset.timeout = a.timeout
    out = a.out or a.data / f"out-{preset.name}"
    out.mkdir(parents=True, exist_ok=True)
    profiles = [p.strip() for p in a.profiles.split(",") if p.strip()]
    for p in profiles:
        if p not in ("disk", "net"):
            sys.exit(f"unknown profile {p!r}: disk, net")

    # SIGTERM unwinds like ^C, so the groups are removed and children killed.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    brand = config.brand_bin()
    res = {
        "meta": {
            "preset": preset.name,
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "host": platform.node(),
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "rounds": preset.rounds,
            "budgets": preset.budgets,
            "allowance_bytes": preset.allowance,
            "batch_size": preset.batch_size,
            "python": a.python,
            "brand": str(brand),
            "brand_throughput": str(config.throughput_bin()),
            "drop_caches": a.drop_caches,
        },
        "runs": [],
        "unavailable": {},
        "profiles": {},
    }
    if not brand.is_file():
        sys.exit(f"no brand CLI at {brand}: build it (cargo build --release) or set BRAND_BIN")

    a.data.mkdir(parents=True, exist_ok=True)
    layout = cgroups.detect()
    dev = cgroups.block_device(a.data)
    res["meta"]["device"] = dev
    res["meta"]["cgroups"] = f"v{layout.version}" if layout.usable else f"none: {layout.why}"
    log(f"device {dev}; cgroups: {res['meta']['cgroups']}; output {out}")

    has_tf = loaders._has_module(a.python, "tensorflow")
    ds = dataset.prepare(a.data, preset, brand, a.python if has_tf else None, log=log)
    res["dataset"] = ds.describe()
    log(f"dataset {ds.root}: {ds.samples} samples, {ds.stored_bytes / 1e9:.2f} GB, {ds.chunks} chunks, "
        f"{ds.shards} TFRecord shards")

    ref_budget = min(preset.budgets)
    plan = loaders.Plan(ds=ds, python=a.python, brand=brand, throughput=config.throughput_bin(),
                        budgets=preset.budgets, ref_budget=ref_budget, batch_size=preset.batch_size,
                        threads=preset.threads, skip=a.skip,
                        api_budgets=None if preset.api_all_budgets else [ref_budget])
    # brand.tf's op cache stays where it is while the brand runs get a HOME of
    # their own (for the read-gap probe): built once by loaders.check.
    os.environ.setdefault("BRAND_CACHE_DIR", str(Path.home() / ".cache" / "brand"))
    plan.unavailable = loaders.check(plan)
    fio_path = None
    if "fio" not in a.skip:
        fio_path, why = device.ensure_fio(log)
        if not fio_path:
            plan.unavailable["fio"] = why
    res["unavailable"] = {k: v for k, v in plan.unavailable.items() if k not in a.skip}
    for k, v in res["unavailable"].items():
        log(f"unavailable: {k}: {v}")

    def limit(budget):
        return preset.allowance + int((budget if budget is not None else ref_budget) * ds.stored_bytes)

    res["meta"]["memory"] = (
        f"every run in its own memory group of {preset.allowance / 2**20:.0f} MiB (runtime allowance) + its "
        f"budget: " + ", ".join(f"{pct(b)} → {limit(b) / 1e9:.2f} GB" for b in preset.budgets)
        + f"; peers run at the {pct(ref_budget)} budget; dataset {ds.stored_bytes / 1e9:.2f} GB"
        if layout.usable else "not limited (no cgroups: " + layout.why + ")")
    res["meta"]["cache"] = (
        "before every run the dataset's pages are evicted (posix_fadvise DONTNEED on every file of the "
        "three forms, after a runner's imports)" + ("; then echo 3 > drop_caches" if a.drop_caches == "all" else "")
        + "; page cache inside a run is limited by the memory group")

    groups = cgroups.Groups(layout, dev) if layout.usable else None
    try:
        for p in profiles:
            if p == "disk":
                res["profiles"]["disk"] = {"available": True, "description": f"the raw disk {dev}, unthrottled"}
                if groups:
                    groups.profile("disk", None, None)
            else:
                okay, why = groups.throttle_supported() if groups else (False, layout.why)
                if okay:
                    groups.profile("net", a.net_iops, a.net_bps)
                    res["profiles"]["net"] = {
                        "available": True, "read_bps": a.net_bps, "read_iops": a.net_iops,
                        "description": f"the same disk behind a cgroup blkio throttle: {a.net_bps / 1e9:.2f} GB/s "
                                       f"and {a.net_iops} read requests/s (emulated network storage; the paper's "
                                       f"NAS: 0.38 GB/s)"}
                else:
                    res["profiles"]["net"] = {"available": False, "description": f"unavailable: {why}"}
                    log(f"profile net unavailable: {why}")
        active = [p for p in profiles if res["profiles"][p]["available"]]

        if "brand" not in plan.unavailable:
            pols = sorted({pol for pol, _ in plan.variants} | {pol for pol, _ in plan.api_variants})
            res["simulate"] = simulate(brand, ds.pack, pols, preset.budgets)

        evict = ds.all_files()
        homes = {p: out / f"home-{p}" for p in active}
        for h in homes.values():
            h.mkdir(parents=True, exist_ok=True)

        def ctx(p):
            return execute.Context(groups, p, evict, drop_all=a.drop_caches == "all", timeout=preset.timeout,
                                   log_dir=out / "logs")

        # brand's read_gap = auto probes the device once per blkio group and
        # caches it (in HOME): probe now, so no measured run pays for it.
        if "brand" not in plan.unavailable and "brand" not in a.skip:
            for p in active:
                warm = execute.Item("brand", "probe", "read-gap probe",
                                    [str(brand), "read", str(ds.pack), "--memory", pct(ref_budget), "--read-gap",
                                     "auto", "--epochs", "1", "--json"], env={"HOME": str(homes[p])})
                r = execute.measure(warm, ctx(p), limit(ref_budget))
                log(f"[{p}] read-gap probe: {r['status']}")

        items = loaders.items(plan)
        fio_items = []
        if fio_path:
            fio_items = [device.item(fio_path, ds.segments(), rw, bs, qd, preset.fio_seconds, ds.mean_chunk_bytes)
                         for rw, bs, qd in device.sweep(ds.mean_chunk_bytes)]
        total = preset.rounds * len(active) * (len(items) + len(fio_items))
        done = 0
        t0 = time.monotonic()
        for rnd in range(preset.rounds):
            order = active if rnd % 2 == 0 else list(reversed(active))
            for p in order:
                k = rnd % max(1, len(items))
                todo = fio_items + items[k:] + items[:k]  # rotate: no loader always runs first
                for it in todo:
                    if it.loader in config.BRAND_LOADERS:
                        it.env["HOME"] = str(homes[p])
                    rec = execute.measure(it, ctx(p), limit(it.budget))
                    rec["round"] = rnd
                    res["runs"].append(rec)
                    done += 1
                    mb = rec.get("useful_mb_per_s")
                    amp = rec.get("read_amplification")
                    rss = rec.get("peak_rss_bytes")
                    log(f"[{done}/{total} r{rnd + 1} {p}] {rec['name']}: "
                        + (f"{mb:.0f} MB/s, amp {amp:.2f}, RSS {(rss or 0) / 2**20:.0f} MiB" if mb and amp
                           else f"{mb:.0f} MB/s" if mb else rec["status"])
                        + ("" if rec["status"] == "ok" else f" [{rec['status'][:200]}]"))
                    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
        res["meta"]["measure_seconds"] = time.monotonic() - t0

        if "order" not in a.skip:
            if "order" in plan.unavailable:
                res["order_quality"] = {"status": "unavailable: " + plan.unavailable["order"]}
            else:
                log("order quality: training on label-sorted digits (full shuffle, tf.data shuffle, BrandDataset)")
                env = dict(os.environ, HOME=str(out / "home-order"))
                res["order_quality"] = orderq.run(a.python, out / "order-quality", brand, ref_budget,
                                                  preset.order_epochs, preset.order_seeds, env=env)
                log(f"order quality: {res['order_quality'].get('status')}")
    finally:
        if groups:
            groups.close()

    res["meta"]["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    res = finish_results(res, out)
    print()
    print(report.markdown(res))
    print(f"\nwritten: {out / 'results.json'}, {out / 'results.md'}, " + ", ".join(Path(p).name for p in res["plots"]))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
