#!/usr/bin/env python3
"""brand against the object-storage loaders, over a shaped link to an S3 server (issue 33).

    V=$(scripts/objstore-venv.sh)
    sudo "$V/bin/python" bench/objstore.py --work /var/tmp/brand-bench/objstore --samples 8000 --rounds 5

The network (root; made here, deleted at the end, also on failure):

  <P>-s  the server namespace: tools/s3-server (`brand-s3-server`, s3s-fs) on its own
         127.0.0.1:9000, and tools/delay-relay listening on 10.79.0.1:9001, forwarding to it,
         holding each direction's bytes DELAY_MS (default 10: a 20 ms round trip)
  <P>-c  the client namespace, 10.79.0.2: every loader runs here (endpoint http://10.79.0.1:9001)

  joined by one veth pair whose two ends both egress through `tc tbf` at RATE (1gbit). Bandwidth is
  the kernel's tbf; latency is the relay's (this kernel has no netem). The server's files sit in the
  host's page cache (the server is outside the loaders' groups): the link, not a disk, is the limit.

The dataset (made once under WORK, reused; `brand gen`, 110 KiB mean) exists on the server in five
forms with the same ids (sample id = brand's pack position, so brand's chunks define order quality
for all): brand's pack (`brand pack -o s3://brand/ds`), one object per sample (s3map/samples/ID),
tar shards of ~64 MB (s3tar/shards/, webdataset keys = ids), MDS shards (mds/ds, MDSWriter, its
default 64 MB shards) and LitData chunks (litdata/ds, `litdata.optimize`, chunk_bytes 64MB).

Loaders, each in a memory cgroup (v1 `memory.limit_in_bytes`) of ALLOWANCE + 10 % of the dataset,
one cold epoch each, interleaved over --rounds (order rotates), caches emptied before each run:
  brand      `brand read s3://brand/ds --memory 10% --epochs 1 --json`, no local disk
  s3map      s3torchconnector S3MapDataset (one GET per sample), DataLoader shuffle, 8 workers
  s3iter     s3torchconnector S3IterableDataset over the tar shards (order shuffled), webdataset
             tarfile_to_samples + shuffle buffer of 10 % of the samples split over 8 workers
  mds        MosaicML Streaming StreamingDataset (shuffle, default py1e, predownload), local cache
  litdata    LitData StreamingDataset (shuffle) + StreamingDataLoader, local cache
Per run: samples/s, useful MB/s (sample bytes / epoch time), the server's GETs and bytes
(tools/s3-server's /_admin/stats), exactly-once and chunk-mate dispersion of the served ids
(brand's OrderMeter definition, brand's chunks), time to first batch, the group's peak RSS, the
peak local disk the loader's cache dir held. The link's own rate is measured every round (8 MiB
ranged GETs, 16 in flight, and one stream). Then `--sweep`: brand alone, --gets-in-flight × --get-size.

Output in WORK/out: results.json, objstore-results.md, objstore.png (copy to docs/bench/).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from brandbench.cgroups import Groups, RssSampler, block_device, detect  # noqa: E402

ROOT = HERE.parent
AK, SK, REGION = "brand-test-ak", "brand-test-sk", "us-east-1"
SERVER_PORT, RELAY_PORT = 9000, 9001
S_ADDR, C_ADDR = "10.79.0.1", "10.79.0.2"
ENDPOINT = f"http://{S_ADDR}:{RELAY_PORT}"
LOADERS = ("brand", "brand-auto", "s3map", "s3iter", "mds", "litdata")
BRAND_FLAGS = {"brand": ["--read-gap", "whole"], "brand-auto": []}  # brand-auto: the default read gap (auto)
SHARD_BYTES = 64 << 20
MIB = 1 << 20


def env_s3(endpoint: str) -> dict:
    return {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": AK, "AWS_SECRET_ACCESS_KEY": SK,
            "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION, "AWS_ALLOW_HTTP": "true"}


def sh(*argv, check=True):
    return subprocess.run([str(a) for a in argv], check=check, capture_output=True, text=True)


# ---------------------------------------------------------------- order quality (pure)


def order_quality(ids, n: int, chunk: int) -> dict:
    """exactly-once and brand's chunk-mate dispersion (crates/plan/src/order.rs) of served ids:
    over pairs of adjacent ids of one chunk (ids k*c .. k*c+c-1), both served, the mean distance
    of their serve positions over (n + 1) / 3. A repeated id keeps its first position."""
    pos = [-1] * n
    seen, dup, bad = 0, 0, 0
    for p, i in enumerate(ids):
        if not 0 <= i < n:
            bad += 1
        elif pos[i] < 0:
            pos[i] = p
            seen += 1
        else:
            dup += 1
    total, pairs = 0, 0
    for c0 in range(0, n, chunk):
        for i in range(c0, min(c0 + chunk, n) - 1):
            if pos[i] >= 0 and pos[i + 1] >= 0:
                total += abs(pos[i] - pos[i + 1])
                pairs += 1
    disp = total / pairs / ((n + 1) / 3) if pairs else None
    return {"exactly_once": seen == n and dup == 0 and bad == 0, "missing": n - seen, "duplicates": dup,
            "chunk_mate_dispersion": disp}


def summary(values) -> dict | None:
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


# ---------------------------------------------------------------- the server and the network


class Net:
    """Two namespaces joined by a tbf-shaped veth pair; the server and the relay in the server's."""

    def __init__(self, a, srv_dir: Path):
        self.p = f"bro{os.getpid()}"
        self.s, self.c = f"{self.p}-s", f"{self.p}-c"
        self.a, self.srv_dir = a, srv_dir
        self.procs: list[subprocess.Popen] = []

    def up(self):
        s, c = self.s, self.c
        sh("ip", "netns", "add", s)
        sh("ip", "netns", "add", c)
        sh("ip", "link", "add", f"{self.p}a", "type", "veth", "peer", "name", f"{self.p}b")
        sh("ip", "link", "set", f"{self.p}a", "netns", s)
        sh("ip", "link", "set", f"{self.p}b", "netns", c)
        burst = max(256 << 10, rate_bps(self.a.rate) // 8 // 1000)
        for ns, dev, addr in ((s, f"{self.p}a", S_ADDR), (c, f"{self.p}b", C_ADDR)):
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "link", "set", dev, "mtu", str(self.a.mtu))
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", self.a.rate,
               "burst", str(burst), "latency", "20ms")
        srv = subprocess.Popen(["ip", "netns", "exec", s, self.a.server_bin, "--dir", str(self.srv_dir), "--port",
                                str(SERVER_PORT), "--no-stdin"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
        self.procs.append(srv)
        line = srv.stdout.readline()
        if not line.startswith("endpoint"):
            raise RuntimeError(f"s3 server did not start: {line!r}")
        relay = subprocess.Popen(["ip", "netns", "exec", s, self.a.relay_bin, "relay", "--listen",
                                  f"{S_ADDR}:{RELAY_PORT}", "--to", f"127.0.0.1:{SERVER_PORT}", "--delay-ms",
                                  str(self.a.delay_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.procs.append(relay)
        if relay.stdout.readline().strip() != "relay ready":
            raise RuntimeError("the delay relay did not start")

    def admin(self, what: str, method: str = "GET") -> dict:
        out = sh("ip", "netns", "exec", self.s, "curl", "-s", "-X", method,
                 f"http://127.0.0.1:{SERVER_PORT}/_admin/{what}").stdout
        return json.loads(out) if out.strip().startswith("{") else {}

    def exec_c(self, argv: list) -> list[str]:
        return ["ip", "netns", "exec", self.c, *[str(x) for x in argv]]

    def down(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()
        for ns in (self.c, self.s):
            sh("ip", "netns", "del", ns, check=False)


def rate_bps(rate: str) -> int:
    units = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "bit": 1}
    for u, m in units.items():
        if rate.endswith(u):
            return int(float(rate[: -len(u)]) * m)
    return int(rate)


class LocalServer:
    """The server on the host's 127.0.0.1 (for uploads while preparing)."""

    def __init__(self, a, srv_dir: Path):
        self.proc = subprocess.Popen([a.server_bin, "--dir", str(srv_dir), "--port", "0"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("endpoint"):
            raise RuntimeError(f"s3 server did not start: {line!r}")
        self.endpoint = line.split()[1]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def s3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=AK, aws_secret_access_key=SK,
                        region_name=REGION, config=Config(s3={"addressing_style": "path"},
                                                          max_pool_connections=16))


def upload_dir(s3, local: Path, bucket: str, prefix: str) -> int:
    files = [p for p in sorted(local.rglob("*")) if p.is_file()]
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda p: s3.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(local)}"), files))
    return len(files)


# ---------------------------------------------------------------- preparing the five forms


def prepare(a) -> dict:
    work = a.work
    meta_file = work / "dataset.json"
    if meta_file.exists():
        return json.loads(meta_file.read_text())
    work.mkdir(parents=True, exist_ok=True)
    srv = work / "srv"
    shutil.rmtree(srv, ignore_errors=True)
    files, pack, samples = work / "files", work / "pack", work / "samples"
    t0 = time.time()
    print(f"preparing {a.samples} samples in {work}", file=sys.stderr)
    sh(a.brand, "gen", files, "--samples", a.samples, "--seed", 5, "--force")
    sh(a.brand, "pack", files, "-o", pack, "--seed", 5, "--force")
    server = LocalServer(a, srv)
    try:
        s3 = s3_client(server.endpoint)
        for b in ("brand", "s3map", "s3tar", "mds", "litdata"):
            s3.create_bucket(Bucket=b)
        # brand: its own uploader (packs again with the same seed: the same bytes and ids).
        subprocess.run([a.brand, "pack", files, "-o", "s3://brand/ds", "--seed", "5", "--staging", str(work)],
                       check=True, env=env_s3(server.endpoint), capture_output=True)
        shutil.rmtree(files)
        info = json.loads(sh(a.brand, "inspect", pack, "--json").stdout)
        n = int(find_key(info, "samples"))
        chunk = int(find_key(info, "chunk_size"))
        chunks = int(find_key(info, "chunks"))
        # Every sample by id (its pack position), from the local pack.
        samples.mkdir(exist_ok=True)

        def cat(i):
            data = subprocess.run([a.brand, "cat", str(pack), str(i)], check=True, capture_output=True).stdout
            (samples / f"{i:08d}").write_bytes(data)
            return len(data)

        with ThreadPoolExecutor(4) as ex:
            sizes = list(ex.map(cat, range(n)))
        shutil.rmtree(pack)
        print(f"  brand packed and uploaded, {n} samples exported ({time.time() - t0:.0f} s)", file=sys.stderr)
        # s3map: one object per sample.
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda i: s3.upload_file(str(samples / f"{i:08d}"), "s3map", f"samples/{i:08d}"), range(n)))
        # s3tar: tar shards of ~64 MB, samples in id order (the pack's shuffled order), webdataset keys.
        import tarfile
        shard, size, k = None, 0, 0
        tmp = work / "shard.tar"

        def close_shard():
            shard.close()
            s3.upload_file(str(tmp), "s3tar", f"shards/shard-{k:05d}.tar")
            tmp.unlink()

        for i in range(n):
            if shard is None:
                shard, size = tarfile.open(tmp, "w"), 0
            shard.add(samples / f"{i:08d}", arcname=f"{i:08d}.bin")
            size += sizes[i] + 512
            if size >= SHARD_BYTES:
                close_shard()
                shard, k = None, k + 1
        if shard is not None:
            close_shard()
        # MDS (MosaicML Streaming's writer, its default shard size).
        from streaming import MDSWriter
        mds_dir = work / "mds"
        with MDSWriter(out=str(mds_dir), columns={"id": "int64", "data": "bytes"}) as w:
            for i in range(n):
                w.write({"id": i, "data": (samples / f"{i:08d}").read_bytes()})
        upload_dir(s3, mds_dir, "mds", "ds")
        shutil.rmtree(mds_dir)
        print(f"  s3map, s3tar, mds uploaded ({time.time() - t0:.0f} s)", file=sys.stderr)
        # LitData (its optimize, 64 MB chunks).
        lit_dir = work / "litdata"
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "litdata-optimize", str(samples),
                        str(lit_dir), str(n)], check=True)
        upload_dir(s3, lit_dir, "litdata", "ds")
        shutil.rmtree(lit_dir)
        shutil.rmtree(samples)
    finally:
        server.close()
    meta = {"samples": n, "chunk_size": chunk, "chunks": chunks, "bytes": sum(sizes), "mean_kib": sum(sizes) / n / 1024,
            "tar_shards": k + 1, "prepare_secs": time.time() - t0}
    meta_file.write_text(json.dumps(meta))
    return meta


def find_key(obj, key):
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            r = find_key(v, key)
            if r is not None:
                return r
    return None


def _lit_item(path):
    return {"id": int(os.path.basename(path)), "data": open(path, "rb").read()}


def litdata_optimize(samples: str, out: str, n: int):
    import litdata

    litdata.optimize(fn=_lit_item, inputs=[os.path.join(samples, f"{i:08d}") for i in range(n)], output_dir=out,
                     chunk_bytes="64MB", num_workers=1)


# ---------------------------------------------------------------- the link's own rate


def probe(endpoint: str, key: str, streams: int, get_size: int, total: int) -> dict:
    """GETs of `get_size` over bucket/key's first `total` bytes, `streams` in flight (one whole
    GET when get_size is 0), from this process. MB/s of body bytes."""
    bucket, _, obj = key.partition("/")
    s3 = s3_client(endpoint)
    size = s3.head_object(Bucket=bucket, Key=obj)["ContentLength"]
    total = min(total, size)
    t0 = time.perf_counter()
    if get_size == 0:
        body = s3.get_object(Bucket=bucket, Key=obj, Range=f"bytes=0-{total - 1}")["Body"]
        got = 0
        while chunk := body.read(1 << 20):
            got += len(chunk)
    else:
        def one(off):
            r = s3.get_object(Bucket=bucket, Key=obj, Range=f"bytes={off}-{min(off + get_size, total) - 1}")
            return len(r["Body"].read())
        with ThreadPoolExecutor(streams) as ex:
            got = sum(ex.map(one, range(0, total, get_size)))
    secs = time.perf_counter() - t0
    return {"bytes": got, "secs": secs, "mb_per_s": got / secs / 1e6, "streams": streams, "get_size": get_size}


# ---------------------------------------------------------------- runs


def dir_bytes(path) -> int:
    """Bytes allocated under a directory (its files' blocks)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total


class DiskWatch:
    """Peak bytes allocated under a directory, sampled every 0.25 s."""

    def __init__(self, path: Path | None):
        self.path, self.peak, self._stop = path, 0, threading.Event()
        self.t = threading.Thread(target=self._loop, daemon=True)

    def _size(self) -> int:
        return dir_bytes(self.path)

    def _loop(self):
        while not self._stop.wait(0.25):
            self.peak = max(self.peak, self._size())

    def __enter__(self):
        if self.path is not None:
            self.t.start()
        return self

    def __exit__(self, *exc):
        if self.path is not None:
            self._stop.set()
            self.t.join()
            self.peak = max(self.peak, self._size())


def set_up(a):
    """The cgroup layout, the loaders' memory groups and the network (not up yet); SIGTERM as
    Ctrl-C, so the network is taken down on either."""
    layout = detect()
    groups = Groups(layout, block_device(a.work))
    groups.profile("net", None, None)
    net = Net(a, a.work / "srv")

    def on_signal(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    return layout, groups, net


def tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def run_one(a, net: Net, groups: Groups, meta: dict, loader: str, rnd: int, extra: list[str] | None = None,
            limit_extra: int = 0, workers: int = 8) -> dict:
    n = meta["samples"]
    budget = meta["bytes"] // 10
    g = groups.run_group("net", a.allowance + budget + limit_extra)
    cache = a.work / "cache" / loader
    shutil.rmtree(cache, ignore_errors=True)
    (a.out / "ids").mkdir(parents=True, exist_ok=True)
    out_ids = a.out / "ids" / f"{loader}.npy"
    rec = {"loader": loader, "round": rnd, "memory_limit": a.allowance + budget + limit_extra, "workers": workers}
    net.admin("reset-stats", "POST")
    try:
        if loader.startswith("brand"):
            argv = [a.brand, "read", "s3://brand/ds", "--memory", "10%", "--epochs", "1", "--json", "--seed",
                    str(rnd + 1), *BRAND_FLAGS[loader], *(extra or [])]
            sampler = RssSampler(g)
            sampler.start()
            t0 = time.perf_counter()
            p = subprocess.run(g.wrap(net.exec_c(argv)), capture_output=True, text=True, env=brand_env(a),
                               timeout=a.timeout)
            wall = time.perf_counter() - t0
            rec["peak_rss_group"] = sampler.stop()
            if p.returncode != 0:
                raise RuntimeError(f"brand read exit {p.returncode}: {p.stderr[-800:]}")
            ep = parse_brand(p.stdout)
            m = ep.get("metrics", {})
            order = ep.get("order", {})
            rec.update(samples=ep.get("samples"), seconds=ep.get("seconds") or ep.get("secs"),
                       samples_per_sec=ep.get("samples_per_sec"), useful_mb_per_sec=ep.get("useful_mb_per_sec"),
                       first_batch_s=ep.get("first_batch_wait_secs"), peak_rss_self=ep.get("peak_rss_bytes"),
                       exactly_once=ep.get("exactly_once"), chunk_mate_dispersion=order.get("chunk_mate_dispersion"),
                       brand_store_requests=m.get("store_requests"), brand_store_bytes=m.get("store_bytes_fetched"),
                       brand_store_retries=m.get("store_retries"),
                       brand_store_retries_by_cause=m.get("store_retries_by_cause"), get_p50_ms=m.get("store_get_p50_ms"),
                       get_p99_ms=m.get("store_get_p99_ms"), reads_issued=m.get("reads_issued"),
                       in_flight_limit_end=m.get("store_gets_in_flight_limit"),
                       refills=m.get("refills"), recovery_reads=m.get("recovery_reads"),
                       bytes_read=m.get("bytes_read"), wall_s=wall, local_disk_peak=0,
                       # brand's clock starts once the dataset is open (manifest and index fetched);
                       # the peers' at `go`, before their dataset object is made. This bound adds
                       # brand's open (and process start and exit): wall - epoch + first wait.
                       first_batch_from_start_s=wall - (ep.get("seconds") or 0) + (ep.get("first_batch_wait_secs") or 0))
        else:
            argv = [a.venv_python, HERE / "runners" / "objstore_peer.py", loader, "--endpoint", ENDPOINT, "--out",
                    out_ids, "--cache", cache, "--seed", rnd + 1, "--workers", workers,
                    "--shuffle-buffer", n // 10]
            env = env_s3(ENDPOINT)
            env["PYTHONUNBUFFERED"] = "1"
            logs = a.out / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            errf = logs / f"{loader}-{rnd}-w{workers}.err"
            with open(errf, "w") as ef:
                p = subprocess.Popen(g.wrap(net.exec_c(argv)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=ef, text=True, env=env)
            q = tagged_lines(p)
            res = None
            first = next_tagged(q, p, time.monotonic() + 120)
            if first is None or not first.get("ready"):
                p.kill()
                raise RuntimeError(f"{loader} did not start: {first} {tail(errf)}")
            net.admin("reset-stats", "POST")
            sampler = RssSampler(g)
            sampler.start()
            with DiskWatch(cache) as dw:
                t0 = time.perf_counter()
                p.stdin.write("go\n")
                p.stdin.flush()
                res = next_tagged(q, p, time.monotonic() + a.timeout)
                wall = time.perf_counter() - t0
            rec["peak_rss_group"] = sampler.stop()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
            rec["oom_kills"] = g.oom_kills()
            if res is None or "error" in res:
                why = f"OOM kills {rec['oom_kills']}" if rec["oom_kills"] else ("timeout" if res is None and p.returncode is None else "")
                raise RuntimeError(f"{loader} ({workers} workers): {why} {res} {tail(errf)}")
            import numpy as np
            ids = np.load(out_ids).tolist()
            q = order_quality(ids, n, meta["chunk_size"])
            rec.update(samples=res["samples"], seconds=res["seconds"], samples_per_sec=res["samples"] / res["seconds"],
                       useful_mb_per_sec=res["bytes"] / res["seconds"] / 1e6, first_batch_s=res["first_batch_s"],
                       wall_s=wall, local_disk_peak=dw.peak, **q)
        rec.setdefault("oom_kills", g.oom_kills())
    except Exception as e:  # noqa: BLE001 (recorded, the run goes on)
        rec["error"] = str(e)[-2000:]
        print(f"  {loader} round {rnd}: FAILED {rec['error'][-400:]}", file=sys.stderr)
    finally:
        groups.release(g)
        shutil.rmtree(cache, ignore_errors=True)
    st = net.admin("stats")
    rec.update(server_gets=st.get("get_requests"), server_get_bytes=st.get("get_bytes"),
               server_heads=st.get("head_requests"), server_lists=st.get("list_requests"), server_stats=st)
    return rec


def brand_env(a) -> dict:
    # read_gap = auto caches its probe per store (bucket, endpoint, GETs in flight) here; the harness
    # probes once before measuring (`warm_probe`).
    return {**env_s3(ENDPOINT), "XDG_CACHE_HOME": str(a.work / "home")}


def tagged_lines(p) -> queue.Queue:
    """A thread putting a runner's `@@brandbench ` lines (as JSON) on a queue, then None at EOF."""
    q: queue.Queue = queue.Queue()

    def loop():
        for line in p.stdout:
            if line.startswith("@@brandbench "):
                q.put(json.loads(line[len("@@brandbench "):]))
        q.put(None)

    threading.Thread(target=loop, daemon=True).start()
    return q


def next_tagged(q: queue.Queue, p, deadline: float):
    """The next tagged line; None if the runner ended (its DataLoader workers may still hold the pipe:
    an OOM kill of the main process) or the deadline passed."""
    while True:
        try:
            return q.get(timeout=1)
        except queue.Empty:
            if p.poll() is not None:
                try:
                    return q.get(timeout=2)
                except queue.Empty:
                    return None
            if time.monotonic() > deadline:
                return None


def parse_brand(stdout: str) -> dict:
    """The last epoch object of `brand read --json`."""
    last = None
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                last = json.loads(line)
            except json.JSONDecodeError:
                pass
    if last is None:
        try:
            last = json.loads(stdout)
        except json.JSONDecodeError:
            raise RuntimeError(f"no JSON in brand's output: {stdout[-400:]}")
    if isinstance(last, list):
        return last[-1]
    if isinstance(last, dict) and "epochs" in last and isinstance(last["epochs"], list):
        ep = dict(last["epochs"][-1])
        for k, v in last.items():
            ep.setdefault(k, v)
        return ep
    return last


# ---------------------------------------------------------------- report


def err_line(e: str) -> str:
    """The telling line of a run's error: the OOM note, else the last exception line."""
    lines = [l.strip() for l in e.splitlines() if l.strip()]
    for l in lines:
        if "OOM kills" in l:
            return l.split(" None")[0]
    for l in reversed(lines):
        if "Error" in l or "error" in l:
            return l[:300]
    return lines[-1][:300] if lines else e[:300]


def summarise(runs: list[dict], links: list[dict]) -> dict:
    out = {}
    link_by_round = {l["round"]: l["mb_per_s"] for l in links}
    for loader in sorted({r["loader"] for r in runs}):
        rs = [r for r in runs if r["loader"] == loader and "error" not in r]
        fails = [r for r in runs if r["loader"] == loader and "error" in r]
        row = {"runs": len(rs), "failed": len(fails), "errors": [f"{f['workers']} workers, round {f['round']}: "
                                                                 f"{err_line(f['error'])}" for f in fails]}
        for k in ("first_batch_from_start_s", "reads_issued", "refills", "bytes_read", "samples_per_sec", "useful_mb_per_sec", "server_gets", "server_get_bytes", "chunk_mate_dispersion",
                  "first_batch_s", "peak_rss_group", "peak_rss_self", "local_disk_peak", "brand_store_requests",
                  "get_p50_ms", "get_p99_ms"):
            row[k] = summary([r.get(k) for r in rs])
        row["link_fraction"] = summary([r["useful_mb_per_sec"] / link_by_round[r["round"]] for r in rs
                                        if r.get("round") in link_by_round and r.get("useful_mb_per_sec")])
        row["exactly_once"] = all(r.get("exactly_once") for r in rs) if rs else None
        out[loader] = row
    return out


def fmt(s, scale=1.0, digits=1):
    if not s:
        return "–"
    m, lo, hi = s["median"] / scale, s["min"] / scale, s["max"] / scale
    return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def report(res: dict, out: Path):
    meta, summ, link = res["dataset"], res["summary"], res["link_summary"]
    L = [f"# Object storage: brand against s3torchconnector, MosaicML Streaming, LitData (issue 33)", "",
         f"Command: `{res['command']}`  ", f"Build: `{res['build']}`, {res['date']}  ",
         f"Dataset: {meta['samples']} samples, {meta['bytes'] / 1e9:.2f} GB ({meta['mean_kib']:.0f} KiB mean), "
         f"chunks of {meta['chunk_size']}; memory groups of {res['allowance'] / MIB:.0f} MiB + 10 % of the dataset "
         f"({meta['bytes'] // 10 / MIB:.0f} MiB).  ",
         f"Link: tbf {res['rate']} each way + delay relay {res['delay_ms']} ms each way "
         f"(RTT {2 * res['delay_ms']} ms). Rounds: {res['rounds']}, interleaved.", "",
         "## Link", "",
         f"8 MiB ranged GETs, 16 in flight (boto3, client namespace): {fmt(link.get('parallel'))} MB/s; "
         f"one stream: {fmt(link.get('single'))} MB/s. The loaders' fractions below are of the round's "
         "parallel figure.", "",
         "## Loaders (median, min–max)", "",
         "| loader | samples/s | useful MB/s | of link | GETs (server) | MB fetched (server) | dispersion | "
         "exactly once | first batch s | peak RSS MiB | local disk MiB | runs (failed) |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for loader in LOADERS:
        s = summ.get(loader)
        if not s:
            continue
        L.append(f"| {loader} | {fmt(s['samples_per_sec'], digits=0)} | {fmt(s['useful_mb_per_sec'])} | "
                 f"{fmt(s['link_fraction'], digits=2)} | {fmt(s['server_gets'], digits=0)} | "
                 f"{fmt(s['server_get_bytes'], 1e6, 0)} | {fmt(s['chunk_mate_dispersion'], digits=3)} | "
                 f"{s['exactly_once']} | {fmt(s['first_batch_s'], digits=2)} | {fmt(s['peak_rss_group'], MIB, 0)} | "
                 f"{fmt(s['local_disk_peak'], MIB, 0)} | {s['runs']} ({s['failed']}) |")
    errs = [(k, e) for k, s in summ.items() for e in s["errors"]]
    if errs:
        L += ["", "Failures (each counted in its loader's failed runs):", ""] + [f"- {k}: `{e}`" for k, e in errs]
    if res.get("goals"):
        L += ["", "## Goals", ""] + [f"- {g}" for g in res["goals"]]
    if res.get("sweep"):
        L += ["", "## brand alone: --gets-in-flight × --get-size (useful MB/s, median (min–max) over sweep rounds; "
              "auto: the limit at the epoch's end in brackets)", ""]
        sizes = sorted({r["get_size"] for r in res["sweep"]})
        infl = sorted({str(r["in_flight"]) for r in res["sweep"]}, key=in_flight_order)
        L.append("| in flight | " + " | ".join(f"{s // MIB} MiB" for s in sizes) + " |")
        L.append("|---" * (len(sizes) + 1) + "|")
        for i in infl:
            cells = []
            for s in sizes:
                rs = [r for r in res["sweep"] if r["get_size"] == s and str(r["in_flight"]) == i
                      and r.get("useful_mb_per_sec")]
                v = [r["useful_mb_per_sec"] for r in rs]
                cell = f"{statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})" if v else "–"
                ends = [r["in_flight_limit_end"] for r in rs if r.get("in_flight_limit_end") is not None]
                if i == "auto" and ends:
                    cell += f" [{', '.join(str(e) for e in ends)}]"
                cells.append(cell)
            L.append(f"| {i} | " + " | ".join(cells) + " |")
    (out / "objstore-results.md").write_text("\n".join(L) + "\n")
    plot(res, out / "objstore.png")


def in_flight_order(i: str):
    """Sweep points in order: numbers ascending, then auto."""
    return (1, 0) if i == "auto" else (0, int(i))


def plot(res: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = res["summary"]
    names = [l for l in LOADERS if l in summ and summ[l]["samples_per_sec"]]
    fig, axes = plt.subplots(1, 3 if res.get("sweep") else 2, figsize=(15, 4.5))
    for ax, key, label in ((axes[0], "useful_mb_per_sec", "useful MB/s"),
                           (axes[1], "chunk_mate_dispersion", "chunk-mate dispersion (1 = uniform)")):
        med = [summ[n][key]["median"] if summ[n][key] else 0 for n in names]
        lo = [m - (summ[n][key]["min"] if summ[n][key] else 0) for m, n in zip(med, names)]
        hi = [(summ[n][key]["max"] if summ[n][key] else 0) - m for m, n in zip(med, names)]
        ax.bar(names, med, yerr=[lo, hi], capsize=4, color=["C3" if n == "brand" else "C0" for n in names])
        ax.set_title(label)
        if key == "useful_mb_per_sec" and res["link_summary"].get("parallel"):
            ax.axhline(res["link_summary"]["parallel"]["median"], color="k", ls="--", lw=1, label="link")
            ax.legend()
    if res.get("sweep"):
        ax = axes[2]
        for s in sorted({r["get_size"] for r in res["sweep"]}):
            pts = {}
            for r in res["sweep"]:
                if r["get_size"] == s and r.get("useful_mb_per_sec"):
                    pts.setdefault(str(r["in_flight"]), []).append(r["useful_mb_per_sec"])
            xs = sorted((x for x in pts if x != "auto"), key=in_flight_order)
            line = ax.plot([int(x) for x in xs], [statistics.median(pts[x]) for x in xs], marker="o",
                           label=f"{s // MIB} MiB GETs")
            if "auto" in pts:
                ax.axhline(statistics.median(pts["auto"]), color=line[0].get_color(), ls=":", lw=1.5,
                           label=f"{s // MIB} MiB GETs, auto")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GETs in flight")
        ax.set_title("brand: useful MB/s")
        if res["link_summary"].get("parallel"):
            ax.axhline(res["link_summary"]["parallel"]["median"], color="k", ls="--", lw=1)
        ax.legend(fontsize=8)
    fig.suptitle(f"{res['dataset']['samples']} samples over tbf {res['rate']}, RTT {2 * res['delay_ms']} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def goals(summ: dict, link: dict, chunks: int | None = None) -> list[str]:
    """The issue's goals, for each brand variant (`brand`: read gap whole; `brand-auto`: the default)."""
    out = []
    peers = {k: v for k, v in summ.items() if not k.startswith("brand") and v["samples_per_sec"]}
    fast = max(peers, key=lambda k: peers[k]["samples_per_sec"]["median"]) if peers else None
    for name in ("brand", "brand-auto"):
        b = summ.get(name)
        if not b or not b["useful_mb_per_sec"]:
            continue
        ok = lambda c: "met" if c else "NOT met"
        lf = b["link_fraction"]["median"] if b["link_fraction"] else 0.0
        out.append(f"{name}: useful rate ≥ 0.9 of the link: {lf:.2f} → {ok(lf >= 0.9)}")
        if fast:
            ratio = b["samples_per_sec"]["median"] / peers[fast]["samples_per_sec"]["median"]
            out.append(f"{name}: ≥ 1.2× the fastest peer's samples/s ({fast}): {ratio:.2f}× → {ok(ratio >= 1.2)}")
            pd, bd = peers[fast]["chunk_mate_dispersion"], b["chunk_mate_dispersion"]
            if pd and bd:
                r = bd["median"] / pd["median"]
                out.append(f"{name}: dispersion ≥ 2× that peer's: {bd['median']:.3f} vs {pd['median']:.3f} = {r:.2f}× → "
                           f"{ok(r >= 2)}")
        disk = b.get("local_disk_peak")
        out.append(f"{name}: no local disk (brand has no cache directory; it reads into memory) → met")
        g, reads = b.get("server_gets"), b.get("refills")
        if g and reads:
            out.append(f"{name}: GETs ≤ 1.1× chunks read: {g['median']:.0f} GETs (server, manifest and index "
                       f"included) for {reads['median']:.0f} chunk reads ({chunks} distinct chunks) = "
                       f"{g['median'] / reads['median']:.2f}× → {ok(g['median'] <= 1.1 * reads['median'])}")
        fb, fs = b.get("first_batch_s"), b.get("first_batch_from_start_s")
        if fb:
            out.append(f"{name}: first batch ≤ 2 s at {2 * DELAY_NOTE[0]:.0f} ms RTT: {fb['median']:.2f} s after open "
                       f"(max {fb['max']:.2f}) → {ok(fb['max'] <= 2)}; from process start (upper bound) "
                       f"{fs['median']:.2f} s (max {fs['max']:.2f}) → {ok(fs['max'] <= 2)}")
    return out or ["brand did not run"]


DELAY_NOTE = [10.0]


# ---------------------------------------------------------------- main


def add_setup_args(ap):
    """The options every script on this shaped link shares: the link (rate, RTT, MTU), the memory
    group's allowance, and the binaries and Python it runs."""
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay-ms", type=float, default=10)
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--allowance", type=int, default=640 * MIB)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
    ap.add_argument("--brand", default=str(target / "brand"))
    ap.add_argument("--server-bin", default=str(target / "brand-s3-server"))
    ap.add_argument("--relay-bin", default=str(target / "delay-relay"))
    ap.add_argument("--venv-python", default=sys.executable)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", nargs="?", default="run")
    ap.add_argument("rest", nargs="*")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/brand-bench/objstore"))
    ap.add_argument("--samples", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loaders", default=",".join(LOADERS))
    add_setup_args(ap)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--sweep-rounds", type=int, default=1)
    ap.add_argument("--sweep-loader", default="brand-auto", choices=list(BRAND_FLAGS))
    ap.add_argument("--sweep-in-flight", default="2,4,8,16,32,64")
    ap.add_argument("--sweep-get-mib", default="1,4,8,16")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--report-only", type=Path)
    a = ap.parse_args()
    if a.cmd == "litdata-optimize":
        litdata_optimize(a.rest[0], a.rest[1], int(a.rest[2]))
        return
    if a.cmd == "probe":
        print(json.dumps(probe(a.rest[0], a.rest[1], int(a.rest[2]), int(a.rest[3]), int(a.rest[4]))))
        return
    out = a.out = a.out or a.work / "out"
    if a.report_only:
        res = json.loads(a.report_only.read_text())
        res["summary"] = summarise(res["runs"], [l for l in res["links"] if l["kind"] == "parallel"])
        DELAY_NOTE[0] = res["delay_ms"]
        res["goals"] = goals(res["summary"], res["link_summary"], res["dataset"].get("chunks"))
        a.report_only.write_text(json.dumps(res, indent=1))
        report(res, a.report_only.parent)
        return
    if os.geteuid() != 0:
        sys.exit("objstore.py needs root (network namespaces, tc, cgroups)")
    meta = prepare(a)
    out.mkdir(parents=True, exist_ok=True)
    layout, groups, net = set_up(a)
    loaders = a.loaders.split(",") if a.loaders else []
    runs, links, sweep = [], [], []
    build = sh("git", "-C", ROOT, "rev-parse", "--short", "HEAD", check=False).stdout.strip()
    res = {"command": " ".join(sys.argv), "build": build, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "dataset": meta, "allowance": a.allowance, "rate": a.rate, "delay_ms": a.delay_ms, "rounds": a.rounds,
           "cgroup": f"v{layout.version}", "runs": runs, "links": links, "sweep": sweep}

    def save():
        res["summary"] = summarise(runs, [l for l in links if l["kind"] == "parallel"])
        res["link_summary"] = {k: summary([l["mb_per_s"] for l in links if l["kind"] == k])
                               for k in ("parallel", "single")}
        DELAY_NOTE[0] = a.delay_ms
        res["goals"] = goals(res["summary"], res["link_summary"], meta.get("chunks")) if runs else []
        (out / "results.json").write_text(json.dumps(res, indent=1))
        report(res, out)

    seg = None
    workers: dict[str, int] = {}
    res["workers"] = workers
    try:
        net.up()
        if "brand-auto" in loaders:
            # read_gap = auto probes the store once (thousands of GETs); cached in WORK/home, not measured.
            p = subprocess.run(net.exec_c([a.brand, "read", "s3://brand/ds", "--memory", "10%", "--epochs", "1",
                                           "--json"]), capture_output=True, text=True, env=brand_env(a))
            res["auto_probe"] = {"rc": p.returncode, "stats": net.admin("stats"),
                                 "read_gap": (parse_brand(p.stdout).get("metrics", {}).get("read_gap")
                                              if p.returncode == 0 else p.stderr[-500:])}
            print(f"read_gap auto probe: {res['auto_probe']}", file=sys.stderr)
        s3 = None
        for rnd in range(a.rounds):
            # The link, each round: 8 MiB GETs, 16 in flight, over one brand segment; and one stream.
            if seg is None:
                ls = json.loads(sh(*net.exec_c([a.venv_python, "-c",
                    "import boto3,json;from botocore.config import Config;"
                    f"s=boto3.client('s3',endpoint_url='{ENDPOINT}',aws_access_key_id='{AK}',"
                    f"aws_secret_access_key='{SK}',region_name='{REGION}');"
                    "print(json.dumps([[o['Key'],o['Size']] for o in s.list_objects_v2(Bucket='brand',Prefix='ds/')['Contents']]))"])).stdout)
                seg = "brand/" + max(ls, key=lambda kv: kv[1])[0]
            for kind, streams, gs in (("parallel", 16, 8 * MIB), ("single", 1, 0)):
                p = sh(*net.exec_c([a.venv_python, Path(__file__).resolve(), "probe", ENDPOINT, seg, streams, gs,
                                    min(meta["bytes"], 1 << 30)]), check=False)
                if p.returncode == 0:
                    links.append({"round": rnd, "kind": kind, **json.loads(p.stdout)})
                    print(f"round {rnd}: link {kind} {links[-1]['mb_per_s']:.1f} MB/s", file=sys.stderr)
                else:
                    print(f"probe failed: {p.stderr[-500:]}", file=sys.stderr)
            order = loaders[rnd % len(loaders):] + loaders[:rnd % len(loaders)]
            for loader in order:
                while True:
                    r = run_one(a, net, groups, meta, loader, rnd, workers=workers.get(loader, a.workers))
                    runs.append(r)
                    # A peer killed for memory at W workers runs again at W/2 (this round and later ones);
                    # the failed run stays in the record.
                    if loader.startswith("brand") or not r.get("oom_kills") or "error" not in r or r["workers"] <= 1:
                        break
                    workers[loader] = r["workers"] // 2
                    print(f"  {loader}: OOM at {r['workers']} workers, again with {workers[loader]}", file=sys.stderr)
                print(f"round {rnd}: {loader}: {r.get('samples_per_sec') or 0:.0f} samples/s, "
                      f"{r.get('useful_mb_per_sec') or 0:.1f} MB/s, GETs {r.get('server_gets')}, "
                      f"disp {r.get('chunk_mate_dispersion')}, first {r.get('first_batch_s')}", file=sys.stderr)
            save()
        infl = [x for x in a.sweep_in_flight.split(",") if x]  # "auto" or a number
        sizes = [int(x) * MIB for x in a.sweep_get_mib.split(",") if x]
        for srnd in range(a.sweep_rounds):
            combos = [(i, s) for i in infl for s in sizes]
            random.Random(srnd).shuffle(combos)
            for i, s in combos:
                # Read-ahead enough for i whole GETs (auto: up to 256 of them; the default 64 MiB
                # holds 256 of the ~170 KB GETs read_gap = auto makes).
                ra = 64 * MIB if i == "auto" else max(64 * MIB, min(512 * MIB, int(i) * s))
                r = run_one(a, net, groups, meta, a.sweep_loader, 100 + srnd,
                            ["--gets-in-flight", i, "--get-size", str(s), "--readahead", str(ra)],
                            limit_extra=ra)
                r.update(in_flight=i, get_size=s, readahead=ra)
                sweep.append(r)
                print(f"sweep {i} x {s // MIB} MiB: {r.get('useful_mb_per_sec') or 0:.1f} MB/s", file=sys.stderr)
            save()
    finally:
        net.down()
        groups.close()
        shutil.rmtree(a.work / "cache", ignore_errors=True)
        if runs:
            save()
    print(out / "objstore-results.md")


if __name__ == "__main__":
    main()
