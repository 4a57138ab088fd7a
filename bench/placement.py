#!/usr/bin/env python3
"""Benefit-aware placement in one local tier (issue 56, item 4), over tier.py's shaped link.

    V=$(scripts/objstore-venv.sh)
    sudo "$V/bin/python" bench/placement.py --work /var/tmp/brand-bench/tier --rounds 5

Two datasets at two URLs: tier.py's s3://brand/ds and a copy of its objects at s3://brand/ds2 (the
same bytes under another name: to the tier, another dataset). One tier that fits one of them
(--limit, default 1.05x one dataset's objects). Two jobs started together, each one `brand read`
process of --epochs epochs (seed = round + 1) in its own memory group (as tier.py's):

  io       s3://brand/ds, no compute: it waits for the store;
  compute  s3://brand/ds2 with --compute-ms C a batch: its compute hides most of the store's time.

Configurations, each in every round (the order rotating):

  placement  one tier directory for both, limit L: the placement decides who holds what;
  even       a tier directory each, L/2 each: an even split of the same space;
  none       no tier.

Reported per configuration: each job's samples/s over its run (samples served / wall seconds of its
process), the pair's total (the sum), each epoch's rate, the store's bytes (server counters over both),
what each job's placement measured and decided (tier_benefit, tier_owed_bytes, tier_evicted_bytes),
exactly once. Goal (issue 56): with placement the I/O-bound job gets the tier, and the pair's total
beats the even split's.

Needs tier.py's WORK prepared (its dataset, local copy): run tier.py once first, or this prepares it.
Output in WORK/out-placement: placement-results.json and placement-results.md.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import objstore  # noqa: E402
import tier as tierbench  # noqa: E402
from objstore import sh, summary  # noqa: E402
from brandbench.cgroups import evict  # noqa: E402

ROOT = HERE.parent
CONFIGS = ("placement", "even", "none")
JOBS = (("io", "s3://brand/ds", 0.0), ("compute", "s3://brand/ds2", None))


def sidecar(srv: Path, bucket: str, key: str, kind: str) -> Path:
    """The server's (s3s-fs's) metadata file of an object: its entity tag and checksum ("internal")
    and user metadata; without them it hashes the whole object on every request."""
    b64 = lambda t: base64.urlsafe_b64encode(t.encode()).decode().rstrip("=")  # noqa: E731
    return srv / f".bucket-{b64(bucket)}.object-{b64(key)}.{kind}.json"


def copy_dataset(a):
    """s3://brand/ds2: the server's files of s3://brand/ds copied, with their metadata files."""
    srv = a.work / "srv"
    src, dst = srv / "brand" / "ds", srv / "brand" / "ds2"
    if not dst.exists():
        tmp = dst.with_name("ds2.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        for f in src.iterdir():
            for kind in ("internal", "metadata"):
                meta = sidecar(srv, "brand", f"ds/{f.name}", kind)
                if meta.exists():
                    shutil.copyfile(meta, sidecar(srv, "brand", f"ds2/{f.name}", kind))
        tmp.rename(dst)


def argv_of(a, url: str, compute_ms: float, seed: int, tier: Path | None, limit: int | None) -> list[str]:
    argv = [a.brand, "read", url, "--memory", "10%", "--read-gap", a.read_gap, "--epochs", str(a.epochs),
            "--seed", str(seed), "--json", "-v", "--compute-ms", str(compute_ms)]
    if tier is not None:
        argv += ["--disk-cache", str(tier), "--disk-cache-limit", str(limit)]
    return argv


def run_config(a, net, groups, meta, config: str, rnd: int, limit: int) -> list[dict]:
    tiers = {"placement": [a.work / "ptier", a.work / "ptier"],
             "even": [a.work / "ptier-io", a.work / "ptier-compute"], "none": [None, None]}[config]
    per_job_limit = {"placement": limit, "even": limit // 2, "none": None}[config]
    for t in {t for t in tiers if t}:
        shutil.rmtree(t, ignore_errors=True)
    gs = [groups.run_group("net", a.allowance + meta["bytes"] // 10) for _ in JOBS]
    net.admin("reset-stats", "POST")
    procs = []
    t0 = time.perf_counter()
    for g, (name, url, compute), t in zip(gs, JOBS, tiers):
        ms = a.compute_ms if compute is None else compute
        argv = argv_of(a, url, ms, rnd + 1, t, per_job_limit)
        procs.append((name, argv, subprocess.Popen(g.wrap(net.exec_c(argv)), stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE, text=True, env=objstore.brand_env(a))))
    recs = []
    for g, (name, argv, p) in zip(gs, procs):
        rec = {"config": config, "round": rnd, "job": name, "argv": " ".join(map(str, argv))}
        try:
            o, e = p.communicate(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        rec["wall_s"] = time.perf_counter() - t0
        rec["oom_kills"] = g.oom_kills()
        try:
            if p.returncode != 0:
                raise RuntimeError(f"brand read exit {p.returncode}: {e[-1500:]}")
            epochs = json.loads(o)
            rec["epochs"] = [{"samples_per_sec": ep.get("samples_per_sec"), "seconds": ep.get("seconds"),
                              "exactly_once": ep.get("exactly_once"),
                              **{k: (ep.get("metrics") or {}).get(k) for k in (
                                  "tier_benefit", "tier_owed_bytes", "tier_evicted_bytes", "tier_hits",
                                  "tier_refused", "tier_bytes_fetched", "store_bytes_fetched", "stall_secs_total")}}
                             for ep in epochs]
            samples = sum(ep.get("samples") or 0 for ep in epochs)
            run_s = sum(ep.get("seconds") or 0 for ep in epochs)
            rec.update(samples=samples, run_s=run_s, samples_per_sec=samples / run_s if run_s else None,
                       exactly_once=all(ep.get("exactly_once") for ep in epochs))
            rec["placement_log"] = [l for l in e.splitlines() if "placement" in l or "removed a version" in l][-6:]
        except Exception as ex:  # noqa: BLE001 (recorded, the round goes on)
            rec["error"] = str(ex)[-2000:]
            print(f"  {config} r{rnd} {name}: FAILED {rec['error'][-600:]}", file=sys.stderr)
        groups.release(g)
        recs.append(rec)
    st = net.admin("stats")
    for r in recs:
        r.update(server_gets=st.get("get_requests"), server_get_bytes=st.get("get_bytes"))
    for t in {t for t in tiers if t}:
        for r in recs:
            r.setdefault("tier_dir_bytes", {})[t.name] = sum(p.stat().st_blocks * 512
                                                            for p in tierbench.files_under(t))
        shutil.rmtree(t, ignore_errors=True)
    rates = {r["job"]: r.get("samples_per_sec") for r in recs}
    print(f"  {config} r{rnd}: samples/s {rates}, pair {sum(v or 0 for v in rates.values()):.0f}, "
          f"store {(st.get('get_bytes') or 0) / 1e9:.2f} GB; "
          f"epochs io {[round(e['samples_per_sec'] or 0) for e in recs[0].get('epochs', [])]}", file=sys.stderr)
    return recs


def summarise(res: dict) -> dict:
    runs = res["runs"]
    out = {}
    for config in CONFIGS:
        rs = [r for r in runs if r["config"] == config]
        if not rs:
            continue
        row = {}
        rounds = sorted({r["round"] for r in rs})
        for name, _, _ in JOBS:
            jr = [r for r in rs if r["job"] == name and "error" not in r]
            row[name] = summary([r.get("samples_per_sec") for r in jr])
            for e in range(res["epochs"]):
                row[f"{name}_e{e}"] = summary([r["epochs"][e]["samples_per_sec"] for r in jr if len(r["epochs"]) > e])
            row[f"{name}_benefit"] = summary([r["epochs"][-1]["tier_benefit"] for r in jr
                                              if r["epochs"] and r["epochs"][-1]["tier_benefit"] is not None])
            row[f"{name}_owed"] = summary([r["epochs"][-1]["tier_owed_bytes"] for r in jr if r["epochs"]])
            row[f"{name}_evicted"] = summary([sum(e["tier_evicted_bytes"] or 0 for e in r["epochs"]) for r in jr])
        # A round's pair: both jobs' rates, in rounds where both ran to the end.
        row["pair_by_round"] = {}
        for rnd in rounds:
            rr = [r for r in rs if r["round"] == rnd]
            if len(rr) == len(JOBS) and all(r.get("samples_per_sec") for r in rr):
                row["pair_by_round"][rnd] = sum(r["samples_per_sec"] for r in rr)
        row["pair"] = summary(list(row["pair_by_round"].values()))
        row["store_gb"] = summary([next(r["server_get_bytes"] for r in rs if r["round"] == rnd) / 1e9
                                   for rnd in rounds])
        row["exactly_once"] = all(r.get("exactly_once") for r in rs)
        row["failed"] = sum(1 for r in rs if "error" in r)
        out[config] = row
    ratios = []
    for rnd in sorted({r["round"] for r in runs}):
        p = out.get("placement", {}).get("pair_by_round", {}).get(rnd)
        e = out.get("even", {}).get("pair_by_round", {}).get(rnd)
        if p and e:
            ratios.append(p / e)
    out["placement_over_even"] = summary(ratios)
    return out


def fmt(s, f="{:.0f}") -> str:
    if not s or s.get("median") is None:
        return "–"
    return f"{f.format(s['median'])} [{f.format(s['min'])}, {f.format(s['max'])}]"


def report(res: dict, out: Path):
    s = res["summary"]
    lines = [
        "# Benefit-aware placement in one local tier (issue 56, item 4)", "",
        f"Command: `{res['command']}`  ",
        f"Build: `{res['build']}`, {res['date']}  ",
        f"Two datasets of {res['dataset_bytes'] / 1e9:.3f} GB each (s3://brand/ds and a copy at s3://brand/ds2), "
        f"{res['samples']} samples each; link {res['rate']}, RTT {2 * res['delay_ms']:.0f} ms (tier.py's); tier limit "
        f"{res['limit'] / 1e9:.3f} GB (fits one); {res['epochs']} epochs a job, one process each, started together; "
        f"the compute job spends {res['compute_ms']} ms a batch. Rounds: {res['rounds']}, interleaved. Figures: "
        "median [min, max] over rounds.", "",
        "| configuration | io job samples/s | compute job samples/s | pair samples/s | store GB (both) | "
        "io epochs 0 / 1 / 2 samples/s | io benefit, owed GB | compute benefit, owed GB | evicted GB (io, compute) | exactly once |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for config in CONFIGS:
        r = s.get(config)
        if not r:
            continue
        epochs = " / ".join(fmt(r.get(f"io_e{e}")) for e in range(res["epochs"]))
        gb = lambda x: fmt({k: (v / 1e9 if isinstance(v, (int, float)) else v) for k, v in (x or {}).items()}, "{:.2f}")  # noqa: E731
        lines.append(
            f"| {config} | {fmt(r['io'])} | {fmt(r['compute'])} | {fmt(r['pair'])} | {fmt(r['store_gb'], '{:.2f}')} | "
            f"{epochs} | {fmt(r.get('io_benefit'), '{:.2f}')}, {gb(r.get('io_owed'))} | "
            f"{fmt(r.get('compute_benefit'), '{:.2f}')}, {gb(r.get('compute_owed'))} | "
            f"{gb(r.get('io_evicted'))}, {gb(r.get('compute_evicted'))} | {r['exactly_once']} |")
    po = s.get("placement_over_even")
    lines += ["", f"Pair's total with placement / with an even split, per round: {fmt(po, '{:.2f}')} "
              f"(goal > 1: {'met' if po and po.get('min', 0) > 1 else 'NOT met' if po else '–'})."]
    (out / "placement-results.md").write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/brand-bench/tier"))
    ap.add_argument("--samples", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--compute-ms", type=float, default=800.0, help="the compute job's milliseconds a batch (of 256: brand read's default)")
    ap.add_argument("--limit", type=int, default=None, help="the tier's bytes (default 1.05x one dataset)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--read-gap", default="auto")
    objstore.add_setup_args(ap)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--build", help="the commit the binaries were built from (default: this checkout's HEAD)")
    a = ap.parse_args()
    a.out = a.out or a.work / "out-placement"
    if os.geteuid() != 0:
        sys.exit("placement.py needs root (network namespaces, tc, cgroups)")
    meta = objstore.prepare(a)
    extra = tierbench.prepare_tier(a, meta)
    copy_dataset(a)
    a.out.mkdir(parents=True, exist_ok=True)
    limit = a.limit or int(extra["brand_object_bytes"] * 1.05)
    configs = [c for c in a.configs.split(",") if c]
    layout, groups, net = objstore.set_up(a)
    build = a.build or sh("git", "-C", ROOT, "rev-parse", "--short", "HEAD", check=False).stdout.strip()
    runs: list = []
    res = {"command": " ".join(["bench/placement.py", *sys.argv[1:]]), "build": build,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "samples": meta["samples"],
           "dataset_bytes": extra["brand_object_bytes"], "limit": limit, "rate": a.rate, "delay_ms": a.delay_ms,
           "rounds": a.rounds, "epochs": a.epochs, "compute_ms": a.compute_ms, "runs": runs}

    def save():
        (a.out / "placement-results.json").write_text(json.dumps(res, indent=1))
        res["summary"] = summarise(res)
        (a.out / "placement-results.json").write_text(json.dumps(res, indent=1))
        report(res, a.out)

    t_start = time.time()
    try:
        net.up()
        for rnd in range(a.rounds):
            k = rnd % len(configs)
            for config in configs[k:] + configs[:k]:
                evict(tierbench.files_under(a.work / "ptier", a.work / "ptier-io", a.work / "ptier-compute"))
                runs += run_config(a, net, groups, meta, config, rnd, limit)
            print(f"round {rnd} done ({time.time() - t_start:.0f} s)", file=sys.stderr)
            save()
    finally:
        net.down()
        groups.close()
        for d in ("ptier", "ptier-io", "ptier-compute"):
            shutil.rmtree(a.work / d, ignore_errors=True)
        res["total_secs"] = time.time() - t_start
        if runs:
            save()
    print(a.out / "placement-results.md")


if __name__ == "__main__":
    main()
