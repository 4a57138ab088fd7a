#!/usr/bin/env python3
"""Does the order a loader serves samples in matter for training? (small)

scikit-learn's digits (1,797 real 8x8 handwritten digits, shipped with the
package), split stratified into train and test, the training set sorted by
label: a source in class order, as an ImageFolder or a class-by-class
export is. A small Keras MLP is trained for a few epochs from that source,
fed by

  full-shuffle  the whole training set in memory, shuffled every epoch
  tf-shuffle    TFRecords written in the source's (sorted) order, read by
                tf.data with shuffle(buffer), the buffer = the memory budget
  brand         BrandDataset at the same memory budget (brand pack shuffles
                once when packing; the loader shuffles within the budget)
  no-shuffle    the source order itself (the floor)

and the final test accuracy is reported per seed. Also: distinct labels
per batch in the first epoch (10 = every batch holds every class).

    order_quality.py WORKDIR --brand BRAND_BIN [--budget 0.1] [--epochs 6] [--seeds 1,2,3]
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

BATCH = 32


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--brand", required=True)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--chunk-size", type=int, default=16)
    ap.add_argument("--methods", default="full-shuffle,tf-shuffle,brand,no-shuffle")
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = x.astype(np.uint8)  # 0..16
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.3, stratify=y, random_state=0)
    order = np.argsort(ytr, kind="stable")
    xtr, ytr = xtr[order], ytr[order]
    n = len(ytr)
    buffer = max(1, int(round(a.budget * n)))
    seeds = [int(s) for s in a.seeds.split(",")]
    methods = a.methods.split(",")

    os.makedirs(a.work, exist_ok=True)
    files = os.path.join(a.work, "digits-train")
    shutil.rmtree(files, ignore_errors=True)
    for i, (img, label) in enumerate(zip(xtr, ytr)):
        d = os.path.join(files, f"class-{label:04d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"sample-{i:05d}.bin"), "wb") as f:
            f.write(img.tobytes())
    record = os.path.join(a.work, "digits-train-sorted.tfrecord")
    with tf.io.TFRecordWriter(record) as w:  # the source's order: class by class
        for img, label in zip(xtr, ytr):
            ex = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[img.tobytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }))
            w.write(ex.SerializeToString())

    brand_tf = None
    if "brand" in methods:
        try:
            import brand.tf as brand_tf  # noqa: F811

            brand_tf.load_ops()
        except Exception as e:  # noqa: BLE001
            common.say({"unavailable": {"brand": f"brand.tf: {type(e).__name__}: {e}"[:500]}})
            methods.remove("brand")
            brand_tf = None

    feats = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def decode(images, labels):
        v = tf.reshape(tf.io.decode_raw(images, tf.uint8), (-1, 64))
        return tf.cast(v, tf.float32) / 16.0, labels

    def feed(method, seed, epochs):
        """(dataset yielding (x, y) batches for `epochs` epochs, steps per epoch)."""
        steps = -(-n // BATCH)
        if method == "full-shuffle":
            d = tf.data.Dataset.from_tensor_slices((xtr.astype(np.float32) / 16.0, ytr))
            return d.shuffle(n, seed=seed, reshuffle_each_iteration=True).batch(BATCH).repeat(epochs), steps
        if method == "no-shuffle":
            d = tf.data.Dataset.from_tensor_slices((xtr.astype(np.float32) / 16.0, ytr))
            return d.batch(BATCH).repeat(epochs), steps
        if method == "tf-shuffle":
            d = tf.data.TFRecordDataset(record).shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
            d = d.batch(BATCH).map(lambda s: tf.io.parse_example(s, feats))
            return d.map(lambda f: decode(f["image"], f["label"])).repeat(epochs), steps
        if method == "brand":
            ds = os.path.join(a.work, f"digits-brand-s{seed}")
            subprocess.run([a.brand, "pack", files, "-o", ds, "--seed", str(seed), "--chunk-size",
                            str(a.chunk_size), "--force"], check=True, stdout=subprocess.DEVNULL)
            d = brand_tf.BrandDataset(ds, batch_size=BATCH, epochs=epochs, memory=f"{a.budget * 100:g}%",
                                      seed=seed)
            steps = int(d.cardinality()) // epochs  # brand's batches never span epochs
            return d.map(lambda el: decode(el["data"], el["label"])), steps
        raise ValueError(method)

    def mixing(method, seed):
        d, steps = feed(method, seed, 1)
        distinct = [len(set(labels.numpy().tolist())) for _, labels in d.take(steps)]
        return float(np.mean(distinct))

    def train(method, seed):
        tf.keras.utils.set_random_seed(seed)
        model = tf.keras.Sequential([
            tf.keras.Input((64,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ])
        model.compile(optimizer=tf.keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        d, steps = feed(method, seed, a.epochs)
        model.fit(d, epochs=a.epochs, steps_per_epoch=steps, verbose=0)
        _, acc = model.evaluate(xte.astype(np.float32) / 16.0, yte, verbose=0)
        return float(acc)

    out = {"dataset": "scikit-learn digits", "train": n, "test": len(yte), "classes": 10, "budget": a.budget,
           "shuffle_buffer": buffer, "epochs": a.epochs, "batch_size": BATCH, "seeds": seeds, "methods": {}}
    t0 = time.time()
    for m in methods:
        accs = [train(m, s) for s in seeds]
        out["methods"][m] = {"accuracy": accs, "labels_per_batch": mixing(m, seeds[0])}
    out["seconds"] = time.time() - t0
    common.say({"result": out})


if __name__ == "__main__":
    common.main_guard(main)
