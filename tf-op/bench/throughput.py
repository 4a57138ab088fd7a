#!/usr/bin/env python3
"""BrandDataset throughput against the C ABI and against tf.data's TFRecordDataset.

    python tf-op/bench/throughput.py [--samples 3000] [--mean-kib 110] [--epochs 4] [--rounds 3]

In one run, on one dataset (made with `brand gen` + `brand pack` if missing):

  C ABI        cpp-examples' brand_throughput (libbrand.a, brand_next per batch),
               --touch first (one byte of each sample: the loader's own speed)
               and --touch all (every byte read once, as a consumer would)
  BrandDataset batched (batch_size=B), iterated eagerly from Python; every
               sample's bytes are copied into the string tensor
  TFRecord     the same samples as tf.train.Example records (image bytes,
               label) in one file: TFRecordDataset -> shuffle(buffer) ->
               batch(B) -> parse_example -> prefetch, the usual tf.data recipe

brand reads with O_DIRECT, so its side reads from the device whatever the
page cache holds; the TFRecord file is read through the page cache (warmed
first). Rates are samples/s over epochs 1.. (epoch 0 pays for opening and
warm-up); rounds alternate the readers so background load on a shared
machine hits all of them. A benchmark, not a test.
"""

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TF_OP = HERE.parent
REPO = TF_OP.parent
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import brand.tf  # noqa: E402


def run(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def make_dataset(work, brand, samples, mean_kib):
    ds = work / f"n{samples}-kib{mean_kib:g}" / "ds"
    if not (ds / "manifest.toml").exists():
        files = ds.parent / "files"
        run("rm", "-rf", ds.parent)
        run(brand, "gen", files, "--samples", samples, "--mean-kib", mean_kib, "--min-kib", max(1, mean_kib / 10),
            "--max-kib", mean_kib * 3, "--classes", 100, "--seed", 1, stdout=subprocess.DEVNULL)
        run(brand, "pack", files, "-o", ds, "--seed", 1, stdout=subprocess.DEVNULL)
        run("rm", "-rf", files)
    return ds


def make_tfrecord(ds):
    path = ds.parent / "samples.tfrecord"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        with tf.io.TFRecordWriter(str(tmp)) as w:
            for batch in brand.tf.BrandDataset(ds, batch_size=256, policy="sequential", memory="100%"):
                for data, label in zip(batch["data"].numpy(), batch["label"].numpy()):
                    ex = tf.train.Example(features=tf.train.Features(feature={
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                    }))
                    w.write(ex.SerializeToString())
        tmp.rename(path)
    return path


def warm(path):
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def c_abi(tool, ds, config, epochs, touch):
    out = run(tool, ds, "--config", config, "--epochs", epochs, "--touch", touch, "--json",
              capture_output=True, text=True).stdout
    rates = [e["samples_per_sec"] for e in json.loads(out)["epochs"]]
    return rates


def timed_epochs(iterator, per_epoch, count):
    """Per-epoch samples/s of `iterator`, whose elements are batches; an epoch
    ends after `per_epoch` batches."""
    rates = []
    t = time.perf_counter()
    n = batches = 0
    for el in iterator:
        n += count(el)
        batches += 1
        if batches == per_epoch:
            now = time.perf_counter()
            rates.append(n / (now - t))
            t, n, batches = now, 0, 0
    return rates


def brand_dataset(ds, batch, epochs, memory, read_gap):
    d = brand.tf.BrandDataset(ds, batch_size=batch, epochs=epochs, memory=memory, read_gap=read_gap)
    per_epoch = int(d.cardinality()) // epochs
    return timed_epochs(d, per_epoch, lambda el: int(el["id"].shape[0]))


def tfrecord(path, samples, batch, epochs, buffer):
    features = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    d = (
        tf.data.TFRecordDataset(str(path), buffer_size=8 << 20)
        .shuffle(buffer, seed=1, reshuffle_each_iteration=True)
        .repeat(epochs)
        .batch(batch)
        .map(lambda x: tf.io.parse_example(x, features), num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    # repeat() then batch(): batches may span epochs; an "epoch" here is
    # samples/batch batches, which is what matters for a rate.
    return timed_epochs(d, samples // batch, lambda el: int(el["label"].shape[0]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--mean-kib", type=float, default=110)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--memory", default="10%", help="brand's memory budget (200%% serves epochs 1.. from memory)")
    ap.add_argument("--read-gap", default="auto")
    ap.add_argument("--shuffle-buffer", type=int, default=1000, help="TFRecord pipeline's shuffle buffer (samples)")
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    ap.add_argument("--brand", type=Path, default=Path(os.environ.get("BRAND_BIN", target / "release" / "brand")))
    ap.add_argument("--throughput", type=Path, default=target / "cpp-examples" / "brand_throughput",
                    help="cpp-examples' brand_throughput (built by cmake if missing)")
    ap.add_argument("--work", type=Path, default=target / "bench-tf")
    args = ap.parse_args()

    if not args.throughput.exists():
        build = args.throughput.parent
        run("cmake", "-S", REPO / "cpp-examples", "-B", build, "-DCMAKE_BUILD_TYPE=Release",
            f"-DBRAND_CARGO_TARGET_DIR={target}", stdout=subprocess.DEVNULL)
        run("cmake", "--build", build, "--target", "brand_throughput", stdout=subprocess.DEVNULL)
    ds = make_dataset(args.work, args.brand, args.samples, args.mean_kib)
    record = make_tfrecord(ds)
    warm(record)
    mean_bytes = sum(f.stat().st_size for f in ds.glob("data-*.brd")) / args.samples
    config = f'batch_size = {args.batch_size}\nmemory = "{args.memory}"\nread_gap = "{args.read_gap}"\n'
    print(f"dataset {ds}: {args.samples} samples, {mean_bytes / 1024:.0f} KiB mean on disk, "
          f"batch {args.batch_size}, memory {args.memory}, read_gap {args.read_gap}, {args.epochs} epochs x "
          f"{args.rounds} rounds; TFRecord shuffle buffer {args.shuffle_buffer}")

    readers = {
        "C ABI (touch first)": lambda: c_abi(args.throughput, ds, config, args.epochs, "first"),
        "C ABI (touch all)": lambda: c_abi(args.throughput, ds, config, args.epochs, "all"),
        "BrandDataset": lambda: brand_dataset(ds, args.batch_size, args.epochs, args.memory, args.read_gap),
        "TFRecordDataset": lambda: tfrecord(record, args.samples, args.batch_size, args.epochs, args.shuffle_buffer),
    }
    results = {name: [] for name in readers}
    for r in range(args.rounds):
        for name, fn in readers.items():
            rates = fn()[1:]  # epoch 0 warms up
            results[name].extend(rates)
            print(f"round {r}: {name:20s} " + " ".join(f"{x:8.0f}" for x in rates), flush=True)

    print(f"\n{'reader':22s} {'samples/s':>10s} {'MB/s':>8s}   (median over epochs 1.. of every round)")
    median = {name: statistics.median(v) for name, v in results.items()}
    for name, m in median.items():
        print(f"{name:22s} {m:10.0f} {m * mean_bytes / 1e6:8.0f}")
    base = median["C ABI (touch first)"]
    print(f"\nBrandDataset / C ABI (touch first): {median['BrandDataset'] / base:.0%}")
    print(f"BrandDataset / C ABI (touch all):   {median['BrandDataset'] / median['C ABI (touch all)']:.0%}")
    print(f"BrandDataset / TFRecordDataset:     {median['BrandDataset'] / median['TFRecordDataset']:.2f}x")


if __name__ == "__main__":
    main()
