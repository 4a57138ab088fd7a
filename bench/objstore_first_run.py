#!/usr/bin/env python3
"""brand's first run on a machine against later ones, over objstore.py's shaped link (issue 33).

    cargo build --release --locked -p brand-cli -p brand-s3-server -p brand-delay-relay
    sudo python3 bench/objstore_first_run.py --work /var/tmp/brand-bench/first-run --rounds 5 \\
        [--baseline-brand OTHER/brand]

A first run finds nothing in the machine's cache (`~/.cache/brand`: the index and the `read_gap =
auto` probe's result), so it fetches the index and probes the store before its plan starts; later
runs find both. objstore.py measures the later kind (it probes once before its rounds); this one
measures both, interleaved: `first` (a cache directory emptied before the run), `later` (one kept
from a run made before the rounds) and, with --baseline-brand, `first` of another build. Each run is
`brand read s3://brand/ds --memory 10% --epochs 1 --json` in the client namespace (objstore.Net:
the S3 server and the delay relay behind a `tbf`-shaped veth pair; --rate, --delay-ms); --memory sets
its budget, and --group-mib runs it in a v1 memory group of that size (its peak RSS and OOM kills
reported: a group ten times smaller than the dataset, say). Other modes
run the same in the multi-node mode (`--mode serve`: --nodes `brand serve` processes of one job,
10 % per rank, talking over the client namespace's loopback; a job's figure is its slowest node's)
or through a cache (`--mode cache`: `brand cache` at 10 % and a job attached to it, started
together; from the cache's start).

Reported per kind, median (min-max) over the rounds: time to first batch from process start (an
upper bound: wall - epoch + first batch wait, as objstore.py's), time before the epoch starts
(wall - epoch: process start, open, probe), the epoch's seconds, GETs and MB counted at the server,
and the read gap chosen. The dataset (`brand gen`, 110 KiB mean, packed to the server through the S3
API) is made once under --work and reused.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import objstore  # noqa: E402
from brandbench.cgroups import Groups, RssSampler, block_device, detect  # noqa: E402


def prepare(a) -> Path:
    """The server's directory, holding the dataset at s3://brand/ds (made once)."""
    srv, stamp = a.work / "srv", a.work / "dataset.json"
    if stamp.exists():
        return srv
    shutil.rmtree(srv, ignore_errors=True)
    (srv / "brand").mkdir(parents=True)  # a directory is a bucket to the server
    files = a.work / "files"
    objstore.sh(a.brand, "gen", files, "--samples", a.samples, "--seed", 5, "--force")
    server = objstore.LocalServer(a, srv)
    try:
        env = {**os.environ, **objstore.env_s3(server.endpoint), "XDG_CACHE_HOME": str(a.work / "pack-home")}
        subprocess.run([a.brand, "pack", str(files), "-o", "s3://brand/ds", "--seed", "5", "--staging",
                        str(a.work)], check=True, env=env, capture_output=True)
    finally:
        server.close()
    shutil.rmtree(files)
    stamp.write_text(json.dumps({"samples": a.samples}))
    return srv


def run(a, net: objstore.Net, binary: str, home: Path, groups: Groups | None) -> dict:
    env = {**os.environ, **objstore.env_s3(objstore.ENDPOINT), "XDG_CACHE_HOME": str(home)}
    net.admin("reset-stats", "POST")
    t0 = time.perf_counter()
    if a.mode == "read":
        outs = [read_alone(a, net, binary, env, groups)]
    elif a.mode == "serve":
        outs = serve_nodes(a, net, binary, env)
    else:
        outs = attach_to_cache(a, net, binary, env, home)
    wall = time.perf_counter() - t0
    stats = net.admin("stats")
    failed = [o for o in outs if "error" in o]
    if failed:
        return failed[0]
    # The slowest process's first batch: a job waits for its last rank.
    first = max(outs, key=lambda o: o["first_batch_from_start_s"])
    return {**first, "wall_s": wall, "gets": stats.get("get_requests"), "mb": (stats.get("get_bytes") or 0) / 1e6}


def timed(argv: list, env: dict, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    return p, time.perf_counter() - t0


def from_report(p: subprocess.CompletedProcess, wall: float) -> dict:
    """Time to first batch from process start (an upper bound: wall - epoch + first batch wait, as
    objstore.py's) and the rest of one process's `--json` report."""
    if p.returncode != 0:
        return {"error": p.stderr[-500:]}
    ep = objstore.parse_brand(p.stdout)
    secs, first = ep.get("seconds") or 0, ep.get("first_batch_wait_secs") or 0
    # A node that finishes first waits in close for its peers (`brand serve`'s close_secs).
    wall -= ep.get("close_secs") or 0
    return {"first_batch_from_start_s": wall - secs + first, "before_epoch_s": wall - secs, "epoch_s": secs,
            "read_gap": ep.get("metrics", {}).get("read_gap"), "useful_mb_per_sec": ep.get("useful_mb_per_sec")}


def read_alone(a, net: objstore.Net, binary: str, env: dict, groups: Groups | None) -> dict:
    argv = net.exec_c([binary, "read", "s3://brand/ds", "--memory", a.memory, "--epochs", "1", "--json"])
    if groups is None:
        return from_report(*timed(argv, env, a.timeout))
    g = groups.run_group("net", a.group_mib << 20)
    try:
        sampler = RssSampler(g).start()
        p, wall = timed(g.wrap(argv), env, a.timeout)
        peak, kills = sampler.stop(), g.oom_kills()
        out = from_report(p, wall)
        if kills:
            out["error"] = f"OOM kills {kills} in a {a.group_mib} MiB group: " + out.get("error", "")
        return {**out, "peak_rss_mib": peak / (1 << 20)}
    finally:
        groups.release(g)


def serve_nodes(a, net: objstore.Net, binary: str, env: dict) -> list[dict]:
    """--nodes processes of one multi-node job (`brand serve`, 10 % per rank) started together in the
    client namespace, talking over its loopback."""
    nodes = ",".join(f"127.0.0.1:{7301 + r}" for r in range(a.nodes))
    with concurrent.futures.ThreadPoolExecutor(a.nodes) as pool:
        jobs = [pool.submit(timed, net.exec_c([binary, "serve", "s3://brand/ds", "--nodes", nodes, "--rank", r,
                                               "--memory", "10%", "--epochs", "1", "--json"]), env, a.timeout)
                for r in range(a.nodes)]
        return [from_report(*j.result()) for j in jobs]


def attach_to_cache(a, net: objstore.Net, binary: str, env: dict, home: Path) -> list[dict]:
    """`brand cache` (10 %) started, and a job attached to it (`brand read --cache`) at once: the job's
    first batch waits for the cache's first fill."""
    home.mkdir(parents=True, exist_ok=True)
    sock, err = home / "cache.sock", home / "cache.stderr"
    t0 = time.perf_counter()
    with open(err, "w") as err_file:
        cache = subprocess.Popen(net.exec_c([binary, "cache", "s3://brand/ds", "--memory", "10%", "--socket", sock]),
                                 stdout=subprocess.DEVNULL, stderr=err_file, env=env)
    try:
        while not sock.exists():
            if cache.poll() is not None or time.perf_counter() - t0 > a.timeout:
                return [{"error": f"brand cache did not start: {err.read_text()[-500:]}"}]
            time.sleep(0.005)
        p, _ = timed(net.exec_c([binary, "read", "s3://brand/ds", "--cache", sock, "--epochs", "1", "--json"]), env,
                     a.timeout)
        return [from_report(p, time.perf_counter() - t0)]
    finally:
        cache.terminate()
        cache.wait(30)


def main() -> int:
    target = Path(os.environ.get("CARGO_TARGET_DIR", HERE.parent / "target")) / "release"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/brand-bench/first-run"))
    ap.add_argument("--samples", type=int, default=12000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay-ms", type=float, default=10)
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--brand", default=str(target / "brand"))
    ap.add_argument("--mode", choices=("read", "serve", "cache"), default="read",
                    help="read: `brand read` alone; serve: a multi-node job of --nodes `brand serve`s; cache: "
                         "`brand cache` and a job attached to it, started together")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--memory", default="10%", help="--mode read: brand's memory budget")
    ap.add_argument("--group-mib", type=int, help="--mode read: run brand in a memory group of this many MiB")
    ap.add_argument("--baseline-brand", help="another build's brand: its first runs too")
    ap.add_argument("--server-bin", default=str(target / "brand-s3-server"))
    ap.add_argument("--relay-bin", default=str(target / "delay-relay"))
    a = ap.parse_args()

    def on_signal(*_):
        raise KeyboardInterrupt  # the namespaces, servers and groups are removed on the way out

    signal.signal(signal.SIGTERM, on_signal)
    kinds = {"first": a.brand, "later": a.brand}
    if a.baseline_brand:
        kinds["first (baseline)"] = a.baseline_brand
    if a.group_mib and a.mode != "read":
        ap.error("--group-mib is for --mode read")
    net = objstore.Net(a, prepare(a))
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    groups = None
    try:
        if a.group_mib:
            groups = Groups(detect(), block_device(a.work))
            groups.profile("net", None, None)
        net.up()
        later = a.work / "home-later"
        shutil.rmtree(later, ignore_errors=True)
        run(a, net, a.brand, later, groups)  # fills the cache the `later` runs find
        for rnd in range(a.rounds):
            order = list(kinds)[rnd % len(kinds):] + list(kinds)[:rnd % len(kinds)]
            for kind in order:
                home = later if kind == "later" else a.work / "home-first"
                if kind != "later":
                    shutil.rmtree(home, ignore_errors=True)
                r = run(a, net, kinds[kind], home, groups)
                runs[kind].append(r)
                print(json.dumps({"round": rnd, "kind": kind, **r}), file=sys.stderr)
    finally:
        net.down()
        if groups is not None:
            groups.close()
    out = {"rate": a.rate, "rtt_ms": 2 * a.delay_ms, "samples": a.samples, "memory": a.memory,
           "group_mib": a.group_mib, "runs": runs,
           "summary": {k: {f: objstore.summary([r.get(f) for r in v])
                           for f in ("first_batch_from_start_s", "before_epoch_s", "epoch_s", "gets", "mb",
                                     "read_gap", "useful_mb_per_sec", "peak_rss_mib")}
                       for k, v in runs.items()}}
    (a.work / "results.json").write_text(json.dumps(out, indent=1))
    group = f", in a {a.group_mib} MiB memory group" if a.group_mib else ""
    print(f"{a.samples} samples, {a.rate}, {2 * a.delay_ms:g} ms round trip, memory {a.memory}{group}, {a.rounds} "
          "rounds: median (min-max)")
    print("| run | first batch from start s | before the epoch s | epoch s | GETs (server) | MB (server) | gap KiB "
          "| useful MB/s | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, s in out["summary"].items():
        def cell(f, scale=1.0, digits=2):
            v = s[f]
            if v is None:
                return "–"
            return f"{v['median'] / scale:.{digits}f} ({v['min'] / scale:.{digits}f}–{v['max'] / scale:.{digits}f})"
        print(f"| {kind} | {cell('first_batch_from_start_s')} | {cell('before_epoch_s')} | {cell('epoch_s')} | "
              f"{cell('gets', digits=0)} | {cell('mb', digits=0)} | {cell('read_gap', 1024, 0)} | "
              f"{cell('useful_mb_per_sec', digits=1)} | {cell('peak_rss_mib', digits=0)} |")
    failed = sum("error" in r for v in runs.values() for r in v)
    if failed:
        print(f"{failed} runs failed (results.json)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
