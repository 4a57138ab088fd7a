"""The device's ceiling on the dataset's file system: a fio sweep.

io_uring, O_DIRECT, random and sequential reads of 4 KiB, 128 KiB and one
chunk (the pack's mean chunk, 4 KiB aligned), at queue depth 1 and 32, over
the pack's segment files, time-based. Run inside the profile's groups, so on
the `net` profile it measures the throttled device.
"""

from __future__ import annotations

import shutil
import subprocess

from . import parse
from .execute import Item


def ensure_fio(log=print) -> tuple[str | None, str]:
    """fio's path, installing it with apt-get when missing (root); else (None, why)."""
    path = shutil.which("fio")
    if path:
        return path, ""
    log("fio is missing: apt-get install -y fio")
    try:
        r = subprocess.run(["apt-get", "install", "-y", "-q", "fio"], capture_output=True, text=True)
        if r.returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True)
            r = subprocess.run(["apt-get", "install", "-y", "-q", "fio"], capture_output=True, text=True)
    except OSError as e:
        return None, f"fio not installed and apt-get unusable ({e})"
    path = shutil.which("fio")
    if path:
        return path, ""
    return None, "fio not installed (apt-get install -y fio failed: " + r.stderr.strip()[-300:] + ")"


def size_label(bs: int) -> str:
    if bs % (1 << 20) == 0:
        return f"{bs >> 20}M"
    return f"{bs >> 10}K"


def sweep(chunk_bytes: int) -> list[tuple[str, int, int]]:
    """(rw, block size, queue depth) of every job."""
    sizes = [4096, 128 << 10, chunk_bytes]
    return [(rw, bs, qd) for rw in ("randread", "read") for bs in sizes for qd in (1, 32)]


def job_name(rw: str, bs: int, qd: int, chunk_bytes: int) -> str:
    label = "chunk" if bs == chunk_bytes and bs not in (4096, 128 << 10) else size_label(bs)
    return f"{'rand' if rw == 'randread' else 'seq'} {label} QD{qd}"


def item(fio: str, segments, rw: str, bs: int, qd: int, seconds: float, chunk_bytes: int) -> Item:
    argv = [
        # --readonly: fio must never lay out (write) the dataset's segments.
        fio, "--readonly", "--name=ceiling", "--filename=" + ":".join(str(s) for s in segments),
        f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}", "--ioengine=io_uring", "--direct=1",
        # In ms: fio reads "0.5" (seconds) as 0, i.e. no time limit.
        f"--runtime={max(1, round(seconds * 1000))}ms", "--time_based", "--group_reporting",
        "--output-format=json", "--randrepeat=0",
    ]
    return Item(
        loader="fio",
        variant=job_name(rw, bs, qd, chunk_bytes),
        name="fio " + job_name(rw, bs, qd, chunk_bytes),
        argv=argv,
        parse=parse.fio,
        extra={"rw": rw, "bs": bs, "qd": qd},
    )
