#!/usr/bin/env python3
"""Import rate of `brand pack --from FORMAT` against reading the input once.

For each format (tar, tar.gz, mds, mds-zstd, parquet, arrow) the same samples
(incompressible payloads of --mean-kib, labels 0..99) are written once with
the format's own library (Python's tarfile, mosaicml-streaming's MDSWriter,
pyarrow in Hugging Face's layout: an Image struct{bytes, path} and an int64
ClassLabel with the `huggingface` metadata, 100-row row groups as datasets
< 4.1 writes; Hugging Face `datasets`' own `save_to_disk` for arrow, 3
shards). Then, in --rounds interleaved rounds (the format order
rotates each round):

- `cat INPUT... > /dev/null`: the bytes of the input read once;
- `brand pack --from FORMAT INPUT... -o OUT`: the whole import (listing,
  decompression and spooling where the format needs it, the shuffle, the
  packed writes), its output removed after the round.

MB/s is input bytes (as stored: compressed for tar.gz and mds-zstd) per
wall second; peak RSS is the command's (/usr/bin/time %M). The page cache
is NOT dropped (other jobs share this machine): both sides read a warm
cache where the input fits in memory, so the figures compare CPU and write
costs, not the device. Results: median [min, max] over the rounds.

    python3 bench/import_rate.py --brand target/release/brand --work /var/tmp/brand-import-bench \
        --total-mib 300 --rounds 5 --out docs/bench/import-results.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

FORMATS = ["tar", "tar.gz", "mds", "mds-zstd", "parquet", "arrow"]


def payloads(total: int, mean: int):
    """(key, label, bytes) of samples adding up to about `total` bytes."""
    rng = __import__("random").Random(7)
    made, i = 0, 0
    while made < total:
        size = max(1024, int(rng.lognormvariate(0, 0.5) * mean))
        data = os.urandom(size)
        yield f"s{i:07d}", i % 100, data
        made += size
        i += 1


def write_inputs(work: Path, total: int, mean: int) -> dict[str, list[Path]]:
    samples = list(payloads(total, mean))
    inputs: dict[str, list[Path]] = {}
    # tar and tar.gz: WebDataset shards of about 64 MiB (.jpg + .cls).
    for fmt, mode, ext in [("tar", "w", ".tar"), ("tar.gz", "w:gz", ".tar.gz")]:
        d = work / fmt
        d.mkdir()
        shard, size, tf = 0, 0, None
        for key, label, data in samples:
            if tf is None or size > 64 << 20:
                if tf:
                    tf.close()
                kw = {"compresslevel": 6} if mode == "w:gz" else {}
                tf = tarfile.open(d / f"shard-{shard:05d}{ext}", mode, **kw)
                shard, size = shard + 1, 0
            for name, blob in [(f"{key}.jpg", data), (f"{key}.cls", str(label).encode())]:
                info = tarfile.TarInfo(name)
                info.size = len(blob)
                tf.addfile(info, __import__("io").BytesIO(blob))
            size += len(data)
        tf.close()
        inputs[fmt] = sorted(d.iterdir())
    # MDS, plain and zstd (64 MiB shards, Streaming's default).
    from streaming import MDSWriter

    for fmt, compression in [("mds", None), ("mds-zstd", "zstd:3")]:
        d = work / fmt
        with MDSWriter(out=str(d), columns={"image": "bytes", "label": "int"}, compression=compression) as w:
            for _, label, data in samples:
                w.write({"image": data, "label": label})
        inputs[fmt] = [d]
    # Parquet as the Hub holds it.
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = work / "parquet"
    d.mkdir()
    meta = {"info": {"features": {"image": {"_type": "Image"},
                                  "label": {"names": [f"c{i}" for i in range(100)], "_type": "ClassLabel"}}}}
    per_file = 2000
    for f in range(0, len(samples), per_file):
        part = samples[f:f + per_file]
        image = pa.array([{"bytes": s[2], "path": None} for s in part],
                         pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
        table = pa.table({"image": image, "label": pa.array([s[1] for s in part], pa.int64())})
        table = table.replace_schema_metadata({"huggingface": json.dumps(meta)})
        pq.write_table(table, d / f"train-{f // per_file:05d}.parquet", row_group_size=100)
    inputs["parquet"] = sorted(d.iterdir())
    # Arrow IPC as datasets' save_to_disk writes it (read in place by brand).
    from datasets import ClassLabel, Dataset, Features, Image

    features = Features({"image": Image(), "label": ClassLabel(names=[f"c{i}" for i in range(100)])})
    rows = {"image": [{"bytes": s[2], "path": None} for s in samples], "label": [s[1] for s in samples]}
    Dataset.from_dict(rows, features=features).save_to_disk(str(work / "arrow"), num_shards=3)
    inputs["arrow"] = [work / "arrow"]
    return inputs


def input_files(paths: list[Path]) -> list[Path]:
    out = []
    for p in paths:
        out.extend(sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p])
    return out


def timed(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and the command's peak RSS in bytes. The RSS comes from
    /usr/bin/time (%M), not this process's wait4: a child forked from this
    (large) Python process would report its parent's resident set as its
    own peak (Linux keeps the high-water mark across fork and exec)."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    err = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {err}")
    return wall, int(err.strip().splitlines()[-1]) * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brand", required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--total-mib", type=int, default=300)
    ap.add_argument("--mean-kib", type=int, default=110)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--keep", action="store_true", help="keep the inputs in --work")
    args = ap.parse_args()
    if args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True)
    try:
        inputs = write_inputs(args.work, args.total_mib << 20, args.mean_kib << 10)
        sizes = {f: sum(p.stat().st_size for p in input_files(inputs[f])) for f in FORMATS}
        results: dict[str, dict[str, list[float]]] = {f: {"cat": [], "pack": [], "rss": []} for f in FORMATS}
        for r in range(args.rounds):
            order = FORMATS[r % len(FORMATS):] + FORMATS[:r % len(FORMATS)]
            for fmt in order:
                files = [str(p) for p in input_files(inputs[fmt])]
                wall, _ = timed(["cat", *files])
                results[fmt]["cat"].append(sizes[fmt] / wall / 1e6)
                out = args.work / "out"
                src = "tar" if fmt.startswith("tar") else "mds" if fmt.startswith("mds") else fmt
                cmd = [args.brand, "pack", "--from", src, *map(str, inputs[fmt]), "-o", str(out), "--force",
                       "--field", "jpg" if src == "tar" else "image", "--label", "cls" if src == "tar" else "label"]
                wall, rss = timed(cmd)
                results[fmt]["pack"].append(sizes[fmt] / wall / 1e6)
                results[fmt]["rss"].append(rss / 2**20)
                shutil.rmtree(out)
                print(f"round {r} {fmt}: cat {results[fmt]['cat'][-1]:.0f} MB/s, "
                      f"pack {results[fmt]['pack'][-1]:.0f} MB/s, {rss / 2**20:.0f} MiB", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)

    def cell(xs: list[float], fmt: str = "{:.0f}") -> str:
        return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}, {fmt.format(max(xs))}]"

    lines = [
        "| format | input MB | `cat` MB/s | `brand pack` MB/s | pack / cat | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for f in FORMATS:
        ratio = [p / c for p, c in zip(results[f]["pack"], results[f]["cat"])]
        lines.append(f"| {f} | {sizes[f] / 1e6:.0f} | {cell(results[f]['cat'])} | {cell(results[f]['pack'])} | "
                     f"{cell(ratio, '{:.2f}')} | {cell(results[f]['rss'])} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
