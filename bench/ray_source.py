#!/usr/bin/env python3
"""brand's Ray Data source against Ray's own file reader, over the same samples.

    python bench/ray_source.py [--samples 20000] [--mean-kib 32] [--rounds 5] [--out docs/bench/ray-results.md]

Needs the brand wheel and ray[data] in the running Python (scripts/py-venv.sh
has both) and BRAND_BIN (default target/release/brand) to make the data:
``brand gen`` files (an ImageFolder tree of random bytes) and their brand pack.
Each round, interleaved, one epoch of each reader is consumed with
``iter_batches(batch_size=256, batch_format="pyarrow")`` in one local Ray
(``ray.init(num_cpus=2)``, workers warm after the first round, which is not
counted): brand (``brand.ray.read_brand``, 2 read tasks, memory 10 %) and
``ray.data.read_binary_files(shuffle="files")`` (one file per sample, Ray's
recommended per-epoch file shuffle), each served id checked exactly once.
Ray's servers listen on every address, so the script runs itself again in a
network namespace of its own (``unshare --net``, loopback only; root).
The data's pages are evicted (``posix_fadvise(DONTNEED)``) before every run,
so both read from the disk. Reported: samples/s and MB/s, median [min, max].
On this 2-core machine these are overhead ratios on one node, not scale-out.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

import brand
import brand.ray
import ray


def evict(root: pathlib.Path) -> None:
    for dirpath, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def consume(ds, id_of) -> tuple[int, int, float, set]:
    """(rows, bytes, seconds to the first batch, ids) of one epoch."""
    start = time.perf_counter()
    first = None
    rows = size = 0
    ids: set = set()
    for batch in ds.iter_batches(batch_size=256, batch_format="pyarrow"):
        if first is None:
            first = time.perf_counter() - start
        rows += batch.num_rows
        size += sum(len(b) for b in batch.column("data" if "data" in batch.column_names else "bytes").to_pylist())
        ids.update(id_of(batch))
    return rows, size, first or 0.0, ids


def in_own_namespace() -> int | None:
    """Runs this script again inside a new network namespace (only a
    loopback) unless it already is there; its exit status, or None there."""
    if os.environ.get("BRAND_RAY_NETNS") == "1":
        return None
    cmd = 'ip link set lo up && exec "$0" "$@"'
    env = dict(os.environ, BRAND_RAY_NETNS="1")
    return subprocess.run(["unshare", "--net", "sh", "-c", cmd, sys.executable, *sys.argv], env=env).returncode


def main() -> int:
    rc = in_own_namespace()
    if rc is not None:
        return rc
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--mean-kib", type=float, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", default="/var/tmp/brand-bench/ray")
    ap.add_argument("--out", default=None, help="write the results as Markdown here")
    a = ap.parse_args()
    bin_ = os.environ.get("BRAND_BIN", "target/release/brand")
    data = pathlib.Path(a.data)
    files, packed = data / "files", data / "ds"
    if not (packed / "manifest.toml").exists():
        subprocess.run([bin_, "gen", files, "--samples", str(a.samples), "--mean-kib", str(a.mean_kib),
                        "--min-kib", str(a.mean_kib / 4), "--max-kib", str(a.mean_kib * 4), "--classes", "100",
                        "--seed", "1", "--force"], check=True)
        subprocess.run([bin_, "pack", files, "-o", packed, "--seed", "1", "--force"], check=True)
    # brand's id of each file: keys are paths relative to the packed directory.
    with brand.Loader(packed, batch_size=1024) as loader:
        id_of_key = {k: int(i) for b in loader for k, i in zip(b.keys, b.ids)}
    n = len(id_of_key)
    prefix = str(files.resolve()) + "/"

    def brand_ids(batch):
        return batch.column("id").to_pylist()

    def file_ids(batch):
        return [id_of_key[p[len(prefix):] if p.startswith(prefix) else p.split(str(files) + "/", 1)[-1]]
                for p in batch.column("path").to_pylist()]

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1")
    ray.data.DataContext.get_current().enable_progress_bars = False
    readers = {
        "brand.ray.read_brand": (lambda r: brand.ray.read_brand(packed, seed=r, tasks=2, memory="10%"), brand_ids),
        "ray read_binary_files": (lambda r: ray.data.read_binary_files(str(files), include_paths=True,
                                                                       shuffle="files"), file_ids),
    }
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in readers}
    for r in range(a.rounds + 1):
        for name, (make, id_of) in readers.items():
            evict(data)
            start = time.perf_counter()
            rows, size, first, ids = consume(make(r), id_of)
            secs = time.perf_counter() - start
            if rows != n or ids != set(range(n)):
                print(f"{name}: round {r}: {rows} rows, {len(ids)} distinct of {n}", file=sys.stderr)
                return 1
            print(f"round {r} {name}: {rows / secs:,.0f} samples/s, {size / secs / 1e6:.1f} MB/s, "
                  f"first batch {first:.2f} s" + (" (warm-up, not counted)" if r == 0 else ""), flush=True)
            if r:
                results[name].append((rows / secs, size / secs / 1e6, first))
    ray.shutdown()

    def fmt(values, digits=0):
        return f"{statistics.median(values):,.{digits}f} [{min(values):,.{digits}f}, {max(values):,.{digits}f}]"

    base = statistics.median(s for s, _, _ in results["ray read_binary_files"])
    lines = [f"{n} samples of {a.mean_kib:g} KiB mean ({sum(1 for _ in files.rglob('*') if _.is_file())} files), "
             f"{a.rounds} interleaved rounds (after one warm-up), pages evicted before each run, "
             "`ray.init(num_cpus=2)`.", "",
             "| reader | samples/s | MB/s | first batch s | × read_binary_files |", "|---|---|---|---|---|"]
    for name, rs in results.items():
        sps = [s for s, _, _ in rs]
        lines.append(f"| {name} | {fmt(sps)} | {fmt([m for _, m, _ in rs], 1)} | {fmt([f for _, _, f in rs], 2)} | "
                     f"{statistics.median(sps) / base:.2f} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        pathlib.Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
