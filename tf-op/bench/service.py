#!/usr/bin/env python3
"""tf.data service overhead: BrandDataset and a TFRecord pipeline, in-process and
through a local tf.data service (a dispatcher and 2 workers, each its own
process on 127.0.0.1, started by `python -m brand.tf.service`).

    python tf-op/bench/service.py [--samples 30000] [--mean-kib 4] [--rounds 5] [--out FILE.json]

Four readers of the same samples, batched (B per element), one epoch per run:

  brand in-process     BrandDataset(batch_size=B), iterated here
  brand service        the same through the service, processing_mode="distributed_epoch"
                       (dynamic sharding: brand's splits, 8 per worker)
  tfrecord in-process  list_files(16 files) -> interleave(TFRecordDataset) -> shuffle(10 % of
                       the samples) -> batch(B) -> parse_example, the usual tf.data recipe
  tfrecord service     the same through the service, DYNAMIC over the files

A run is timed from the first request to the last element, so it includes a
service job's creation. Rounds interleave the four readers (a shared machine's
background load hits all of them). On one 2-core machine the 2 workers, the
dispatcher and the client share the cores: the ratios say what the service
costs per sample (serialisation, gRPC, the extra processes), not what it
gains by scaling out. brand reads with O_DIRECT; the TFRecord files are read
through the page cache (warmed first). Not run in a memory cgroup. A
benchmark, not a test.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import brand.tf  # noqa: E402

sys.path.insert(0, str(HERE))
from throughput import make_dataset, warm  # noqa: E402

FILES = 16


def make_tfrecords(ds):
    """The samples as tf.train.Example records (image, label) in FILES files."""
    out = ds.parent / "tfrecords"
    if not (out / "done").exists():
        out.mkdir(exist_ok=True)
        writers = [tf.io.TFRecordWriter(str(out / f"part-{i:02d}.tfrecord")) for i in range(FILES)]
        n = 0
        for batch in brand.tf.BrandDataset(ds, batch_size=256, policy="sequential", memory="100%"):
            for data, label in zip(batch["data"].numpy(), batch["label"].numpy()):
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                }))
                writers[n % FILES].write(ex.SerializeToString())
                n += 1
        for w in writers:
            w.close()
        (out / "done").write_text(str(n))
    return out


class Servers:
    """A dispatcher and 2 workers of `python -m brand.tf.service`."""

    def __init__(self):
        self.procs = []
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        d = self._start(["dispatcher", "--port", "0"], env)
        port = re.search(r"localhost:(\d+)", d).group(1)
        self.address = f"grpc://127.0.0.1:{port}"
        for _ in range(2):
            self._start(["worker", "--dispatcher", f"127.0.0.1:{port}", "--port", "0",
                         "--worker-address", "127.0.0.1:%port%"], env)

    def _start(self, args, env):
        p = subprocess.Popen([sys.executable, "-m", "brand.tf.service", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env)
        self.procs.append(p)
        ready = []

        def drain():
            for line in p.stdout:
                if "ready at" in line and not ready:
                    ready.append(line)

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.monotonic() + 120
        while not ready:
            if p.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"brand.tf.service {args[0]} did not start")
            time.sleep(0.1)
        return ready[0]

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def tfrecord_pipeline(files, batch, buffer, seed):
    feature = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    ds = tf.data.Dataset.list_files(str(files / "*.tfrecord"), shuffle=True, seed=seed)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.shuffle(buffer, seed=seed).batch(batch)
    return ds.map(lambda x: tf.io.parse_example(x, feature), num_parallel_calls=tf.data.AUTOTUNE)


def timed(ds, key):
    """Samples/s of one pass over `ds`, and the samples."""
    t = time.perf_counter()
    n = 0
    for el in ds:
        n += int(tf.size(el[key]))
    return n / (time.perf_counter() - t), n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=30000)
    ap.add_argument("--mean-kib", type=float, default=4)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--memory", default="10%", help="brand's budget per loader")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default="/var/tmp/brand-bench/tf-service")
    ap.add_argument("--brand", default=os.environ.get("BRAND_BIN", "brand"))
    ap.add_argument("--out", help="write the rates as JSON here")
    args = ap.parse_args()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ds = make_dataset(work, args.brand, args.samples, args.mean_kib)
    files = make_tfrecords(ds)
    for f in files.glob("*.tfrecord"):
        warm(f)
    buffer = max(1, args.samples // 10)
    splits = 16  # 8 per worker
    servers = Servers()
    try:
        def service(d):
            return d.apply(tf.data.experimental.service.distribute(processing_mode="distributed_epoch",
                                                                   service=servers.address))

        readers = {
            "brand in-process": lambda r: (brand.tf.BrandDataset(ds, batch_size=args.batch_size, seed=r,
                                                                 memory=args.memory), "id"),
            "brand service": lambda r: (service(brand.tf.BrandDataset(ds, batch_size=args.batch_size, seed=r,
                                                                      memory=args.memory, splits=splits)), "id"),
            "tfrecord in-process": lambda r: (tfrecord_pipeline(files, args.batch_size, buffer, r), "label"),
            "tfrecord service": lambda r: (service(tfrecord_pipeline(files, args.batch_size, buffer, r)), "label"),
        }
        rates = {name: [] for name in readers}
        for r in range(args.rounds):
            # Rotate the order each round, so no reader always runs first.
            names = list(readers)
            names = names[r % len(names):] + names[:r % len(names)]
            for name in names:
                d, key = readers[name](r)
                rate, n = timed(d, key)
                if n != args.samples:
                    raise SystemExit(f"{name}: {n} samples in an epoch, expected {args.samples}")
                rates[name].append(rate)
                print(f"round {r} {name:20s} {rate:10.0f} samples/s", flush=True)
    finally:
        servers.close()

    def summary(xs):
        return f"{statistics.median(xs):.0f} [{min(xs):.0f}, {max(xs):.0f}]"

    print(f"\n{args.samples} samples of ~{args.mean_kib:g} KiB, batch {args.batch_size}, {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs; samples/s median [min, max]")
    for name, xs in rates.items():
        print(f"  {name:20s} {summary(xs)}")
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"  brand service / brand in-process       {med['brand service'] / med['brand in-process']:.2f}")
    print(f"  tfrecord service / tfrecord in-process {med['tfrecord service'] / med['tfrecord in-process']:.2f}")
    print(f"  brand service / tfrecord service       {med['brand service'] / med['tfrecord service']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rates": rates}, indent=1) + "\n")


if __name__ == "__main__":
    main()
