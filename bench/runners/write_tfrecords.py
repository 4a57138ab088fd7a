#!/usr/bin/env python3
"""Writes the ImageFolder's samples as TFRecord shards of tf.train.Example
{image: bytes, label: int64, id: int64}, the way ImageNet's shards are made.

    write_tfrecords.py FILES_DIR OUT_DIR --shards 16 [--order shuffled|source] [--seed 7]

`id` is the sample's position in the sorted listing. `--order shuffled`
writes the samples in a seeded random order (the usual preprocessing);
`source` keeps the listing's order (class by class). Written into
OUT_DIR.tmp and renamed when complete.
"""

import argparse
import os
import random
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files")
    ap.add_argument("out")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--order", choices=["shuffled", "source"], default="shuffled")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    items = list(enumerate(common.list_files(a.files)))
    if a.order == "shuffled":
        random.Random(a.seed).shuffle(items)
    tmp = a.out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    per = -(-len(items) // a.shards)
    for s in range(a.shards):
        part = items[s * per:(s + 1) * per]
        if not part:
            break
        with tf.io.TFRecordWriter(os.path.join(tmp, f"shard-{s:05d}-of-{a.shards:05d}.tfrecord")) as w:
            for i, (path, label) in part:
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[common.read_file(path)])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                }))
                w.write(ex.SerializeToString())
    shutil.rmtree(a.out, ignore_errors=True)
    os.rename(tmp, a.out)
    common.say({"result": {"samples": len(items), "shards": a.shards}})


if __name__ == "__main__":
    common.main_guard(main)
