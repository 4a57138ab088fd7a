#!/usr/bin/env python3
"""The ids of each TFRecord shard in the order they are stored (disk order),
for the spread of a served order: saves {shard name: ids} to an .npz file.

    tfrecord_order.py SHARD_DIR OUT.npz
"""

import glob
import os
import sys


def main():
    shards, out = sys.argv[1], sys.argv[2]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    per = {}
    for path in sorted(glob.glob(os.path.join(shards, "*.tfrecord"))):
        ds = tf.data.TFRecordDataset(path).batch(1024).map(lambda x: tf.io.parse_example(x, spec)["id"])
        per[os.path.basename(path)] = np.concatenate([b.numpy() for b in ds])
    np.savez(out, **per)


if __name__ == "__main__":
    main()
