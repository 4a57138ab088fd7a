#!/usr/bin/env python3
"""tf.data over the TFRecord shards: the usual recipe.

list of shards (shuffled) -> interleave(TFRecordDataset, parallel) ->
shuffle(buffer) -> batch -> parse_example -> prefetch. The shuffle buffer
holds `--buffer` samples: the harness sizes it to the memory budget.

    tf_tfrecord.py SHARD_DIR --buffer 400 --batch-size 64 --seed 1
"""

import argparse
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shards")
    ap.add_argument("--buffer", type=int, required=True)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--cycle-length", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--samples", type=int, default=None, help="expected samples (ids 0..N-1)")
    ap.add_argument("--order-out", default=None, help="save the served ids, in order, to this .npy file")
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    shards = sorted(glob.glob(os.path.join(a.shards, "*.tfrecord")))
    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(x):
        f = tf.io.parse_example(x, features)
        return f["id"], tf.reduce_sum(tf.strings.length(f["image"], unit="BYTE"))

    ds = (
        tf.data.Dataset.from_tensor_slices(shards)
        .shuffle(len(shards), seed=a.seed)
        .interleave(lambda f: tf.data.TFRecordDataset(f, buffer_size=1 << 20),
                    cycle_length=min(a.cycle_length, len(shards)), block_length=1,
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        .shuffle(max(1, a.buffer), seed=a.seed)
        .batch(a.batch_size)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    ids = []

    def count(batch):
        i, nbytes = batch
        i = i.numpy()
        ids.append(i)
        return len(i), int(nbytes)

    common.ready_and_wait()
    ep = common.Epoch().consume(ds, count)
    import numpy as np

    order = np.concatenate(ids) if ids else np.array([], dtype=np.int64)
    if a.order_out:
        np.save(a.order_out, order)
    flat = np.sort(order)
    once = bool(len(flat) == (a.samples or len(flat)) and (np.arange(len(flat)) == flat).all())
    common.say({"result": ep.result(exactly_once=once, buffer=a.buffer, shards=len(shards))})


if __name__ == "__main__":
    common.main_guard(main)
