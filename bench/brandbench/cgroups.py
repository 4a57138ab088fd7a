"""Control groups for the runs, and cold page cache for the data.

Every measured process runs in a group that (a) limits its memory, page
cache included (v1 `memory.limit_in_bytes`, v2 `memory.max`), (b) counts the
bytes it reads from the block device and, for the `net` profile, throttles
its read IOPS and bandwidth (v1 `blkio.throttle.read_{iops,bps}_device`, v2
`io.max`), and (c) counts its CPU time, threads and child processes included
(v1 `cpuacct.usage`, v2 `cpu.stat`).

Groups are made under the harness's own group of each controller (so a
harness that itself runs in a limited group stays inside it), named
`brand-bench-<pid>-...`, and removed when their run ends (`Groups.close`,
also at exit).

The parsers are pure functions (tested in bench/tests with sample files).
"""

from __future__ import annotations

import ctypes
import errno
import ctypes.util
import mmap
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


# ---------------------------------------------------------------- parsers


def parse_kv(text: str) -> dict[str, int]:
    """`key value` lines (memory.stat, cpu.stat, memory.events, oom_control)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def parse_blkio_bytes(text: str, dev: str) -> int:
    """Bytes read from `dev` ("MAJ:MIN") in a v1 blkio.throttle.io_service_bytes file."""
    total = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == dev and parts[1] == "Read":
            total += int(parts[2])
    return total


def parse_io_stat_bytes(text: str, dev: str) -> int:
    """Bytes read from `dev` in a v2 io.stat file (`254:0 rbytes=.. wbytes=.. ...`)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == dev:
            for kv in parts[1:]:
                k, _, v = kv.partition("=")
                if k == "rbytes":
                    return int(v)
    return 0


def own_group(proc_cgroup_text: str, controller: str) -> str | None:
    """This process's group path for a v1 `controller`, or for v2 (controller "")."""
    for line in proc_cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if controller == "" and parts[0] == "0" and parts[1] == "":
            return parts[2]
        if controller and controller in parts[1].split(","):
            return parts[2]
    return None


def rss_from_stat(stat: dict[str, int], v2: bool) -> int:
    """Resident memory of a group from its memory.stat: anonymous plus
    mapped file pages (shared memory counts as mapped where it is mapped)."""
    if v2:
        return stat.get("anon", 0) + stat.get("file_mapped", 0)
    return stat.get("total_rss", stat.get("rss", 0)) + stat.get("total_mapped_file", stat.get("mapped_file", 0))


# ---------------------------------------------------------------- layout


@dataclass
class Layout:
    """Which cgroup hierarchy this machine has and where our groups go."""

    version: int  # 1, 2, or 0 (none usable)
    memory: Path | None = None  # parent directories to create groups under
    blkio: Path | None = None
    cpuacct: Path | None = None
    unified: Path | None = None
    why: str = ""

    @property
    def usable(self) -> bool:
        return self.version in (1, 2)


def detect(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None, euid: int | None = None) -> Layout:
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return Layout(0, why="not root: no cgroups (memory not limited, no throttling)")
    if proc_cgroup is None:
        proc_cgroup = Path("/proc/self/cgroup").read_text()

    def sub(ctrl_dir: str, ctrl: str) -> Path | None:
        base = root / ctrl_dir
        if not (base / "cgroup.procs").exists():
            return None
        rel = own_group(proc_cgroup, ctrl) or "/"
        return base / rel.lstrip("/")

    mem = sub("memory", "memory")
    if mem is not None and (mem / "memory.limit_in_bytes").exists():
        return Layout(1, memory=mem, blkio=sub("blkio", "blkio"), cpuacct=sub("cpuacct", "cpuacct"))
    if (root / "cgroup.controllers").exists():
        ctrls = (root / "cgroup.controllers").read_text().split()
        rel = own_group(proc_cgroup, "") or "/"
        if "memory" in ctrls:
            return Layout(2, unified=root / rel.lstrip("/"))
    return Layout(0, why="no cgroup memory controller found (v1 memory or v2 memory)")


# ---------------------------------------------------------------- groups


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@dataclass
class Counters:
    """A snapshot of a run's groups."""

    t: float
    device_read_bytes: int
    cpu_seconds: float


@dataclass
class RunGroup:
    """The groups one measured process runs in."""

    layout: Layout
    dev: str
    dirs: list[Path] = field(default_factory=list)  # every directory made, for removal
    mem: Path | None = None
    blk: Path | None = None
    cpu: Path | None = None
    procs_files: list[Path] = field(default_factory=list)

    # -- reading
    def counters(self) -> Counters:
        lay = self.layout
        if lay.version == 1:
            rb = parse_blkio_bytes(_read(self.blk / "blkio.throttle.io_service_bytes"), self.dev) if self.blk else 0
            ns = _read(self.cpu / "cpuacct.usage").strip() if self.cpu else ""
            cpu = int(ns) / 1e9 if ns else float("nan")
        elif lay.version == 2:
            rb = parse_io_stat_bytes(_read(self.mem / "io.stat"), self.dev)
            cpu = parse_kv(_read(self.mem / "cpu.stat")).get("usage_usec", 0) / 1e6
        else:
            rb, cpu = 0, float("nan")
        return Counters(time.monotonic(), rb, cpu)

    def rss(self) -> tuple[int, int]:
        """(anonymous + mapped file, anonymous) bytes resident in the group now."""
        if self.mem is None:
            return 0, 0
        stat = parse_kv(_read(self.mem / "memory.stat"))
        v2 = self.layout.version == 2
        anon = stat.get("anon", 0) if v2 else stat.get("total_rss", stat.get("rss", 0))
        return rss_from_stat(stat, v2), anon

    def peak_usage(self) -> int:
        """Peak memory charged to the group (page cache included) since reset_peak."""
        if self.mem is None:
            return 0
        f = "memory.max_usage_in_bytes" if self.layout.version == 1 else "memory.peak"
        v = _read(self.mem / f).strip()
        return int(v) if v.isdigit() else 0

    def reset_peak(self) -> None:
        if self.mem is None:
            return
        try:
            if self.layout.version == 1:
                _write(self.mem / "memory.max_usage_in_bytes", "0")
            else:
                _write(self.mem / "memory.peak", "0")  # resettable since Linux 6.12; ignored before
        except OSError:
            pass

    def oom_kills(self) -> int:
        if self.mem is None:
            return 0
        f = "memory.oom_control" if self.layout.version == 1 else "memory.events"
        return parse_kv(_read(self.mem / f)).get("oom_kill", 0)

    def wrap(self, argv: list[str]) -> list[str]:
        """argv that joins these groups, then execs argv (no preexec_fn with threads around)."""
        if not self.procs_files:
            return argv
        joins = "; ".join(f"echo $$ > '{p}'" for p in self.procs_files)
        return ["/bin/sh", "-c", joins + '; exec "$@"', "sh", *argv]


class Groups:
    """Makes and removes the groups of a harness run.

    One blkio group per storage profile (stable for the whole harness run: the
    throttle is the profile, and brand's `read_gap = auto` caches its probe per
    blkio group), one cpuacct group per profile, and one memory group per
    measured process (fresh counters and limit).
    """

    def __init__(self, layout: Layout, dev: str):
        self.layout = layout
        self.dev = dev
        self.prefix = f"brand-bench-{os.getpid()}"
        self.made: list[Path] = []
        self.profile_dirs: dict[str, tuple[Path | None, Path | None]] = {}
        self.counter = 0
        self._lock = threading.Lock()

    def _mkdir(self, p: Path) -> Path:
        p.mkdir(exist_ok=True)
        self.made.append(p)
        return p

    def throttle_supported(self) -> tuple[bool, str]:
        lay = self.layout
        if lay.version == 1:
            if lay.blkio is None or not (lay.blkio / "blkio.throttle.read_bps_device").exists():
                return False, "cgroup v1 without blkio throttling"
            return True, ""
        if lay.version == 2:
            ctrls = _read(lay.unified / "cgroup.controllers").split() if lay.unified else []
            if "io" not in ctrls:
                return False, "cgroup v2 without the io controller"
            return True, ""
        return False, lay.why

    def profile(self, name: str, iops: int | None, bps: int | None) -> None:
        """Make the profile's blkio/cpu groups (v1) and set its throttle."""
        lay = self.layout
        if lay.version != 1:
            self.profile_dirs[name] = (None, None)
            return
        blk = self._mkdir(lay.blkio / f"{self.prefix}-{name}") if lay.blkio else None
        cpu = self._mkdir(lay.cpuacct / f"{self.prefix}-{name}") if lay.cpuacct else None
        if blk is not None:
            _write(blk / "blkio.throttle.read_iops_device", f"{self.dev} {iops or 0}")
            _write(blk / "blkio.throttle.read_bps_device", f"{self.dev} {bps or 0}")
        self.profile_dirs[name] = (blk, cpu)
        self._throttle = getattr(self, "_throttle", {})
        self._throttle[name] = (iops, bps)

    def run_group(self, profile: str, memory_limit: int | None) -> RunGroup:
        lay = self.layout
        g = RunGroup(lay, self.dev)
        if not lay.usable:
            return g
        with self._lock:
            self.counter += 1
            n = self.counter
        if lay.version == 1:
            g.mem = self._mkdir(lay.memory / f"{self.prefix}-{n}")
            if memory_limit:
                _write(g.mem / "memory.limit_in_bytes", str(memory_limit))
                # No swap here anyway; where there is, count it in the limit too.
                try:
                    _write(g.mem / "memory.memsw.limit_in_bytes", str(memory_limit))
                except OSError:
                    pass
            g.blk, g.cpu = self.profile_dirs.get(profile, (None, None))
            g.procs_files = [g.mem / "cgroup.procs"] + [p / "cgroup.procs" for p in (g.blk, g.cpu) if p]
        else:
            parent = lay.unified
            # v2: controllers must be enabled for children; a process may only
            # sit in a leaf, so our groups go under a "brand-bench" parent.
            base = parent / f"{self.prefix}"
            if base not in self.made:
                self._mkdir(base)
                for c in ("memory", "io", "cpu"):
                    try:
                        _write(base / "cgroup.subtree_control", f"+{c}")
                    except OSError:
                        pass
            g.mem = self._mkdir(base / f"run-{n}")
            if memory_limit:
                _write(g.mem / "memory.max", str(memory_limit))
                try:
                    _write(g.mem / "memory.swap.max", "0")
                except OSError:
                    pass
            iops, bps = getattr(self, "_throttle", {}).get(profile, (None, None))
            if iops or bps:
                spec = f"{self.dev} riops={iops or 'max'} rbps={bps or 'max'}"
                _write(g.mem / "io.max", spec)
            g.procs_files = [g.mem / "cgroup.procs"]
        g.dirs = [g.mem]
        return g

    def release(self, g: RunGroup) -> None:
        for d in g.dirs:
            if d is not None:
                _kill_members(d)
                _rmdir(d)
                if d in self.made:
                    self.made.remove(d)

    def close(self) -> None:
        for d in reversed(self.made):
            if self.layout.version == 1 and d.parent == self.layout.blkio:
                # Lift the throttle first (a group may linger as a zombie).
                for f in ("blkio.throttle.read_iops_device", "blkio.throttle.read_bps_device"):
                    try:
                        _write(d / f, f"{self.dev} 0")
                    except OSError:
                        pass
            _kill_members(d)
            _rmdir(d)
        self.made.clear()


def _kill_members(d: Path) -> None:
    """SIGKILL what is left in a run's group (processes the harness started there)."""
    for _ in range(20):
        pids = [int(x) for x in _read(d / "cgroup.procs").split() if x.isdigit()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _rmdir(d: Path) -> None:
    # A group whose last process has just exited may be busy for a moment.
    for _ in range(50):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                return
            time.sleep(0.1)


class RssSampler:
    """Polls a group's resident memory (every `period` s) and keeps the peak."""

    def __init__(self, group: RunGroup, period: float = 0.05):
        self.group, self.period = group, period
        self.peak = 0
        self.peak_anon = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.period)

    def _sample(self):
        rss, anon = self.group.rss()
        self.peak = max(self.peak, rss)
        self.peak_anon = max(self.peak_anon, anon)

    def start(self):
        self._sample()
        self._t.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        if self._t.is_alive():
            self._t.join()
        self._sample()
        return self.peak


# ---------------------------------------------------------------- devices


def block_device(path: str | os.PathLike) -> str:
    """MAJ:MIN of the whole disk holding `path` (a partition is throttled at its disk)."""
    st = os.stat(path)
    maj, mnr = os.major(st.st_dev), os.minor(st.st_dev)
    sysdir = Path(f"/sys/dev/block/{maj}:{mnr}")
    if (sysdir / "partition").exists():
        parent = (sysdir.resolve().parent / "dev").read_text().strip()
        return parent
    return f"{maj}:{mnr}"


# ---------------------------------------------------------------- page cache

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def evict(paths: list[Path]) -> None:
    """Drop the page cache of these files. Dirty pages would stay: the dataset
    is synced once when it is made (a machine-wide sync per run can take
    seconds on a shared machine)."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def drop_all_caches() -> bool:
    """`echo 3 > /proc/sys/vm/drop_caches` (root); False if not allowed."""
    os.sync()
    try:
        _write(Path("/proc/sys/vm/drop_caches"), "3")
        return True
    except OSError:
        return False


def resident_fraction(paths: list[Path]) -> float:
    """Fraction of these files' pages that are in the page cache (mmap + mincore)."""
    page = os.sysconf("SC_PAGE_SIZE")
    _libc.mmap.restype = ctypes.c_void_p
    _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    total = resident = 0
    for p in paths:
        try:
            size = p.stat().st_size
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            if size == 0:
                continue
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                continue
            try:
                n = (size + page - 1) // page
                vec = (ctypes.c_ubyte * n)()
                if _libc.mincore(addr, size, vec) == 0:
                    resident += sum(v & 1 for v in vec)
                    total += n
            finally:
                _libc.munmap(addr, size)
        finally:
            os.close(fd)
    return resident / total if total else 0.0


