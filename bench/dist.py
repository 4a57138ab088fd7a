#!/usr/bin/env python3
"""Multi-node brand against the same ranks without sharing, on throttled storage.

Issue 12's benchmark, on one machine. Each "node" is a process in its own
cgroup v1 blkio group, throttled like network storage (default 0.38 GB/s and
3000 read IOPS per node; flags to change). Configurations, interleaved in
every round:

  dist-partitioned  3 `brand serve` nodes on 127.0.0.1, each reading its own
                    partition (`brand pack --partitions 3`) and pushing
                    samples to the ranks that serve them
  dist-shared       the same with every node opening the one shared dataset
  independent       3 `brand read --rank r --world 3` processes: the same 3
                    ranks and orders, each reading everything it serves itself
  single            1 `brand read` (world 1): one node serving the epoch alone

Reported per node and in total: samples/s, bytes read (brand's count, and the
blkio group's where the device is throttled), stall P50/P99 and on-demand
waits; median and min/max over the rounds, as a Markdown table and JSON.
The dataset's page cache is dropped (posix_fadvise DONTNEED) before each run.

With --network, instead: the shaped-network table. Each node is a `brand serve` in a network
namespace of its own (scripts/netns.py, root), its link shaped by `tc tbf` (bandwidth), with
random packet loss in the kernel, and every node-to-node connection passing a TCP relay that
delays it (latency: this kernel has no netem). Per shaping profile and consumer (one taking
batches as they come, and ones computing 5 and 20 ms per batch, as a training step), interleaved
over the rounds: samples/s per node, bytes over the network per epoch (brand's pushed bytes, and
the links' bytes on the wire from tc), and on-demand waits: all, and those after each epoch's
first batch (once the pipeline is warm; the paper's claim is none with a computing consumer).
The nodes share one dataset (on tmpfs, so storage is never the limit).

    sudo python3 bench/dist.py --work /var/tmp/brand-nodes --samples 14000 --rounds 5

makes (once) `WORK/whole` and `WORK/parts/part-{0,1,2}` from generated
samples (the sources are deleted once packed), then measures. On tmpfs
(`/dev/shm`) there is no block device to throttle: the runs are unthrottled
(a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brandbench.cgroups import block_device, evict, parse_blkio_bytes  # noqa: E402

NODES = 3
CONFIGS = ("dist-partitioned", "dist-shared", "independent", "single")
BLKIO = Path("/sys/fs/cgroup/blkio")


# ---------------------------------------------------------------- results (pure)


@dataclass
class NodeRun:
    """What one node process reported for its epochs."""

    node: int
    samples: int
    seconds: float
    bytes_read: int
    stalls: int
    stall_p50_secs: float
    stall_p99_secs: float
    device_read_bytes: int | None = None
    # --network: waits after each epoch's first batch; those after epoch 0's first batch (the
    # pipeline filling as the nodes start); all those of the later epochs (their first batches
    # too: the next epoch is pushed while the current one finishes); bytes pushed to and
    # received from peers.
    stalls_warm: int = 0
    stalls_epoch0_warm: int = 0
    stalls_later: int = 0
    bytes_pushed: int = 0
    bytes_received: int = 0

    @property
    def samples_per_sec(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Run:
    config: str
    round: int
    nodes: list[NodeRun] = field(default_factory=list)
    wall_secs: float = 0.0
    error: str | None = None

    def total(self) -> dict:
        """The configuration as a whole: every sample served, over the slowest node's time."""
        samples = sum(n.samples for n in self.nodes)
        secs = max((n.seconds for n in self.nodes), default=0.0)
        dev = [n.device_read_bytes for n in self.nodes]
        return {
            "samples_per_sec": samples / secs if secs > 0 else 0.0,
            "bytes_read": sum(n.bytes_read for n in self.nodes),
            "device_read_bytes": None if any(d is None for d in dev) else sum(dev),
            "stalls": sum(n.stalls for n in self.nodes),
            "stall_p50_secs": max((n.stall_p50_secs for n in self.nodes), default=0.0),
            "stall_p99_secs": max((n.stall_p99_secs for n in self.nodes), default=0.0),
        }


def collect(procs, run, start, timeout):
    """Every node's stdout, each waited for until `timeout` s after `start` (then killed); the first
    failure (a timeout or a non-zero exit with its stderr's tail) goes into `run.error`."""
    outs = {}
    for n, p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            run.error = f"node {n} timed out after {timeout}s"
        if p.returncode != 0 and run.error is None:
            run.error = f"node {n} exited {p.returncode}: {err.strip()[-500:]}"
        outs[n] = out
    return outs


def parse_serve(node: int, text: str) -> NodeRun:
    """`brand serve --json`: {"epochs": [...], "closed": metrics}."""
    r = json.loads(text)
    run = node_run(node, r["epochs"], r["closed"])
    run.stalls_warm = sum(e.get("stalls_warm", 0) for e in r["epochs"])
    run.stalls_epoch0_warm = sum(e.get("stalls_warm", 0) for e in r["epochs"] if e["epoch"] == 0)
    run.stalls_later = sum(e.get("stalls", 0) for e in r["epochs"] if e["epoch"] > 0)
    run.bytes_pushed = r["closed"].get("bytes_pushed", 0)
    run.bytes_received = r["closed"].get("bytes_received", 0)
    return run


def parse_read(node: int, text: str) -> NodeRun:
    """`brand read --json`: a list of epoch reports (metrics cumulative)."""
    epochs = json.loads(text)
    return node_run(node, epochs, epochs[-1]["metrics"])


def node_run(node: int, epochs: list[dict], m: dict) -> NodeRun:
    """A node's run from its epoch reports and its final metrics `m`."""
    return NodeRun(
        node=node,
        samples=sum(e["samples"] for e in epochs),
        seconds=sum(e["seconds"] for e in epochs),
        bytes_read=m["bytes_read"],
        stalls=m["stalls"],
        stall_p50_secs=m.get("stall_p50_secs", 0.0),
        stall_p99_secs=m.get("stall_p99_secs", 0.0),
    )


def spread(xs: list[float]) -> dict | None:
    """Median, min and max (None without values)."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


METRICS = ("samples_per_sec", "bytes_read", "device_read_bytes", "stall_p50_secs", "stall_p99_secs", "stalls")


def summarise(runs: list[Run]) -> dict:
    """{config: {"node 0": {metric: spread}, ..., "total": {...}}} over the good runs."""
    out: dict = {}
    for config in dict.fromkeys(r.config for r in runs):
        good = [r for r in runs if r.config == config and r.error is None]
        rows: dict = {}
        for n in sorted({n.node for r in good for n in r.nodes}):
            per = [next(x for x in r.nodes if x.node == n) for r in good if any(x.node == n for x in r.nodes)]
            rows[f"node {n}"] = {
                "samples_per_sec": spread([x.samples_per_sec for x in per]),
                "bytes_read": spread([x.bytes_read for x in per]),
                "device_read_bytes": spread([x.device_read_bytes for x in per]),
                "stall_p50_secs": spread([x.stall_p50_secs for x in per]),
                "stall_p99_secs": spread([x.stall_p99_secs for x in per]),
                "stalls": spread([x.stalls for x in per]),
            }
        totals = [r.total() for r in good]
        rows["total"] = {k: spread([t[k] for t in totals]) for k in METRICS}
        out[config] = {"rows": rows, "runs": len(good), "failed": sum(1 for r in runs if r.config == config) - len(good)}
    return out


def _fmt(s: dict | None, scale: float, digits: int) -> str:
    if s is None:
        return "–"
    f = f"{{:.{digits}f}}"
    med, lo, hi = (f.format(s[k] * scale) for k in ("median", "min", "max"))
    return med if lo == hi else f"{med} ({lo}–{hi})"


def markdown(summary: dict, header: str = "") -> str:
    """One row per configuration and node: median (min–max) over the rounds."""
    lines = [header] if header else []
    lines += [
        "| configuration | node | samples/s | MB read (brand) | MB read (device) | stall P50 ms | stall P99 ms | on-demand waits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for config, s in summary.items():
        for row, m in s["rows"].items():
            lines.append(
                f"| {config} | {row} | {_fmt(m['samples_per_sec'], 1, 0)} | {_fmt(m['bytes_read'], 1e-6, 1)} "
                f"| {_fmt(m['device_read_bytes'], 1e-6, 1)} | {_fmt(m['stall_p50_secs'], 1e3, 2)} "
                f"| {_fmt(m['stall_p99_secs'], 1e3, 2)} | {_fmt(m['stalls'], 1, 0)} |"
            )
        if s["failed"]:
            lines.append(f"| {config} | ({s['failed']} failed run(s) left out) | | | | | | |")
    return "\n".join(lines) + "\n"


def ratios(summary: dict) -> dict:
    """Same-run ratios of total samples/s and bytes read against `independent`."""
    base = summary.get("independent", {}).get("rows", {}).get("total")
    out = {}
    if not base or not base["samples_per_sec"]:
        return out
    for config, s in summary.items():
        t = s["rows"]["total"]
        if t["samples_per_sec"] and base["samples_per_sec"]["median"] > 0:
            out[config] = {
                "samples_per_sec_vs_independent": t["samples_per_sec"]["median"] / base["samples_per_sec"]["median"],
                "bytes_read_vs_independent": (t["bytes_read"]["median"] / base["bytes_read"]["median"])
                if base["bytes_read"] and base["bytes_read"]["median"]
                else None,
            }
    return out


# ---------------------------------------------------------------- the shaped network (pure)


@dataclass
class Profile:
    """A shaping of every node's link: tbf rate, round-trip time the relay adds, packet loss."""

    name: str
    rate: str
    rtt_ms: float
    loss_percent: float


def parse_profile(text: str) -> Profile:
    """`RATE/RTT_MS/LOSS%`, e.g. `1gbit/2/0.1` (name: the text)."""
    try:
        rate, rtt, loss = text.split("/")
        return Profile(text, rate, float(rtt), float(loss.rstrip("%")))
    except ValueError:
        raise ValueError(f"profile {text!r}: expected RATE/RTT_MS/LOSS_PERCENT, e.g. 1gbit/2/0.1") from None


PROFILES = "10gbit/0.2/0,10gbit/2/0.1,1gbit/0.2/0,1gbit/2/0.1"
COMPUTE_MS = "0,5,20"


@dataclass
class NetRun:
    """One run of the nodes on a shaped network."""

    profile: str
    compute_ms: float
    round: int
    build: str = "brand"
    nodes: list[NodeRun] = field(default_factory=list)
    # Bytes every node's link carried upwards (tc's count: headers, gRPC framing, retransmissions).
    wire_bytes: int | None = None
    dropped_packets: int | None = None
    epochs: int = 1
    error: str | None = None


def link_totals(before: dict, after: dict) -> tuple[int, int]:
    """Bytes sent upwards and packets dropped (both directions) over every link, between two
    `netns.py stats` readings."""
    sent = sum(after[n]["up"]["bytes"] - before[n]["up"]["bytes"] for n in after)
    dropped = sum(after[n][d]["dropped"] - before[n][d]["dropped"] for n in after for d in ("up", "down"))
    return sent, dropped


def net_summary(runs: list[NetRun]) -> list[dict]:
    """One row per (profile, consumer, build, node) and a total per (profile, consumer, build):
    median (min–max) over the good runs."""
    rows = []
    keys = sorted(
        dict.fromkeys((r.profile, r.compute_ms, r.build) for r in runs),
        key=lambda k: ([r.profile for r in runs].index(k[0]), k[1], [r.build for r in runs].index(k[2])),
    )
    for profile, compute, build in keys:
        same = [r for r in runs if (r.profile, r.compute_ms, r.build) == (profile, compute, build)]
        good = [r for r in same if r.error is None]
        base = {
            "profile": profile,
            "compute_ms": compute,
            "build": build,
            "runs": len(good),
            "failed": len(same) - len(good),
        }
        for n in sorted({x.node for r in good for x in r.nodes}):
            per = [x for r in good for x in r.nodes if x.node == n]
            rows.append(
                {
                    **base,
                    "node": f"node {n}",
                    "samples_per_sec": spread([x.samples_per_sec for x in per]),
                    "net_bytes_per_epoch": spread(
                        [x.bytes_received / r.epochs for r in good for x in r.nodes if x.node == n]
                    ),
                    "wire_bytes_per_epoch": None,
                    "stalls": spread([x.stalls for x in per]),
                    "stalls_warm": spread([x.stalls_warm for x in per]),
                    "stalls_epoch0_warm": spread([x.stalls_epoch0_warm for x in per]),
                    "stalls_later_per_epoch": spread(
                        [x.stalls_later / (r.epochs - 1) for r in good for x in r.nodes if x.node == n and r.epochs > 1]
                    ),
                    "stall_p99_secs": spread([x.stall_p99_secs for x in per]),
                }
            )
        rows.append(
            {
                **base,
                "node": "total",
                "samples_per_sec": spread([sum(x.samples for x in r.nodes) / max(x.seconds for x in r.nodes) for r in good]),
                "net_bytes_per_epoch": spread([sum(x.bytes_pushed for x in r.nodes) / r.epochs for r in good]),
                "wire_bytes_per_epoch": spread(
                    [r.wire_bytes / r.epochs for r in good if r.wire_bytes is not None]
                ),
                "stalls": spread([sum(x.stalls for x in r.nodes) for r in good]),
                "stalls_warm": spread([sum(x.stalls_warm for x in r.nodes) for r in good]),
                "stalls_epoch0_warm": spread([sum(x.stalls_epoch0_warm for x in r.nodes) for r in good]),
                "stalls_later_per_epoch": spread(
                    [sum(x.stalls_later for x in r.nodes) / (r.epochs - 1) for r in good if r.epochs > 1]
                ),
                "stall_p99_secs": spread([max(x.stall_p99_secs for x in r.nodes) for r in good]),
            }
        )
    return rows


def net_markdown(rows: list[dict], header: str = "") -> str:
    lines = [header] if header else []
    lines += [
        "| profile (rate/RTT ms/loss %) | consumer | build | node | samples/s | MB pushed per epoch | MB on the wire per epoch "
        "| on-demand waits | waits once warm | epoch 0 after its 1st batch | epochs ≥ 1, per epoch (all) | stall P99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        consumer = "instant" if not r["compute_ms"] else f"{r['compute_ms']:g} ms/batch"
        net = r["net_bytes_per_epoch"]
        lines.append(
            f"| {r['profile']} | {consumer} | {r['build']} | {r['node']} | {_fmt(r['samples_per_sec'], 1, 0)} "
            f"| {_fmt(net, 1e-6, 1) if r['node'] == 'total' else _fmt(net, 1e-6, 1) + ' in'} "
            f"| {_fmt(r['wire_bytes_per_epoch'], 1e-6, 1)} | {_fmt(r['stalls'], 1, 0)} "
            f"| {_fmt(r['stalls_warm'], 1, 0)} | {_fmt(r['stalls_epoch0_warm'], 1, 0)} "
            f"| {_fmt(r['stalls_later_per_epoch'], 1, 1)} | {_fmt(r['stall_p99_secs'], 1e3, 2)} |"
        )
        if r["node"] == "total" and r["failed"]:
            lines.append(
                f"| {r['profile']} | {consumer} | {r['build']} | ({r['failed']} failed run(s) left out) | | | | | | | | |"
            )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- throttling


class Throttle:
    """One blkio group per node, throttled as network storage; nothing when
    the dataset is not on a block device (tmpfs) or blkio is unavailable."""

    def __init__(self, dataset: Path, iops: int, bps: int):
        self.groups: list[Path] = []
        self.dev: str | None = None
        self.why = ""
        dev = block_device(dataset)
        if dev.startswith("0:"):
            self.why = f"{dataset} is not on a block device (tmpfs?): not throttled"
            return
        if os.geteuid() != 0 or not (BLKIO / "blkio.throttle.read_bps_device").exists():
            self.why = "needs root and cgroup v1 blkio: not throttled"
            return
        self.dev = dev
        for n in range(NODES):
            g = BLKIO / f"brand-nodes-{os.getpid()}-node{n}"
            g.mkdir(exist_ok=True)
            self.groups.append(g)
            (g / "blkio.throttle.read_iops_device").write_text(f"{dev} {iops}")
            (g / "blkio.throttle.read_bps_device").write_text(f"{dev} {bps}")

    def wrap(self, node: int, argv: list[str]) -> list[str]:
        if not self.groups:
            return argv
        procs = self.groups[node] / "cgroup.procs"
        return ["/bin/sh", "-c", f"echo $$ > '{procs}'; exec \"$@\"", "sh", *argv]

    def read_bytes(self, node: int) -> int | None:
        if not self.groups:
            return None
        try:
            return parse_blkio_bytes((self.groups[node] / "blkio.throttle.io_service_bytes").read_text(), self.dev)
        except OSError:
            return None

    def close(self) -> None:
        for g in self.groups:
            for f in ("blkio.throttle.read_iops_device", "blkio.throttle.read_bps_device"):
                try:
                    (g / f).write_text(f"{self.dev} 0")
                except OSError:
                    pass
            for _ in range(50):
                try:
                    g.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        self.groups = []


# ---------------------------------------------------------------- running


def free_ports(n: int) -> list[str]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    finally:
        for s in socks:
            s.close()


def dataset_files(work: Path) -> list[Path]:
    return [p for p in work.rglob("*.brd")] + [p for p in work.rglob("index.bin")]


def run_config(args, config: str, rnd: int, throttle: Throttle) -> Run:
    work = args.work
    common = ["--memory", args.memory, "--seed", str(args.seed), "--epochs", str(args.epochs), "--json"]
    if args.batch:
        common += ["--batch", str(args.batch)]
    if args.read_gap:
        common += ["--read-gap", args.read_gap]
    cmds: list[tuple[int, list[str]]] = []
    if config.startswith("dist-"):
        nodes = ",".join(free_ports(NODES))
        for n in range(NODES):
            ds = work / "parts" / f"part-{n}" if config == "dist-partitioned" else work / "whole"
            argv = [args.brand, "serve", str(ds), "--nodes", nodes, "--rank", str(n), *common]
            argv += ["--remote-memory", args.remote_memory, "--peer-timeout", args.peer_timeout]
            cmds.append((n, argv))
    elif config == "independent":
        for n in range(NODES):
            argv = [args.brand, "read", str(work / "whole"), "--rank", str(n), "--world", str(NODES), *common]
            cmds.append((n, argv))
    else:
        cmds.append((0, [args.brand, "read", str(work / "whole"), *common]))
    evict(dataset_files(work))
    before = {n: throttle.read_bytes(n) for n, _ in cmds}
    run = Run(config, rnd)
    start = time.monotonic()
    procs = [
        (n, subprocess.Popen(throttle.wrap(n, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for n, argv in cmds
    ]
    outs = collect(procs, run, start, args.timeout)
    run.wall_secs = time.monotonic() - start
    if run.error is None:
        parse = parse_serve if config.startswith("dist-") else parse_read
        for n, _ in cmds:
            r = parse(n, outs[n])
            after = throttle.read_bytes(n)
            r.device_read_bytes = None if after is None or before[n] is None else after - before[n]
            run.nodes.append(r)
    return run


NETNS = Path(__file__).resolve().parent.parent / "scripts" / "netns.py"


class ShapedNetwork:
    """scripts/netns.py's network for one profile: up until `close` (or this process dies:
    netns.py tears it down when its stdin closes)."""

    def __init__(self, profile: Profile, port: int, relay_bin: str | None):
        relay = ["--relay-bin", relay_bin] if relay_bin else []
        self.proc = subprocess.Popen(
            [sys.executable, str(NETNS), "up", "--nodes", str(NODES), "--rate", profile.rate]
            + ["--delay-ms", str(profile.rtt_ms / 2), "--loss", str(profile.loss_percent), "--port", str(port)]
            + relay,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise RuntimeError(f"netns.py up failed ({self.proc.returncode})")
        info = json.loads(line)
        self.prefix, self.nodes, self.namespaces = info["prefix"], info["nodes"], info["node_namespaces"]

    def stats(self) -> dict:
        out = subprocess.run([sys.executable, str(NETNS), "stats", self.prefix], capture_output=True, text=True)
        return json.loads(out.stdout)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait()


def run_net(args, net: ShapedNetwork, profile: Profile, compute_ms: float, rnd: int, build: str, brand: str) -> NetRun:
    """The 3 nodes, each `brand serve` (binary `brand`) in its namespace, over the one dataset."""
    run = NetRun(profile.name, compute_ms, rnd, build=build, epochs=args.epochs)
    common = ["--memory", args.memory, "--seed", str(args.seed), "--epochs", str(args.epochs), "--json"]
    common += ["--batch", str(args.batch), "--compute-ms", str(compute_ms)]
    common += ["--remote-memory", args.remote_memory, "--peer-timeout", args.peer_timeout]
    if args.read_gap:
        common += ["--read-gap", args.read_gap]
    before = net.stats()
    start = time.monotonic()
    procs = []
    for n in range(NODES):
        argv = ["ip", "netns", "exec", net.namespaces[n], brand, "serve", str(args.work / "whole")]
        argv += ["--nodes", ",".join(net.nodes), "--rank", str(n), *common]
        procs.append((n, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    outs = collect(procs, run, start, args.timeout)
    if run.error is None:
        run.nodes = [parse_serve(n, outs[n]) for n in range(NODES)]
        run.wire_bytes, run.dropped_packets = link_totals(before, net.stats())
    return run


def parse_builds(text: str) -> list[tuple[str, str]]:
    """`NAME=PATH,...`: brand binaries compared side by side in every round."""
    out = []
    for item in text.split(","):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--builds {item!r}: expected NAME=PATH")
        out.append((name, path))
    return out


def main_network(args) -> int:
    if os.geteuid() != 0:
        print("--network needs root (network namespaces)", file=sys.stderr)
        return 2
    profiles = [parse_profile(p) for p in args.profiles.split(",") if p]
    computes = [float(c) for c in args.compute_ms.split(",") if c]
    builds = parse_builds(args.builds) if args.builds else [("brand", args.brand)]
    prepare(args, partitions=False)
    runs: list[NetRun] = []
    for rnd in range(args.rounds):
        # Interleaved, and rotated so no profile or consumer always goes first.
        for profile in profiles[rnd % len(profiles):] + profiles[: rnd % len(profiles)]:
            net = ShapedNetwork(profile, args.port, args.relay_bin)
            try:
                for compute in computes[rnd % len(computes):] + computes[: rnd % len(computes)]:
                    for build, brand in builds[rnd % len(builds):] + builds[: rnd % len(builds)]:
                        r = run_net(args, net, profile, compute, rnd, build, brand)
                        runs.append(r)
                        status = r.error or (
                            f"{sum(n.samples for n in r.nodes)} samples, {sum(n.stalls for n in r.nodes)} waits "
                            f"({sum(n.stalls_warm for n in r.nodes)} once warm), {r.dropped_packets} packets dropped"
                        )
                        print(f"round {rnd} {profile.name} compute {compute:g} ms {build}: {status}", file=sys.stderr)
            finally:
                net.close()
    rows = net_summary(runs)
    header = (
        f"{args.rounds} round(s) interleaved, {NODES} nodes in network namespaces, dataset {args.work / 'whole'} "
        f"(tmpfs), memory {args.memory} per rank, remote memory {args.remote_memory}, batch {args.batch}, "
        f"{args.epochs} epoch(s) per run. Rate: tc tbf on each link, each direction; RTT: the relay's delay "
        "(user space); loss: kernel (random drop per packet on each link egress). median (min–max)."
    )
    table = net_markdown(rows, header)
    print(table)
    out = args.out or args.work / "dist-network-results.json"
    out.write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "runs": [asdict(r) for r in runs], "table": table}, indent=2)
    )
    print(f"results: {out}", file=sys.stderr)
    return 0 if all(r.error is None for r in runs) else 1


def prepare(args, partitions: bool = True) -> None:
    """WORK/whole and (unless `partitions` is false) WORK/parts (3 partitions) from generated
    samples, once."""
    work = args.work
    if (work / ".done").exists():
        return
    work.mkdir(parents=True, exist_ok=True)
    src = work / "files"
    subprocess.run(
        [args.brand, "gen", str(src), "--samples", str(args.samples), "--seed", "3", "--force"]
        + ["--mean-kib", str(args.mean_kib), "--min-kib", str(max(1, args.mean_kib // 10)), "--max-kib", str(args.mean_kib * 3)],
        check=True,
    )
    subprocess.run([args.brand, "pack", str(src), "-o", str(work / "whole"), "--seed", "3", "--force"], check=True)
    if partitions:
        subprocess.run(
            [args.brand, "pack", str(src), "-o", str(work / "parts"), "--seed", "3", "--force"]
            + ["--partitions", str(NODES), "--memory", args.memory],
            check=True,
        )
    shutil.rmtree(src)
    os.sync()
    (work / ".done").write_text("")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = Path(__file__).resolve().parent.parent
    ap.add_argument("--work", type=Path, required=True, help="where the datasets are (made if missing)")
    ap.add_argument("--samples", type=int, default=14000, help="samples to generate")
    ap.add_argument("--mean-kib", type=int, default=110, help="their mean size (min a tenth, max 3x)")
    ap.add_argument("--brand", default=os.environ.get("BRAND_BIN", str(here / "target/release/brand")))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ",".join(CONFIGS))
    ap.add_argument("--iops", type=int, default=3000, help="read IOPS per node")
    ap.add_argument("--bps", type=float, default=0.38e9, help="read bytes/s per node")
    ap.add_argument("--memory", default="10%", help="memory budget per rank (also sizes the partitions)")
    ap.add_argument("--remote-memory", default="256MiB")
    ap.add_argument("--peer-timeout", default="60s")
    ap.add_argument("--read-gap", default="whole", help="whole, auto or bytes ('' for brand's default)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--epochs", type=int, help="epochs per run (default 1; --network: 2, so epoch boundaries count)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    ap.add_argument("--out", type=Path, help="JSON results (default WORK/dist-results.json)")
    ap.add_argument("--network", action="store_true", help="the shaped-network table instead (root)")
    ap.add_argument("--profiles", default=PROFILES, help="--network: RATE/RTT_MS/LOSS_PERCENT,...")
    ap.add_argument("--compute-ms", default=COMPUTE_MS, help="--network: consumers' ms per batch, 0: instant")
    ap.add_argument("--port", type=int, default=7070, help="--network: the nodes' port")
    ap.add_argument("--builds", default="", help="--network: NAME=PATH,... brand binaries compared in every round")
    ap.add_argument("--relay-bin", help="--network: tools/delay-relay's binary (default: netns.py builds it)")
    args = ap.parse_args(argv)
    if args.epochs is None:
        args.epochs = 2 if args.network else 1
    if args.network:
        return main_network(args)
    configs = [c for c in args.configs.split(",") if c]
    bad = [c for c in configs if c not in CONFIGS]
    if bad or args.rounds < 1:
        ap.error(f"unknown configuration(s) {bad}" if bad else "--rounds must be at least 1")
    prepare(args)
    throttle = Throttle(args.work / "whole", args.iops, int(args.bps))
    note = throttle.why or f"throttled per node: {args.iops} IOPS, {args.bps / 1e9:.2f} GB/s on {throttle.dev}"
    print(note, file=sys.stderr)
    runs: list[Run] = []
    try:
        for rnd in range(args.rounds):
            # Interleaved, and rotated so no configuration always goes first.
            order = configs[rnd % len(configs):] + configs[: rnd % len(configs)]
            for config in order:
                r = run_config(args, config, rnd, throttle)
                runs.append(r)
                status = r.error or f"{sum(n.samples for n in r.nodes)} samples in {r.wall_secs:.1f}s"
                print(f"round {rnd} {config}: {status}", file=sys.stderr)
    finally:
        throttle.close()
    summary = summarise(runs)
    header = (
        f"{args.rounds} round(s), {NODES} nodes, memory {args.memory}, read gap {args.read_gap or 'default'}; {note}. "
        "median (min–max)."
    )
    table = markdown(summary, header)
    print(table)
    out = args.out or args.work / "dist-results.json"
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "throttle": note,
        "summary": summary,
        "ratios": ratios(summary),
        "runs": [asdict(r) for r in runs],
        "table": table,
    }
    out.write_text(json.dumps(result, indent=2))
    print(f"results: {out}", file=sys.stderr)
    return 0 if all(r.error is None for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
