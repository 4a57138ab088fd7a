#!/usr/bin/env python3
"""brand's local disk tier for a dataset at a URL (issue 56), over objstore.py's shaped link.

    V=$(scripts/objstore-venv.sh)
    sudo "$V/bin/python" bench/tier.py --work /var/tmp/brand-bench/tier --samples 8000 --rounds 5

Everything network-side is bench/objstore.py's, imported (Net: two namespaces, a veth shaped by
`tc tbf` at --rate, the delay relay for the round trip, tools/s3-server with /_admin/stats in the
server's namespace; prepare: the dataset in brand's, MDS's and LitData's forms; Groups: one v1
memory group per loader process of ALLOWANCE + 10 % of the dataset; probe: the link's rate each
round; order_quality, summary). The tier directory, the local copy and the peers' caches are on
this machine's disk under WORK.

Parts, each in every round (--rounds, the configurations' order rotating each round):

  brand    `brand read s3://brand/ds --memory 10% --read-gap G --seed R --json
           --start-epoch E --epochs 1 [--disk-cache WORK/tier --disk-cache-limit L%]`, one process per
           epoch E = 0, 1, 2 against the same tier directory (deleted before epoch 0 of each
           configuration): a later process starts warm from the tier (the restart case). L = none
           (no tier), 10, 30, 50, 100. The server's counters are reset before each process and read
           after it: exact GETs and bytes per epoch.
  tiered   as brand, with `--policy tiered` (the order that changes: the tier's pinned chunks served at
           random over the epoch, the others read whole once an epoch through a shuffle buffer of
           the memory), L = --tiered-limits (30, 50).
  local    `brand read WORK/local --memory 10% --read-gap G --seed R --start-epoch E --epochs 1`
           for E = 1, 2: brand's objects downloaded to a directory on the same disk (part 4's
           reference for the 100 % tier's warm epochs).
  mds      MosaicML Streaming (runners/tier_peer.py): one process, 3 epochs, cache_limit = L × its
           shards' bytes (+ its index.json, which it counts in its cache) or none (unlimited);
           server counters snapshotted between epochs (the runner waits for `go` before each).
  litdata  LitData with max_cache_size (optional: --parts ...,litdata).
  jobs     --jobs brand processes (seeds R*100+j) sharing one fresh tier of 100 %, started together,
           epoch 0 (cold) then, all together again, epoch 1 (warm), each one process in its own
           memory group; and each seed alone (a fresh tier, epoch 0 then 1) for its rate alone.

Page cache: before every process the tier's, the local copy's and the peers' cache files are
evicted (posix_fadvise DONTNEED); the server's files stay in the host's cache (the link is the
limit, as in objstore.py). brand reads its tier with O_DIRECT either way.

Output in WORK/out: tier-results.json, tier-results.md, tier.png (copy the last two to docs/bench/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import objstore  # noqa: E402
from objstore import (ENDPOINT, MIB, Net, DiskWatch, LocalServer, order_quality, parse_brand, probe,  # noqa: E402,F401
                      s3_client, sh, summary, tagged_lines, next_tagged, tail)
from brandbench.cgroups import Groups, RssSampler, evict  # noqa: E402

ROOT = HERE.parent
BRAND_LIMITS = ("0", "10", "30", "50", "100")
MDS_LIMITS = ("none", "10", "30", "50", "100")
TIER_KEYS = ("store_requests", "store_bytes_fetched", "tier_hits", "tier_hit_bytes", "tier_chunks_fetched",
             "tier_bytes_fetched", "tier_refused", "tier_waited", "tier_held_bytes", "tier_limit_bytes",
             "bytes_read", "refills", "store_retries")


def files_under(*dirs: Path) -> list[Path]:
    out = []
    for d in dirs:
        if d and d.exists():
            out += [p for p in d.rglob("*") if p.is_file()]
    return out


# ---------------------------------------------------------------- brand, one epoch per process


def brand_argv(a, src: str, epoch: int, seed: int, limit: str | None, tier: Path | None,
               policy: str = "brand") -> list[str]:
    argv = [a.brand, "read", src, "--memory", "10%", "--read-gap", a.read_gap, "--epochs", "1", "--start-epoch",
            str(epoch), "--seed", str(seed), "--policy", policy, "--json"]
    if limit is not None and limit != "0":
        argv += ["--disk-cache", str(tier), "--disk-cache-limit", f"{limit}%"]
    return argv


def brand_record(ep: dict) -> dict:
    m = ep.get("metrics", {}) or {}
    order = ep.get("order", {}) or {}
    rec = dict(samples=ep.get("samples"), seconds=ep.get("seconds"), samples_per_sec=ep.get("samples_per_sec"),
               useful_mb_per_sec=ep.get("useful_mb_per_sec"), first_batch_s=ep.get("first_batch_wait_secs"),
               open_s=ep.get("open_secs"), cpu_s=ep.get("cpu_seconds"), peak_rss_self=ep.get("peak_rss_bytes"),
               exactly_once=ep.get("exactly_once"), chunk_mate_dispersion=order.get("chunk_mate_dispersion"),
               read_amplification=ep.get("read_amplification"))
    for k in TIER_KEYS:
        rec["m_" + k] = m.get(k)
    return rec


def run_brand(a, net: Net, groups: Groups, meta: dict, *, part: str, config: str, rnd: int, epoch: int, seed: int,
              src: str = "s3://brand/ds", limit: str | None = None, tier: Path | None = None,
              policy: str = "brand") -> dict:
    g = groups.run_group("net", a.allowance + meta["bytes"] // 10)
    rec = {"part": part, "config": config, "round": rnd, "epoch": epoch, "seed": seed}
    evict(files_under(a.work / "tier", a.work / "local"))
    net.admin("reset-stats", "POST")
    try:
        argv = brand_argv(a, src, epoch, seed, limit, tier, policy)
        rec["argv"] = " ".join(str(x) for x in argv)
        sampler = RssSampler(g)
        sampler.start()
        t0 = time.perf_counter()
        p = subprocess.run(g.wrap(net.exec_c(argv)), capture_output=True, text=True, env=objstore.brand_env(a),
                           timeout=a.timeout)
        rec["wall_s"] = time.perf_counter() - t0
        rec["peak_rss_group"] = sampler.stop()
        rec["oom_kills"] = g.oom_kills()
        if p.returncode != 0:
            raise RuntimeError(f"brand read exit {p.returncode}: {p.stderr[-1500:]}")
        rec.update(brand_record(parse_brand(p.stdout)))
        if p.stderr.strip():
            rec["stderr"] = p.stderr[-1000:]
    except Exception as e:  # noqa: BLE001 (recorded, the run goes on)
        rec["error"] = str(e)[-2000:]
        print(f"  {part} {config} r{rnd} e{epoch}: FAILED {rec['error'][-600:]}", file=sys.stderr)
    finally:
        groups.release(g)
    st = net.admin("stats")
    rec.update(server_gets=st.get("get_requests"), server_get_bytes=st.get("get_bytes"),
               server_heads=st.get("head_requests"), server_lists=st.get("list_requests"))
    return rec


def say_brand(r: dict):
    print(f"  {r['part']} {r['config']} r{r['round']} e{r['epoch']}: {r.get('useful_mb_per_sec') or 0:.1f} MB/s, "
          f"GETs {r.get('server_gets')}, {(r.get('server_get_bytes') or 0) / 1e6:.0f} MB, hits {r.get('m_tier_hits')}, "
          f"first {r.get('first_batch_s')}, once {r.get('exactly_once')}", file=sys.stderr)


def brand_config(a, net, groups, meta, limit: str, rnd: int, runs: list, policy: str = "brand"):
    tier = a.work / "tier"
    shutil.rmtree(tier, ignore_errors=True)
    part = "brand" if policy == "brand" else policy
    for e in range(a.epochs):
        r = run_brand(a, net, groups, meta, part=part, config=limit, rnd=rnd, epoch=e, seed=rnd + 1,
                      limit=limit, tier=tier, policy=policy)
        runs.append(r)
        say_brand(r)
    r = runs[-1]
    r["tier_dir_bytes"] = sum(p.stat().st_blocks * 512 for p in files_under(tier))
    shutil.rmtree(tier, ignore_errors=True)


def local_config(a, net, groups, meta, rnd: int, runs: list):
    for e in range(1, a.epochs):
        r = run_brand(a, net, groups, meta, part="local", config="local", rnd=rnd, epoch=e, seed=rnd + 1,
                      src=str(a.work / "local"))
        runs.append(r)
        say_brand(r)


# ---------------------------------------------------------------- 4 jobs sharing one tier


def run_together(a, net, groups, meta, seeds: list[int], epoch: int, tier: Path, rnd: int, config: str) -> list[dict]:
    """One brand process per seed, started together, each in its own memory group; the server's
    counters over all of them (reset before, read after the last)."""
    gs = [groups.run_group("net", a.allowance + meta["bytes"] // 10) for _ in seeds]
    evict(files_under(tier))
    net.admin("reset-stats", "POST")
    procs, recs = [], []
    t0 = time.perf_counter()
    for g, s in zip(gs, seeds):
        argv = brand_argv(a, "s3://brand/ds", epoch, s, "100", tier)
        procs.append(subprocess.Popen(g.wrap(net.exec_c(argv)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=objstore.brand_env(a)))
    outs = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        outs.append((p.returncode, o, e, time.perf_counter() - t0))
    st = net.admin("stats")
    for g, s, (rc, o, e, wall) in zip(gs, seeds, outs):
        rec = {"part": "jobs", "config": config, "round": rnd, "epoch": epoch, "seed": s, "wall_s": wall,
               "oom_kills": g.oom_kills()}
        try:
            if rc != 0:
                raise RuntimeError(f"brand read exit {rc}: {e[-1500:]}")
            rec.update(brand_record(parse_brand(o)))
        except Exception as ex:  # noqa: BLE001
            rec["error"] = str(ex)[-2000:]
            print(f"  jobs {config} r{rnd} e{epoch} seed {s}: FAILED {rec['error'][-600:]}", file=sys.stderr)
        groups.release(g)
        recs.append(rec)
    for rec in recs:
        rec.update(group_server_gets=st.get("get_requests"), group_server_get_bytes=st.get("get_bytes"))
    return recs


def jobs_part(a, net, groups, meta, rnd: int, runs: list, order: list[str]):
    seeds = [(rnd + 1) * 100 + j for j in range(a.jobs)]
    tier = a.work / "tier"
    for what in order:
        if what == "together":
            shutil.rmtree(tier, ignore_errors=True)
            for e in (0, 1):
                recs = run_together(a, net, groups, meta, seeds, e, tier, rnd, "together")
                runs += recs
                print(f"  jobs together r{rnd} e{e}: server {recs[0]['group_server_gets']} GETs "
                      f"{(recs[0]['group_server_get_bytes'] or 0) / 1e6:.0f} MB; MB/s "
                      f"{[round(r.get('useful_mb_per_sec') or 0, 1) for r in recs]}", file=sys.stderr)
        else:
            for s in seeds:
                shutil.rmtree(tier, ignore_errors=True)
                for e in (0, 1):
                    recs = run_together(a, net, groups, meta, [s], e, tier, rnd, "alone")
                    runs += recs
                print(f"  jobs alone r{rnd} seed {s}: MB/s "
                      f"{[round(r.get('useful_mb_per_sec') or 0, 1) for r in runs[-2:]]}", file=sys.stderr)
    shutil.rmtree(tier, ignore_errors=True)


# ---------------------------------------------------------------- peers, E epochs in one process


def run_peer(a, net, groups, meta, loader: str, limit: str, limit_bytes: int | None, rnd: int, runs: list):
    g = groups.run_group("net", a.allowance + meta["bytes"] // 10)
    cache = a.work / "cache" / loader
    shutil.rmtree(cache, ignore_errors=True)
    ids_dir = a.out / "ids"
    ids_dir.mkdir(parents=True, exist_ok=True)
    prefix = ids_dir / f"{loader}-{limit}"
    argv = [a.venv_python, HERE / "runners" / "tier_peer.py", loader, "--endpoint", ENDPOINT, "--out-prefix", prefix,
            "--cache", cache, "--cache-limit", "none" if limit_bytes is None else limit_bytes, "--seed", rnd + 1,
            "--workers", a.peer_workers, "--epochs", a.epochs]
    env = objstore.env_s3(ENDPOINT)
    env["PYTHONUNBUFFERED"] = "1"
    logs = a.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    errf = logs / f"{loader}-{limit}-{rnd}.err"
    base = {"part": loader, "config": limit, "round": rnd, "limit_bytes": limit_bytes, "workers": a.peer_workers}
    recs = []
    with open(errf, "w") as ef:
        p = subprocess.Popen(g.wrap(net.exec_c(argv)), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=ef,
                             text=True, env=env)
    try:
        q = tagged_lines(p)
        first = next_tagged(q, p, time.monotonic() + 180)
        if first is None or not first.get("ready"):
            raise RuntimeError(f"{loader} did not start: {first} {tail(errf)}")
        with DiskWatch(cache) as dw:
            for e in range(a.epochs):
                rec = {**base, "epoch": e}
                evict(files_under(cache))
                net.admin("reset-stats", "POST")
                sampler = RssSampler(g)
                sampler.start()
                t0 = time.perf_counter()
                p.stdin.write("go\n")
                p.stdin.flush()
                res = next_tagged(q, p, time.monotonic() + a.timeout)
                rec["wall_s"] = time.perf_counter() - t0
                rec["peak_rss_group"] = sampler.stop()
                st = net.admin("stats")
                rec.update(server_gets=st.get("get_requests"), server_get_bytes=st.get("get_bytes"),
                           oom_kills=g.oom_kills(), local_disk_peak=dw.peak)
                if res is None or "error" in res:
                    why = f"OOM kills {rec['oom_kills']}" if rec["oom_kills"] else ""
                    rec["error"] = f"{loader} {limit} epoch {e}: {why} {res} {tail(errf)}"[-2000:]
                    recs.append(rec)
                    print(f"  {loader} {limit} r{rnd} e{e}: FAILED {rec['error'][-600:]}", file=sys.stderr)
                    break
                import numpy as np
                ids = np.load(f"{prefix}-e{e}.npy").tolist()
                qo = order_quality(ids, meta["samples"], meta["chunk_size"])
                rec.update(samples=res["samples"], seconds=res["seconds"],
                           samples_per_sec=res["samples"] / res["seconds"],
                           useful_mb_per_sec=res["bytes"] / res["seconds"] / 1e6, first_batch_s=res["first_batch_s"],
                           cache_bytes=res.get("cache_bytes"), **qo)
                recs.append(rec)
                print(f"  {loader} {limit} r{rnd} e{e}: {rec['useful_mb_per_sec']:.1f} MB/s, GETs {rec['server_gets']}, "
                      f"{(rec['server_get_bytes'] or 0) / 1e6:.0f} MB, cache {(rec['cache_bytes'] or 0) / 1e6:.0f} MB, "
                      f"once {rec['exactly_once']}", file=sys.stderr)
    except Exception as ex:  # noqa: BLE001
        recs.append({**base, "epoch": len(recs), "error": str(ex)[-2000:]})
        print(f"  {loader} {limit} r{rnd}: FAILED {str(ex)[-600:]}", file=sys.stderr)
    finally:
        if p.poll() is None:
            try:
                p.stdin.close()
            except OSError:
                pass
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        groups.release(g)
        shutil.rmtree(cache, ignore_errors=True)
    runs += recs
    return recs


# ---------------------------------------------------------------- preparing: local copy, shard sizes


def prepare_tier(a, meta: dict) -> dict:
    """brand's objects in a local directory (the local copy), and MDS's/LitData's shard bytes."""
    extra_file = a.work / "tier-dataset.json"
    if extra_file.exists() and (a.work / "local").exists():
        return json.loads(extra_file.read_text())
    server = LocalServer(a, a.work / "srv")
    try:
        s3 = s3_client(server.endpoint)

        def listing(bucket, prefix):
            out = []
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                out += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
            return out

        local = a.work / "local"
        shutil.rmtree(local, ignore_errors=True)
        brand_objs = listing("brand", "ds/")
        for k, _ in brand_objs:
            dst = local / k[len("ds/"):]
            dst.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file("brand", k, str(dst))
        mds = listing("mds", "ds/")
        lit = listing("litdata", "ds/")
    finally:
        server.close()
    os.sync()
    extra = {"brand_object_bytes": sum(s for _, s in brand_objs), "brand_objects": len(brand_objs),
             "mds_shard_bytes": sum(s for k, s in mds if k.endswith(".mds")),
             "mds_index_bytes": sum(s for k, s in mds if k.endswith("index.json")),
             "mds_max_shard": max(s for k, s in mds if k.endswith(".mds")),
             "mds_shards": sum(1 for k, _ in mds if k.endswith(".mds")),
             "litdata_chunk_bytes": sum(s for k, s in lit if k.endswith(".bin")),
             "litdata_chunks": sum(1 for k, _ in lit if k.endswith(".bin"))}
    extra_file.write_text(json.dumps(extra))
    return extra


def peer_limit_bytes(loader: str, limit: str, extra: dict) -> int | None:
    if limit == "none":
        return None
    f = int(limit) / 100
    if loader == "mds":
        # Streaming counts its index.json in its cache usage: the share is of the shards.
        return int(f * extra["mds_shard_bytes"]) + extra["mds_index_bytes"]
    return int(f * extra["litdata_chunk_bytes"])


# ---------------------------------------------------------------- summary and report


def ok(c) -> str:
    return "met" if c else "NOT met"


def summarise(res: dict) -> dict:
    runs, meta, extra = res["runs"], res["dataset"], res["tier_dataset"]
    dbytes, n = extra["brand_object_bytes"], meta["samples"]
    link = {l["round"]: l["mb_per_s"] for l in res["links"] if l["kind"] == "parallel"}
    out: dict = {"brand": {}, "tiered": {}, "local": {}, "mds": {}, "litdata": {}, "jobs": {}}

    def cell(rs, key, f=lambda r, v: v):
        return summary([f(r, r.get(key)) if r.get(key) is not None else None for r in rs])

    for part in ("brand", "tiered", "local", "mds", "litdata"):
        ref_bytes = dbytes if part in ("brand", "tiered", "local") else (extra["mds_shard_bytes"] if part == "mds"
                                                              else extra["litdata_chunk_bytes"])
        for cfg in sorted({r["config"] for r in runs if r["part"] == part}):
            for e in range(res["epochs"]):
                rs = [r for r in runs if r["part"] == part and r["config"] == cfg and r["epoch"] == e]
                if not rs:
                    continue
                good = [r for r in rs if "error" not in r]
                row = {"runs": len(good), "failed": len(rs) - len(good),
                       "errors": sorted({r["error"][-300:] for r in rs if "error" in r})}
                row["bytes_x"] = cell(good, "server_get_bytes", lambda r, v: v / ref_bytes)
                row["gets"] = cell(good, "server_gets")
                row["gets_per_sample"] = cell(good, "server_gets", lambda r, v: v / n)
                for k in ("useful_mb_per_sec", "samples_per_sec", "first_batch_s", "chunk_mate_dispersion",
                          "m_tier_hits", "m_tier_hit_bytes", "m_tier_chunks_fetched", "m_tier_bytes_fetched",
                          "m_tier_refused", "m_tier_waited", "m_tier_held_bytes", "m_store_requests",
                          "m_store_bytes_fetched", "wall_s", "cpu_s", "peak_rss_group", "local_disk_peak",
                          "cache_bytes", "tier_dir_bytes"):
                    row[k] = cell(good, k)
                row["link_fraction"] = summary([r["useful_mb_per_sec"] / link[r["round"]] for r in good
                                                if r.get("useful_mb_per_sec") and r["round"] in link])
                row["exactly_once"] = all(r.get("exactly_once") for r in good) if good else None
                out[part].setdefault(cfg, {})[str(e)] = row
    # jobs: per round, group bytes of epoch 0 and 1; each job's rate / its rate alone (same round, seed, epoch).
    jr = [r for r in runs if r["part"] == "jobs"]
    if jr:
        per_round = {}
        for rnd in sorted({r["round"] for r in jr}):
            tog = [r for r in jr if r["round"] == rnd and r["config"] == "together"]
            alone = {(r["seed"], r["epoch"]): r for r in jr if r["round"] == rnd and r["config"] == "alone"}
            d = {}
            for e in (0, 1):
                te = [r for r in tog if r["epoch"] == e]
                if te:
                    d[f"e{e}_bytes_x"] = (te[0].get("group_server_get_bytes") or 0) / dbytes
                    d[f"e{e}_gets"] = te[0].get("group_server_gets")
                    d[f"e{e}_ratios"] = [
                        (r["useful_mb_per_sec"] / alone[(r["seed"], e)]["useful_mb_per_sec"])
                        if r.get("useful_mb_per_sec") and alone.get((r["seed"], e), {}).get("useful_mb_per_sec")
                        else None for r in te]
                    d[f"e{e}_rates"] = [r.get("useful_mb_per_sec") for r in te]
                    d[f"e{e}_alone_rates"] = [alone.get((r["seed"], e), {}).get("useful_mb_per_sec") for r in te]
                    d[f"e{e}_exactly_once"] = all(r.get("exactly_once") for r in te)
                    d[f"e{e}_errors"] = [r["error"][-300:] for r in te if "error" in r]
                    d[f"e{e}_waited"] = sum(r.get("m_tier_waited") or 0 for r in te)
                    d[f"e{e}_cpu_s"] = [r.get("cpu_s") for r in te]
                    d[f"e{e}_wall_s"] = max(r.get("wall_s") or 0 for r in te)
            per_round[rnd] = d
        out["jobs"] = {"per_round": per_round}
        for e in (0, 1):
            out["jobs"][f"e{e}_bytes_x"] = summary([d.get(f"e{e}_bytes_x") for d in per_round.values()])
            out["jobs"][f"e{e}_gets"] = summary([d.get(f"e{e}_gets") for d in per_round.values()])
            allr = [x for d in per_round.values() for x in d.get(f"e{e}_ratios", [])]
            out["jobs"][f"e{e}_ratio"] = summary(allr)
            out["jobs"][f"e{e}_min_ratio_per_round"] = summary([min((x for x in d.get(f"e{e}_ratios", []) if x),
                                                                    default=None) for d in per_round.values()])
            out["jobs"][f"e{e}_rate"] = summary([x for d in per_round.values() for x in d.get(f"e{e}_rates", [])])
            out["jobs"][f"e{e}_alone_rate"] = summary([x for d in per_round.values()
                                                       for x in d.get(f"e{e}_alone_rates", [])])
    return out


def fmt(s, digits=2, scale=1.0):
    if not s:
        return "–"
    return f"{s['median'] / scale:.{digits}f} [{s['min'] / scale:.{digits}f}, {s['max'] / scale:.{digits}f}]"


def med(s):
    return s["median"] if s else float("nan")


def no_data(bytes_x) -> bool:
    """Whether no run fetched a segment's byte: under a thousandth of the dataset is its manifest
    and index (one chunk is 1/125 of it)."""
    return bool(bytes_x) and bytes_x["max"] < 0.001


def goals(res: dict) -> list[str]:
    S, G = res["summary"], []
    b = S["brand"]
    full = b.get("100", {})
    if full.get("0"):
        e0 = full["0"]
        G.append(f"tier 100 %, epoch 0: store bytes {fmt(e0['bytes_x'])}× the dataset (≤ 1.1: "
                 f"{ok(med(e0['bytes_x']) <= 1.1)}), {fmt(e0['gets_per_sample'], 3)} GETs per sample (≤ 0.15: "
                 f"{ok(med(e0['gets_per_sample']) <= 0.15)}), {fmt(e0['link_fraction'])} of the link (≥ 0.95: "
                 f"{ok(med(e0['link_fraction']) >= 0.95)})")
    for e in range(1, res["epochs"]):
        r = full.get(str(e))
        if r:
            G.append(f"tier 100 %, epoch {e}: store GETs {fmt(r['gets'], 0)}, bytes {fmt(r['bytes_x'], 4)}× "
                     f"(no segment byte: {ok(no_data(r['bytes_x']))}; a process's open GETs its manifest)")
        loc = S["local"].get("local", {}).get(str(e))
        if r and loc and r["useful_mb_per_sec"] and loc["useful_mb_per_sec"]:
            ratio = med(r["useful_mb_per_sec"]) / med(loc["useful_mb_per_sec"])
            G.append(f"tier 100 %, epoch {e}: {fmt(r['useful_mb_per_sec'], 0)} MB/s against the local copy's "
                     f"{fmt(loc['useful_mb_per_sec'], 0)} MB/s = {ratio:.2f}× (≥ 0.9: {ok(ratio >= 0.9)})")
    none = b.get("0", {})
    for lim in ("30", "50", "10"):
        for e in range(1, res["epochs"]):
            r, n0 = b.get(lim, {}).get(str(e)), none.get(str(e))
            if not (r and n0 and med(n0["bytes_x"]) and med(n0["gets"])):
                continue
            f = int(lim) / 100
            bound = 1 - f + 0.05
            rb = med(r["bytes_x"]) / med(n0["bytes_x"])
            rg = med(r["gets"]) / med(n0["gets"])
            G.append(f"tier {lim} %, epoch {e}: store bytes {rb:.3f}× and GETs {rg:.3f}× the no-tier figure "
                     f"(≤ {bound:.2f}: bytes {ok(rb <= bound)}, GETs {ok(rg <= bound)})")
    t, m = S.get("tiered", {}), S.get("mds", {})
    for lim in sorted(t, key=int):
        for e in range(1, res["epochs"]):
            r, n0, br = t[lim].get(str(e)), none.get(str(e)), b.get(lim, {}).get(str(e))
            if not (r and n0 and med(n0["bytes_x"]) and med(n0["gets"])):
                continue
            f = int(lim) / 100
            rb, rg = med(r["bytes_x"]) / med(n0["bytes_x"]), med(r["gets"]) / med(n0["gets"])
            G.append(f"tiered {lim} %, epoch {e}: store bytes {rb:.3f}× and GETs {rg:.4f}× the no-tier figure "
                     f"(proportional: {1 - f:.2f}; bytes ≤ {1 - f + 0.05:.2f}: {ok(rb <= 1 - f + 0.05)}, GETs better "
                     f"than proportional: {ok(rg < 1 - f)}); brand's order at {lim} %: GETs "
                     f"{med(br['gets']) / med(n0['gets']) if br else float('nan'):.3f}×")
            mr = m.get(lim, {}).get(str(e))
            if mr and mr["chunk_mate_dispersion"] and r["chunk_mate_dispersion"]:
                d, dm = med(r["chunk_mate_dispersion"]), med(mr["chunk_mate_dispersion"])
                G.append(f"tiered {lim} %, epoch {e}: dispersion {d:.3f} against Streaming's {dm:.3f} at cache_limit "
                         f"{lim} % ({d / dm:.2f}×; ≥ 2×: {ok(d >= 2 * dm)}), which fetched {fmt(mr['bytes_x'])}× its "
                         f"shards against tiered's {fmt(r['bytes_x'])}× the dataset")
    for lim in ("30", "50", "100", "none"):
        for e in range(1, res["epochs"]):
            r, br = m.get(lim, {}).get(str(e)), b.get(lim if lim != "none" else "100", {}).get(str(e))
            if r and r["bytes_x"]:
                G.append(f"Streaming cache_limit {lim}{' %' if lim != 'none' else ''}, epoch {e}: "
                         f"{fmt(r['bytes_x'])}× its shards' bytes (brand tier {lim if lim != 'none' else '100'} %: "
                         f"{fmt(br['bytes_x']) if br else '–'}× its dataset)")
    j = S.get("jobs", {})
    if j.get("e0_bytes_x"):
        G.append(f"{res['jobs']} jobs sharing one tier: store bytes over their first epochs {fmt(j['e0_bytes_x'])}× "
                 f"the dataset (≤ 1.1: {ok(med(j['e0_bytes_x']) <= 1.1)}); over their second epochs "
                 f"{fmt(j['e1_bytes_x'], 4)}× ({fmt(j['e1_gets'], 0)} GETs, each process's manifest; no segment "
                 f"byte: {ok(no_data(j['e1_bytes_x']))})")
        G.append(f"{res['jobs']} jobs: each job's rate / its rate alone, epoch 0: {fmt(j['e0_ratio'])} "
                 f"(the slowest job per round: {fmt(j['e0_min_ratio_per_round'])}; ≥ 0.9: "
                 f"{ok(j['e0_min_ratio_per_round'] and j['e0_min_ratio_per_round']['median'] >= 0.9)}); epoch 1: "
                 f"{fmt(j['e1_ratio'])} (slowest per round {fmt(j['e1_min_ratio_per_round'])}; ≥ 0.9: "
                 f"{ok(j['e1_min_ratio_per_round'] and j['e1_min_ratio_per_round']['median'] >= 0.9)})")
    return G


def report(res: dict, out: Path):
    S, meta, extra = res["summary"], res["dataset"], res["tier_dataset"]
    link = res["link_summary"]
    L = ["# brand's local disk tier for a dataset at a URL (issue 56)", "",
         f"Command: `{res['command']}`  ", f"Build: `{res['build']}`, {res['date']}  ",
         f"Dataset: {meta['samples']} samples, {extra['brand_object_bytes'] / 1e9:.3f} GB of brand objects "
         f"({meta['mean_kib']:.0f} KiB mean, chunks of {meta['chunk_size']}, {meta['chunks']} chunks); MDS "
         f"{extra['mds_shards']} shards, {extra['mds_shard_bytes'] / 1e9:.3f} GB. Memory groups of "
         f"{res['allowance'] / MIB:.0f} MiB + 10 % of the dataset ({meta['bytes'] // 10 / MIB:.0f} MiB), one per "
         f"process.  ",
         f"Link: tbf {res['rate']} each way + delay relay {res['delay_ms']} ms each way (RTT "
         f"{2 * res['delay_ms']:.0f} ms); 8 MiB GETs ×16: {fmt(link.get('parallel'), 1)} MB/s, one stream "
         f"{fmt(link.get('single'), 1)} MB/s. Tier and local copy on {res['disk']}. Rounds: {res['rounds']}, "
         "interleaved (order rotating). Figures: median [min, max] over rounds.", ""]
    L += ["## brand: one process per epoch, tier limit = share of the dataset", "",
          "Store figures are the server's counters for that process (manifest and index included). "
          "Bytes as a multiple of the dataset's objects' bytes.", "",
          "| tier | epoch | store bytes × dataset | GETs | GETs / sample | tier hits | useful MB/s | of link | "
          "first batch s | dispersion | exactly once | runs (failed) |", "|---" * 12 + "|"]
    for lim in BRAND_LIMITS:
        for e, r in sorted(S["brand"].get(lim, {}).items()):
            L.append(f"| {'none' if lim == '0' else lim + ' %'} | {e} | {fmt(r['bytes_x'], 3)} | {fmt(r['gets'], 0)} | "
                     f"{fmt(r['gets_per_sample'], 3)} | {fmt(r['m_tier_hits'], 0)} | {fmt(r['useful_mb_per_sec'], 1)} | "
                     f"{fmt(r['link_fraction'])} | {fmt(r['first_batch_s'])} | {fmt(r['chunk_mate_dispersion'], 3)} | "
                     f"{r['exactly_once']} | {r['runs']} ({r['failed']}) |")
    if S.get("tiered"):
        L += ["", "## brand `--policy tiered`: the tier's pinned chunks at random, the rest whole once an epoch", "",
              "The same runs as above with `--policy tiered` (the order changes: see DESIGN.md §3).", "",
              "| tier | epoch | store bytes × dataset | GETs | GETs / sample | tier hits | useful MB/s | of link | "
              "first batch s | dispersion | exactly once | runs (failed) |", "|---" * 12 + "|"]
        for lim in sorted(S["tiered"], key=int):
            for e, r in sorted(S["tiered"][lim].items()):
                L.append(f"| {lim} % | {e} | {fmt(r['bytes_x'], 3)} | {fmt(r['gets'], 0)} | "
                         f"{fmt(r['gets_per_sample'], 4)} | {fmt(r['m_tier_hits'], 0)} | {fmt(r['useful_mb_per_sec'], 1)} | "
                         f"{fmt(r['link_fraction'])} | {fmt(r['first_batch_s'])} | {fmt(r['chunk_mate_dispersion'], 3)} | "
                         f"{r['exactly_once']} | {r['runs']} ({r['failed']}) |")
    loc = S["local"].get("local", {})
    if loc:
        L += ["", "## Epochs 2+ from a 100 % tier against `brand read` of a local copy (same disk)", "",
              "| source | epoch | useful MB/s | first batch s | dispersion | CPU s | exactly once |", "|---" * 7 + "|"]
        for e in range(1, res["epochs"]):
            for name, r in (("tier 100 %", S["brand"].get("100", {}).get(str(e))), ("local copy", loc.get(str(e)))):
                if r:
                    L.append(f"| {name} | {e} | {fmt(r['useful_mb_per_sec'], 1)} | {fmt(r['first_batch_s'])} | "
                             f"{fmt(r['chunk_mate_dispersion'], 3)} | {fmt(r['cpu_s'], 2)} | {r['exactly_once']} |")
    for part, title in (("mds", "MosaicML Streaming, cache_limit (LRU), 3 epochs in one process"),
                        ("litdata", "LitData, max_cache_size, 3 epochs in one process")):
        if not S.get(part):
            continue
        L += ["", f"## {title}", "",
              "Store bytes as a multiple of its shards' bytes; the server's counters between epochs.", "",
              "| cache_limit | epoch | store bytes × shards | GETs | useful MB/s | of link | first batch s | "
              "dispersion | exactly once | cache peak MB | runs (failed) |", "|---" * 11 + "|"]
        for lim in MDS_LIMITS:
            for e, r in sorted(S[part].get(lim, {}).items()):
                L.append(f"| {lim}{' %' if lim != 'none' else ''} | {e} | {fmt(r['bytes_x'], 3)} | {fmt(r['gets'], 0)} | "
                         f"{fmt(r['useful_mb_per_sec'], 1)} | {fmt(r['link_fraction'])} | {fmt(r['first_batch_s'])} | "
                         f"{fmt(r['chunk_mate_dispersion'], 3)} | {r['exactly_once']} | "
                         f"{fmt(r['local_disk_peak'], 0, 1e6)} | {r['runs']} ({r['failed']}) |")
        errs = sorted({e for lim in S[part].values() for r in lim.values() for e in r["errors"]})
        if errs:
            L += ["", "Failures:", ""] + [f"- `{e.strip()[-300:]}`" for e in errs]
    j = S.get("jobs", {})
    if j.get("per_round"):
        L += ["", f"## {res['jobs']} brand jobs (different seeds) sharing one 100 % tier, started together", "",
              "| round | epoch 0 store × dataset | epoch 0 GETs | epoch 1 GETs | epoch 0 MB/s each (alone) | "
              "epoch 0 ratio each | epoch 1 ratio each | tier waits e0 |", "|---" * 8 + "|"]
        for rnd, d in sorted(j["per_round"].items(), key=lambda kv: int(kv[0])):
            r0 = ", ".join(f"{x:.0f} ({y:.0f})" for x, y in zip(d.get("e0_rates", []), d.get("e0_alone_rates", []))
                           if x and y)
            L.append(f"| {rnd} | {d.get('e0_bytes_x', 0):.3f} | {d.get('e0_gets')} | {d.get('e1_gets')} | {r0} | "
                     f"{', '.join(f'{x:.2f}' if x else '–' for x in d.get('e0_ratios', []))} | "
                     f"{', '.join(f'{x:.2f}' if x else '–' for x in d.get('e1_ratios', []))} | {d.get('e0_waited')} |")
        L += ["", f"Over rounds: epoch 0 store {fmt(j['e0_bytes_x'], 3)}× the dataset, epoch 1 {fmt(j['e1_gets'], 0)} GETs; "
              f"rate ratio epoch 0 {fmt(j['e0_ratio'])}, epoch 1 {fmt(j['e1_ratio'])}; rate together epoch 0 "
              f"{fmt(j['e0_rate'], 1)} MB/s, alone {fmt(j['e0_alone_rate'], 1)}; epoch 1 together {fmt(j['e1_rate'], 1)}, "
              f"alone {fmt(j['e1_alone_rate'], 1)}."]
    if res.get("goals"):
        L += ["", "## Goals", ""] + [f"- {g}" for g in res["goals"]]
    (out / "tier-results.md").write_text("\n".join(L) + "\n")
    plot(res, out / "tier.png")


def plot(res: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    S = res["summary"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    for part, key_of, marker, name in (("brand", lambda l: "0" if l == 0 else str(l), "o", "brand tier"),
                                       ("mds", lambda l: "none" if l == 0 else str(l), "s", "Streaming cache_limit")):
        for e, ls in ((0, "-"), (1, "--"), (2, ":")):
            xs, ys, lo, hi = [], [], [], []
            for lim in (0, 10, 30, 50, 100):
                if part == "mds" and lim == 0:
                    continue  # Streaming's "none" is an unlimited cache, not no cache: drawn at 100+ below
                r = S.get(part, {}).get(key_of(lim), {}).get(str(e))
                if r and r["bytes_x"]:
                    xs.append(lim)
                    ys.append(r["bytes_x"]["median"])
                    lo.append(r["bytes_x"]["median"] - r["bytes_x"]["min"])
                    hi.append(r["bytes_x"]["max"] - r["bytes_x"]["median"])
            if part == "mds":
                r = S.get(part, {}).get("none", {}).get(str(e))
                if r and r["bytes_x"]:
                    xs.append(110)
                    ys.append(r["bytes_x"]["median"])
                    lo.append(0)
                    hi.append(0)
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], marker=marker, ls=ls, capsize=3,
                            color="C3" if part == "brand" else "C0", label=f"{name}, epoch {e}")
    ax.set_xlabel("tier / cache limit, % of the dataset (brand 0: no tier; Streaming 110: unlimited)")
    ax.set_ylabel("store bytes per epoch ÷ dataset bytes (server)")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.legend(fontsize=7)
    ax.set_title("bytes fetched from the store per epoch")
    ax = axes[1]
    for part, cfgs, color in (("brand", BRAND_LIMITS, "C3"), ("mds", ("30", "50", "100", "none"), "C0")):
        for e, ls in ((0, "-"), (1, "--"), (2, ":")):
            xs, ys = [], []
            for c in cfgs:
                r = S.get(part, {}).get(c, {}).get(str(e))
                if r and r["useful_mb_per_sec"]:
                    xs.append(110 if c == "none" else int(c))
                    ys.append(r["useful_mb_per_sec"]["median"])
            if xs:
                ax.plot(xs, ys, marker="o", ls=ls, color=color, label=f"{part} epoch {e}")
    loc = S.get("local", {}).get("local", {})
    for e in range(1, res["epochs"]):
        if loc.get(str(e)) and loc[str(e)]["useful_mb_per_sec"]:
            ax.axhline(loc[str(e)]["useful_mb_per_sec"]["median"], color="k", ls=":", lw=1,
                       label=f"brand local copy, epoch {e}")
    if res["link_summary"].get("parallel"):
        ax.axhline(res["link_summary"]["parallel"]["median"], color="k", ls="--", lw=1, label="link")
    ax.set_yscale("log")
    ax.set_xlabel("tier / cache limit, %")
    ax.set_title("useful MB/s")
    ax.legend(fontsize=7)
    fig.suptitle(f"{res['dataset']['samples']} samples over tbf {res['rate']}, RTT {2 * res['delay_ms']:.0f} ms, "
                 f"memory groups of 640 MiB + 10 %")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/brand-bench/tier"))
    ap.add_argument("--samples", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--read-gap", default="auto",
                    help="brand's --read-gap (G above): auto, brand's default (the store's gap, probed once and "
                         "cached under WORK/home; a tier's reads are then records, not whole chunks), or whole")
    ap.add_argument("--parts", default="brand,local,mds,jobs")
    ap.add_argument("--limits", default=",".join(BRAND_LIMITS))
    ap.add_argument("--mds-limits", default=",".join(MDS_LIMITS))
    ap.add_argument("--tiered-limits", default="30,50", help="tier limits of the part tiered")
    ap.add_argument("--heavy", default="0,10,30,50",
                    help="brand limits run only in the first --heavy-rounds rounds (each of their epochs "
                         "fetches (1 - f) x ~9x the dataset at --read-gap whole: ~66 s at 1 Gbit/s)")
    ap.add_argument("--heavy-rounds", type=int, default=None, help="default: --rounds")
    ap.add_argument("--peer-rounds", type=int, default=None, help="peers run in the first N rounds (default: --rounds)")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--peer-workers", type=int, default=2)
    objstore.add_setup_args(ap)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--report-only", type=Path)
    ap.add_argument("--build", help="the commit the binaries were built from (default: this checkout's HEAD)")
    a = ap.parse_args()
    a.out = a.out or a.work / "out"
    if a.report_only:
        res = json.loads(a.report_only.read_text())
        res["summary"] = summarise(res)
        res["goals"] = goals(res)
        a.report_only.write_text(json.dumps(res, indent=1))
        report(res, a.report_only.parent)
        return
    if os.geteuid() != 0:
        sys.exit("tier.py needs root (network namespaces, tc, cgroups)")
    meta = objstore.prepare(a)
    extra = prepare_tier(a, meta)
    a.out.mkdir(parents=True, exist_ok=True)
    layout, groups, net = objstore.set_up(a)
    parts = [p for p in a.parts.split(",") if p]
    limits = [x for x in a.limits.split(",") if x]
    mds_limits = [x for x in a.mds_limits.split(",") if x]
    build = a.build or sh("git", "-C", ROOT, "rev-parse", "--short", "HEAD", check=False).stdout.strip()
    dirty = "" if a.build else sh("git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no",
                                  check=False).stdout.strip()
    disk = sh("df", "--output=source,fstype", a.work, check=False).stdout.split("\n")[1:2]
    runs, links = [], []
    res = {"command": " ".join(["bench/tier.py", *sys.argv[1:]]), "build": build + ("+dirty" if dirty else ""),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dataset": meta, "tier_dataset": extra,
           "allowance": a.allowance, "rate": a.rate, "delay_ms": a.delay_ms, "rounds": a.rounds, "epochs": a.epochs,
           "read_gap": a.read_gap, "heavy": a.heavy, "heavy_rounds": a.heavy_rounds,
           "peer_rounds": a.peer_rounds, "jobs": a.jobs, "peer_workers": a.peer_workers, "disk": " ".join(disk).strip() or str(a.work),
           "cgroup": f"v{layout.version}", "runs": runs, "links": links, "skipped": {}}

    def save():
        (a.out / "tier-results.json").write_text(json.dumps(res, indent=1))  # the raw runs first
        res["link_summary"] = {k: summary([l["mb_per_s"] for l in links if l["kind"] == k])
                               for k in ("parallel", "single")}
        res["summary"] = summarise(res)
        try:
            res["goals"] = goals(res)
        except Exception as e:  # noqa: BLE001 (the runs are kept whatever the report does)
            res["goals"] = [f"goals not computed: {e!r}"]
        (a.out / "tier-results.json").write_text(json.dumps(res, indent=1))
        report(res, a.out)

    refused: dict[tuple, str] = {}
    t_start = time.time()
    try:
        net.up()
        seg = None
        for rnd in range(a.rounds):
            if seg is None:
                big = max((p for p in (a.work / "local").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
                seg = "brand/ds/" + str(big.relative_to(a.work / "local"))
            for kind, streams, gs in (("parallel", 16, 8 * MIB), ("single", 1, 0)):
                p = sh(*net.exec_c([a.venv_python, HERE / "objstore.py", "probe", ENDPOINT, seg, streams, gs,
                                    min(meta["bytes"], 1 << 30)]), check=False)
                if p.returncode == 0:
                    links.append({"round": rnd, "kind": kind, **json.loads(p.stdout)})
                    print(f"round {rnd}: link {kind} {links[-1]['mb_per_s']:.1f} MB/s "
                          f"({time.time() - t_start:.0f} s)", file=sys.stderr)
                else:
                    print(f"probe failed: {p.stderr[-500:]}", file=sys.stderr)
            # The round's configurations, rotated.
            confs = [("jobs", "jobs")] if "jobs" in parts else []
            heavy = set(a.heavy.split(","))
            if "brand" in parts:
                confs += [("brand", x) for x in limits
                          if x not in heavy or a.heavy_rounds is None or rnd < a.heavy_rounds]
            if "tiered" in parts:
                confs += [("tiered", x) for x in a.tiered_limits.split(",") if x]
            if "local" in parts:
                confs.append(("local", "local"))
            for peer in ("mds", "litdata"):
                if peer in parts and (a.peer_rounds is None or rnd < a.peer_rounds):
                    confs += [(peer, x) for x in mds_limits]
            k = rnd % len(confs)
            for part, cfg in confs[k:] + confs[:k]:
                if part in ("brand", "tiered"):
                    brand_config(a, net, groups, meta, cfg, rnd, runs, policy=part)
                elif part == "local":
                    local_config(a, net, groups, meta, rnd, runs)
                elif part in ("mds", "litdata"):
                    if (part, cfg) in refused:
                        res["skipped"].setdefault(f"{part} {cfg}", []).append(rnd)
                        continue
                    recs = run_peer(a, net, groups, meta, part, cfg, peer_limit_bytes(part, cfg, extra), rnd, runs)
                    err = next((r["error"] for r in recs if "error" in r), "")
                    if "too low" in err or "larger than the cache limit" in err:
                        refused[(part, cfg)] = err  # a configuration the library refuses: not tried again
                else:
                    order = ["together", "alone"] if rnd % 2 == 0 else ["alone", "together"]
                    jobs_part(a, net, groups, meta, rnd, runs, order)
            print(f"round {rnd} done ({time.time() - t_start:.0f} s)", file=sys.stderr)
            save()
    finally:
        net.down()
        groups.close()
        shutil.rmtree(a.work / "cache", ignore_errors=True)
        shutil.rmtree(a.work / "tier", ignore_errors=True)
        res["total_secs"] = time.time() - t_start
        if runs:
            save()
    print(a.out / "tier-results.md")


if __name__ == "__main__":
    main()
