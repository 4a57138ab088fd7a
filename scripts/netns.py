#!/usr/bin/env python3
"""A shaped network of network namespaces for brand's nodes (root; Python stdlib and tools/delay-relay).

    sudo scripts/netns.py up --nodes 3 --rate 1gbit --delay-ms 1 --loss 0.1 --port 7070

makes, for W nodes and a name prefix P (brn<pid>, so concurrent users never clash):

  P-n<i>  node i: eth0 10.77.<i>.2/24, default route via its link; runs `brand serve` with
          `ip netns exec P-n<i>` listening on 10.77.<i>.2:PORT (the node list printed)
  P-l<i>  node i's link, a forwarding hop: towards the node 10.77.<i>.1, towards the relay
          10.78.<i>.1. Both its egresses are the link: `tc tbf` at RATE (each direction) and,
          with --loss, a random drop of that fraction of packets (see below)
  P-r     the relay: 10.78.<i>.2 towards each link. Every TCP connection between nodes ends
          here: policy routing delivers the nodes' addresses locally, a transparent listener
          (tools/delay-relay, IP_TRANSPARENT) accepts them and connects on to the address
          dialled, forwarding each direction's bytes DELAY_MS after they arrived. So a
          node-to-node path is: node, link (shaped, lossy), relay (delay), link (shaped, lossy), node.

Why a relay: this kernel has no netem (nor fq, gact or matchall: no delay qdisc, no drop action),
so latency comes from user space. It is a TCP relay, not a packet forwarder, so that moving bytes
costs a few system calls per MiB rather than per packet; it is in Rust (tools/delay-relay, built
with cargo on first use) because a Python one carried only ~100 MB/s. Its delay applies to data;
TCP's own ACKs between a node and the relay are not delayed, so what brand sees is an
application-level round trip of 2 x DELAY_MS per node-to-node exchange (a credit and the push it
allows), with queues bounded per direction (back-pressure as a TCP window would give).

Loss is the kernel's: a classic BPF classifier draws a random number per packet and sends that
fraction to an htb class whose queue holds nothing (`pfifo limit 0`), so the packet is dropped.
It runs on the link namespaces' egresses, where no sender is local (a drop at the sender's own
qdisc is a local congestion signal to TCP, not loss), and senders emit one MTU (9000, jumbo
frames) per packet (gso_max_segs 1), so a drop is one packet, not a 64 KiB GSO burst. TCP then
retransmits as on a real lossy link.

`up` prints one JSON line ({"prefix", "nodes", "node_namespaces", ...}) once the network is up,
then keeps it until its standard input closes or it gets SIGTERM/SIGINT/SIGHUP; then it kills
what still runs in its namespaces, stops the relay and deletes every namespace (their veths go
with them). A user that dies closes the pipe, so the network goes too. `throughput` makes the same network,
sends --bytes from every node to every other at once (the relay binary's sources and sinks: the
links and the relay, as brand's mesh uses them), prints the aggregate rate as JSON and removes it. `clean` deletes the
namespaces of any P whose process is gone (`up` does that first). `stats P` prints the links'
tc counters (bytes sent and packets dropped) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading

PREFIX_RE = re.compile(r"^brn(\d+)-")
MTU = 9000


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def ns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def delete_namespaces(names: list[str]) -> None:
    """Kills what runs in each namespace (processes this network's user started there), then
    deletes it."""
    for ns in names:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for ns in names:
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def clean() -> list[str]:
    """Deletes the namespaces of networks whose `up` process is gone."""
    stale = [ns for ns in ns_list() if (m := PREFIX_RE.match(ns)) and not alive(int(m.group(1)))]
    delete_namespaces(stale)
    return stale


# ---------------------------------------------------------------- shaping (pure: the tc commands)


def link_qdisc(ns: str, dev: str, rate: str | None, loss: float) -> list[list[str]]:
    """tc commands shaping `dev` of `ns` at `rate` (None: unshaped) and dropping `loss` (0..1)
    of its packets."""
    tc = ["ip", "netns", "exec", ns, "tc"]
    # tbf's bucket must hold what the rate sends between timer ticks; 1 ms of it, at least 256 KiB.
    tbf = []
    if rate:
        burst = max(256 << 10, rate_bps(rate) // 8 // 1000)
        tbf = ["tbf", "rate", rate, "burst", str(burst), "latency", "20ms"]
    if loss <= 0:
        return [[*tc, "qdisc", "replace", "dev", dev, "root", *tbf]] if tbf else []
    keep = int((1.0 - loss) * 2**32)
    # ld rand; jge keep ? drop : pass (ret -1: the filter's classid, the dropping class; ret 0: no match).
    bpf = f"4,32 0 0 {(-0x1000 + 56) & 0xFFFFFFFF},53 0 1 {keep},6 0 0 4294967295,6 0 0 0"
    cmds = [
        [*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1", "r2q", "100000"],
        [*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", "100gbit"],
        [*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:2", "htb", "rate", "100gbit"],
        [*tc, "qdisc", "add", "dev", dev, "parent", "1:2", "pfifo", "limit", "0"],
        [*tc, "filter", "add", "dev", dev, "parent", "1:", "bpf", "bytecode", bpf, "classid", "1:2"],
    ]
    if tbf:
        cmds.insert(3, [*tc, "qdisc", "add", "dev", dev, "parent", "1:1", *tbf])
    return cmds


def rate_bps(rate: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected e.g. 1gbit, 10gbit, 500mbit")
    return int(float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)])


def link_stats(ns: str, dev: str) -> dict:
    """Bytes and packets sent and packets dropped by the root qdisc of `dev` (and its classes)."""
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show", "dev", dev], capture_output=True, text=True
    ).stdout
    qdiscs = json.loads(out or "[]")
    root = next((q for q in qdiscs if q.get("root")), {})
    drops = sum(q.get("drops", 0) for q in qdiscs if q.get("kind") == "pfifo")
    return {"bytes": root.get("bytes", 0), "packets": root.get("packets", 0), "dropped": drops}


# ---------------------------------------------------------------- the network


class Network:
    def __init__(self, nodes: int, rate: str | None, loss: float, port: int, prefix: str):
        self.w, self.rate, self.loss, self.port, self.prefix = nodes, rate, loss, port, prefix
        self.node_ns = [f"{prefix}-n{i}" for i in range(nodes)]
        self.link_ns = [f"{prefix}-l{i}" for i in range(nodes)]
        self.relay_ns = f"{prefix}-r"
        self.made: list[str] = []

    def namespaces(self) -> list[str]:
        return [*self.node_ns, *self.link_ns, self.relay_ns]

    def addresses(self) -> list[str]:
        return [f"10.77.{i}.2:{self.port}" for i in range(self.w)]

    def up(self) -> None:
        for ns in self.namespaces():
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        r = self.relay_ns
        for i in range(self.w):
            n, link = self.node_ns[i], self.link_ns[i]
            # veth names are global until moved: unique per network, renamed inside.
            a, b, c, d = (f"{self.prefix}{x}{i}"[-15:] for x in "abcd")
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            sh("ip", "link", "add", c, "type", "veth", "peer", "name", d)
            for dev, ns, name in [(a, n, "eth0"), (b, link, "node"), (c, link, "relay"), (d, r, f"l{i}")]:
                sh("ip", "link", "set", dev, "netns", ns)
                sh("ip", "-n", ns, "link", "set", dev, "name", name)
                sh("ip", "-n", ns, "link", "set", name, "mtu", str(MTU))
                if self.loss > 0:
                    sh("ip", "-n", ns, "link", "set", name, "gso_max_segs", "1")
                sh("ip", "-n", ns, "link", "set", name, "up")
            sh("ip", "-n", n, "addr", "add", f"10.77.{i}.2/24", "dev", "eth0")
            sh("ip", "-n", n, "route", "add", "default", "via", f"10.77.{i}.1")
            sh("ip", "-n", link, "addr", "add", f"10.77.{i}.1/24", "dev", "node")
            sh("ip", "-n", link, "addr", "add", f"10.78.{i}.1/24", "dev", "relay")
            sh("ip", "-n", link, "route", "add", "default", "via", f"10.78.{i}.2")
            sh("ip", "netns", "exec", link, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            sh("ip", "-n", r, "addr", "add", f"10.78.{i}.2/24", "dev", f"l{i}")
            sh("ip", "-n", r, "route", "add", f"10.77.{i}.0/24", "via", f"10.78.{i}.1")
            # Whatever the nodes send to a node address ends at the relay.
            sh("ip", "-n", r, "rule", "add", "iif", f"l{i}", "lookup", "100")
            for dev in ("node", "relay"):
                for cmd in link_qdisc(link, dev, self.rate, self.loss):
                    sh(*cmd)
        sh("ip", "-n", r, "route", "add", "local", "10.77.0.0/16", "dev", "lo", "table", "100")

    def down(self) -> None:
        delete_namespaces(self.made)
        self.made = []


# ---------------------------------------------------------------- the relay (runs in P-r)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def relay_binary(given: str | None) -> str:
    """The delay relay (tools/delay-relay): `given`, else $BRAND_DELAY_RELAY, else built here
    (`cargo build --release -p brand-delay-relay`, a no-op once built) in $CARGO_TARGET_DIR or
    the repository's target/."""
    path = given or os.environ.get("BRAND_DELAY_RELAY")
    if path:
        return path
    cargo = os.environ.get("CARGO", "cargo")
    subprocess.run(
        [cargo, "build", "--release", "--quiet", "--locked", "-p", "brand-delay-relay"],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    return os.path.join(target, "release", "delay-relay")


# ---------------------------------------------------------------- commands


def cmd_up(a) -> int:
    if os.geteuid() != 0:
        print("netns.py up needs root (ip netns, tc)", file=sys.stderr)
        return 2
    if not 1 <= a.nodes <= 32:
        print("--nodes: 1..=32", file=sys.stderr)
        return 2
    if not 0 <= a.loss < 50:
        print("--loss: a percentage in [0, 50)", file=sys.stderr)
        return 2
    rate = None if a.rate in ("", "none") else a.rate
    if rate:
        rate_bps(rate)
    relay = relay_binary(a.relay_bin)
    clean()
    net = Network(a.nodes, rate, a.loss / 100, a.port, f"brn{os.getpid()}")
    stop = threading.Event()

    def on_signal(*_):
        stop.set()

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    relay_proc = None
    try:
        net.up()
        relay_proc = subprocess.Popen(
            ["ip", "netns", "exec", net.relay_ns, relay, "relay", "--listen", f"0.0.0.0:{a.port}", "--transparent"]
            + ["--delay-ms", str(a.delay_ms), "--limit", str(a.limit)],
            stdout=subprocess.PIPE,
            text=True,
        )
        if relay_proc.stdout.readline().strip() != "relay ready":
            raise RuntimeError("the relay did not start")
        info = {
            "prefix": net.prefix,
            "nodes": net.addresses(),
            "node_namespaces": net.node_ns,
            "namespaces": net.namespaces(),
            "rate": rate,
            "delay_ms": a.delay_ms,
            "loss_percent": a.loss,
        }
        if a.cmd == "throughput":
            print(json.dumps({**info, **transfer(net, relay, a.bytes)}), flush=True)
            return 0
        print(json.dumps(info), flush=True)

        # Until stdin closes (the user is gone) or a signal.
        stdin = sys.stdin.fileno()
        while not stop.is_set():
            if relay_proc.poll() is not None:
                raise RuntimeError(f"the relay exited ({relay_proc.returncode})")
            try:
                readable, _, _ = select.select([stdin], [], [], 0.2)
                if readable and not os.read(stdin, 4096):
                    break
            except InterruptedError:
                pass
        return 0
    except subprocess.CalledProcessError as e:
        print(f"netns.py: {' '.join(e.cmd)}: {e.stderr.decode(errors='replace').strip()}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        print(f"netns.py: {e}", file=sys.stderr)
        return 1
    finally:
        if relay_proc is not None and relay_proc.poll() is None:
            relay_proc.kill()
            relay_proc.wait()
        net.down()


def transfer(net: Network, relay: str, nbytes: str) -> dict:
    """`nbytes` sent from every node to every other at once (the mesh brand's nodes push over:
    both links of each pair and the relay's delay), with the relay binary's `source`s and
    `sink`s; each timed until its sink answered the end. The aggregate rate: all bytes over the
    slowest transfer's time."""
    if net.w < 2:
        raise RuntimeError("throughput needs --nodes 2 or more")
    sinks = [
        subprocess.Popen(
            ["ip", "netns", "exec", ns, relay, "sink", "--listen", to, "--connections", str(net.w - 1)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for ns, to in zip(net.node_ns, net.addresses())
    ]
    try:
        if any(s.stdout.readline().strip() != "sink ready" for s in sinks):
            raise RuntimeError("a sink did not start")
        sources = [
            subprocess.Popen(
                ["ip", "netns", "exec", net.node_ns[i], relay, "source", "--to", to, "--bytes", nbytes],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(net.w)
            for j, to in enumerate(net.addresses())
            if i != j
        ]
        results = []
        for s in sources:
            out, err = s.communicate(timeout=600)
            if s.returncode != 0:
                raise RuntimeError(f"source: {err.strip()}")
            results.append(json.loads(out))
        total = sum(r["bytes"] for r in results)
        secs = max(r["secs"] for r in results)
        return {"streams": len(results), "bytes": total, "secs": secs, "mb_per_s": round(total / secs / 1e6, 1)}
    finally:
        for s in sinks:
            if s.poll() is None:
                s.kill()
            s.wait()


def cmd_stats(a) -> int:
    names = ns_list()
    links = sorted((n for n in names if n.startswith(f"{a.prefix}-l")), key=lambda n: int(n.rsplit("l", 1)[1]))
    out = {}
    for ns in links:
        i = int(ns.rsplit("l", 1)[1])
        out[f"node {i}"] = {"down": link_stats(ns, "node"), "up": link_stats(ns, "relay")}
    print(json.dumps(out))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="make the network, print it as JSON, keep it until stdin closes or a signal")
    tp = sub.add_parser(
        "throughput", help="make the network, send --bytes between every pair of nodes at once, print the rate as JSON"
    )
    tp.add_argument("--bytes", default="1GiB", help="how much each node sends each peer (bytes, KiB, MiB, GiB)")
    for p in (up, tp):
        p.add_argument("--nodes", type=int, default=3)
        p.add_argument("--rate", default="1gbit", help="tbf rate of every link, each direction ('none': unshaped)")
        p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay the relay adds (RTT: twice this)")
        p.add_argument("--loss", type=float, default=0.0, help="percent of packets each link egress drops")
        p.add_argument("--port", type=int, default=7070)
        p.add_argument("--limit", type=int, default=8 << 20, help="bytes the relay holds per direction")
        p.add_argument("--relay-bin", help="tools/delay-relay's binary (default: $BRAND_DELAY_RELAY, else built)")
    sub.add_parser("clean", help="delete the namespaces of networks whose process is gone")
    st = sub.add_parser("stats", help="the links' tc counters of network PREFIX, as JSON")
    st.add_argument("prefix")
    a = ap.parse_args(argv)
    if a.cmd in ("up", "throughput"):
        return cmd_up(a)
    if a.cmd == "stats":
        return cmd_stats(a)
    print("\n".join(clean()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
