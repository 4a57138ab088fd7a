"""Runs one measured process inside its groups and collects what it did.

Two kinds of process:

  binary  the brand CLI, brand_throughput, fio: the data's page cache is
          made cold, counters are read, the process runs to its end, counters
          are read again; the process prints JSON on stdout.
  runner  a Python loader in bench/runners: it sets up (imports), says
          ready, and waits; only then is the cache made cold and are the
          counters read, and `go` starts its epoch. Its result line stops the
          counters.

Whatever happens (a crash, an OOM kill, a timeout, a missing binary), the
outcome is a record with a status, never an exception out of `measure`.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import cgroups

TAG = "@@brandbench "


@dataclass
class Item:
    """One measured run."""

    loader: str  # family: files, torch, spdl, tf-tfrecord, tf-files, brand, capi, tf-op, fio
    variant: str  # e.g. "w8", "brand/whole"
    name: str  # for people
    argv: list[str]
    kind: str = "binary"  # or "runner"
    budget: float | None = None  # fraction of the dataset (brand's memory, tf's shuffle buffer)
    parse: Callable[[str], dict] | None = None  # binary stdout -> fields
    env: dict[str, str] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


@dataclass
class Context:
    groups: cgroups.Groups | None
    profile: str
    evict_paths: list[Path]
    drop_all: bool = False
    timeout: float = 1800.0
    log_dir: Path | None = None
    sample_paths: list[Path] = field(default_factory=list)  # checked for residency after eviction


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the group this harness started for it
    except ProcessLookupError:
        pass
    p.wait()


def _read_proto(p: subprocess.Popen, deadline: float, want: str, g=None) -> tuple[dict | None, str]:
    """Reads stdout lines until a protocol line with key `want` (or error, exit, OOM kill, timeout).

    The runner's own exit counts even while its children (PyTorch's workers)
    still hold stdout open."""
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    buf = b""
    fd = p.stdout.fileno()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, "timeout"
            if not sel.select(timeout=min(left, 0.5)):
                if p.poll() is not None:
                    return None, f"exited with {p.returncode}"
                if g is not None and g.oom_kills():
                    return None, "a process was OOM-killed"
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None, "exited"
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.startswith(TAG):
                    try:
                        msg = json.loads(text[len(TAG):])
                    except json.JSONDecodeError:
                        continue
                    if "error" in msg:
                        return None, "error: " + str(msg["error"])
                    if want in msg:
                        return msg, ""
    finally:
        sel.close()


def _tail(path: Path | None, n: int = 600) -> str:
    if path is None or not path.exists():
        return ""
    t = path.read_text(errors="replace").strip()
    lines = [line for line in t.splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-n:]


def measure(item: Item, ctx: Context, memory_limit: int | None) -> dict:
    rec = {
        "loader": item.loader,
        "variant": item.variant,
        "name": item.name,
        "budget": item.budget,
        "profile": ctx.profile,
        "memory_limit_bytes": memory_limit,
        "status": "ok",
    }
    rec.update(item.extra)
    groups = ctx.groups
    g = groups.run_group(ctx.profile, memory_limit) if groups else cgroups.RunGroup(cgroups.Layout(0), "")
    log = None
    if ctx.log_dir is not None:
        ctx.log_dir.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{ctx.profile}-{item.loader}-{item.variant}"
                       f"-{item.budget}")
        log = ctx.log_dir / f"{safe}.stderr"
    env = dict(os.environ)
    env.update(item.env)
    argv = g.wrap(item.argv)
    deadline = time.monotonic() + ctx.timeout
    sampler = None
    p = None
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        errf = open(log, "wb") if log else subprocess.DEVNULL
        try:
            if item.kind == "runner":
                p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf, env=env,
                                     start_new_session=True)
                msg, why = _read_proto(p, deadline, "ready", g)
                if msg is None:
                    _kill(p)
                    return _failed(rec, why, log, g)
                c0 = _prepare_cold(ctx, g)
                sampler = cgroups.RssSampler(g).start()
                p.stdin.write(b"go\n")
                p.stdin.flush()
                msg, why = _read_proto(p, deadline, "result", g)
                c1 = g.counters()
                peak_rss = sampler.stop()
                peak_anon = sampler.peak_anon
                sampler = None
                if msg is None:
                    _kill(p)
                    return _failed(rec, why, log, g)
                try:
                    p.stdin.close()
                    p.wait(timeout=max(5.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _kill(p)
                fields = dict(msg["result"])
            else:
                c0 = _prepare_cold(ctx, g)
                sampler = cgroups.RssSampler(g).start()
                try:
                    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errf, env=env, start_new_session=True)
                except OSError as e:
                    return _failed(rec, f"cannot start: {e}", log, g)
                try:
                    out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _kill(p)
                    return _failed(rec, "timeout", log, g)
                c1 = g.counters()
                peak_rss = sampler.stop()
                peak_anon = sampler.peak_anon
                sampler = None
                if p.returncode != 0:
                    return _failed(rec, f"exit {p.returncode}", log, g)
                try:
                    fields = item.parse(out.decode(errors="replace")) if item.parse else {}
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    return _failed(rec, f"unparsable output ({type(e).__name__}: {e})", log, g)
        finally:
            if log:
                errf.close()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        rec.update(fields)
        rec["device_read_bytes"] = (c1.device_read_bytes - c0.device_read_bytes) if g.layout.usable else None
        cpu = c1.cpu_seconds - c0.cpu_seconds
        if cpu != cpu:  # NaN: no cgroup CPU accounting
            cpu = fields.get("cpu_seconds_self")
            if cpu is None and item.kind == "binary":
                cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
        rec["cpu_seconds"] = cpu
        if g.layout.usable:
            rec["peak_rss_bytes"] = peak_rss
            rec["peak_anon_bytes"] = peak_anon
        else:  # what the process says about itself
            rec["peak_rss_bytes"] = fields.get("loader_peak_rss_bytes") or fields.get("maxrss_self_bytes")
        rec["peak_cgroup_bytes"] = g.peak_usage() or None
        if g.oom_kills():
            rec["oom_kills"] = g.oom_kills()
        return finish(rec)
    finally:
        if p is not None:  # its session: never leave a worker of it running (^C, SIGTERM, OOM)
            _kill(p)
        if sampler is not None:
            sampler.stop()
        if groups:
            groups.release(g)


def _prepare_cold(ctx: Context, g: cgroups.RunGroup) -> cgroups.Counters:
    cgroups.evict(ctx.evict_paths)
    if ctx.drop_all:
        cgroups.drop_all_caches()
    g.reset_peak()
    return g.counters()


def _failed(rec: dict, why: str, log: Path | None, g: cgroups.RunGroup) -> dict:
    if g.oom_kills():
        why = f"OOM-killed at the memory limit ({why})"
    tail = _tail(log)
    rec["status"] = "failed: " + why + (f" [{tail}]" if tail and "OOM" not in why else "")
    return rec


def finish(rec: dict) -> dict:
    """Derived figures of a record: rates, read amplification, CPU per GB."""
    b, s = rec.get("bytes"), rec.get("seconds")
    if b and s:
        rec["useful_mb_per_s"] = b / s / 1e6
        rec["samples_per_s"] = rec.get("samples", 0) / s
    dev = rec.get("device_read_bytes")
    if b and dev:
        rec["read_amplification"] = dev / b
    elif b and rec.get("loader_read_bytes"):
        rec["read_amplification"] = rec["loader_read_bytes"] / b
    cpu = rec.get("cpu_seconds")
    if b and cpu is not None:
        rec["cpu_s_per_gb"] = cpu / (b / 1e9)
    return rec
