#!/usr/bin/env python3
"""tf.data over the ImageFolder files: list_files (shuffled) -> read_file
(parallel) -> batch -> prefetch.

    tf_files.py FILES_DIR --batch-size 64 --seed 1
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    pattern = os.path.join(a.files, "*", "*")

    def load(path):
        return path, tf.io.read_file(path)

    def sizes(paths, data):
        return paths, tf.reduce_sum(tf.strings.length(data, unit="BYTE"))

    ds = (
        tf.data.Dataset.list_files(pattern, shuffle=True, seed=a.seed)
        .map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        .batch(a.batch_size)
        .map(sizes)
        .prefetch(tf.data.AUTOTUNE)
    )
    seen = set()
    total = 0

    def count(batch):
        nonlocal total
        paths, nbytes = batch
        p = paths.numpy()
        seen.update(p)
        total += len(p)
        return len(p), int(nbytes)

    common.ready_and_wait()
    ep = common.Epoch().consume(ds, count)
    common.say({"result": ep.result(exactly_once=len(seen) == total)})


if __name__ == "__main__":
    common.main_guard(main)
