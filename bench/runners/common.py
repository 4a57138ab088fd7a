"""What every Python loader runner shares.

A runner is one process that the harness starts inside the run's groups. It
imports its framework and builds what is not part of an epoch, then says
`ready` and waits for `go` on stdin: the harness makes the data's page
cache cold and takes its counters only then, so interpreter start-up and
imports count neither as time, CPU, nor device bytes. It then reads one
epoch, every sample once in random order, and prints one result line.

Protocol lines on stdout start with `@@brandbench ` followed by JSON;
anything else a library prints is ignored.
"""

import json
import os
import resource
import sys
import time

TAG = "@@brandbench "


def say(obj):
    sys.stdout.write(TAG + json.dumps(obj) + "\n")
    sys.stdout.flush()


def ready_and_wait():
    say({"ready": True})
    line = sys.stdin.readline()
    if line.strip() != "go":
        sys.exit(0)


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


class Epoch:
    """Times an epoch: wall time, and the consumer's wait for each batch (stalls)."""

    def __init__(self):
        self.waits = []
        self.samples = 0
        self.bytes = 0

    def consume(self, iterator, count):
        """Iterate `iterator`; `count(batch)` gives (samples, bytes) and touches the batch."""
        self.t0 = time.perf_counter()
        self.cpu0 = _cpu()
        it = iter(iterator)
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            self.waits.append(time.perf_counter() - t)
            n, b = count(batch)
            self.samples += n
            self.bytes += b
        self.seconds = time.perf_counter() - self.t0
        self.cpu = _cpu() - self.cpu0
        return self

    def result(self, **extra):
        w = sorted(self.waits)
        r = {
            "samples": self.samples,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "cpu_seconds_self": self.cpu,
            "batches": len(self.waits),
            "stall_p50_s": percentile(w, 0.5),
            "stall_p99_s": percentile(w, 0.99),
            "stall_max_s": w[-1] if w else None,
            "maxrss_self_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "maxrss_children_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        }
        r.update(extra)
        return r


def _cpu():
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def list_files(root):
    """ImageFolder listing: (path, label) sorted; label = index of the class directory."""
    classes = sorted(d for d in os.listdir(root) if not d.startswith(".") and os.path.isdir(os.path.join(root, d)))
    out = []
    for label, c in enumerate(classes):
        cdir = os.path.join(root, c)
        for dirpath, dirnames, filenames in os.walk(cdir):
            dirnames.sort()
            for f in sorted(filenames):
                if not f.startswith("."):
                    out.append((os.path.join(dirpath, f), label))
    return out


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def main_guard(fn):
    """Runs fn(); any exception becomes an error line (the harness records it)."""
    try:
        fn()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001
        say({"error": f"{type(e).__name__}: {e}"[:2000]})
        raise
