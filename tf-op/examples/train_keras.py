#!/usr/bin/env python3
"""Trains a small Keras CNN from a packed brand dataset of PNG images.

    # a packed ImageFolder of PNGs (e.g. `brand gen --images`, then `brand pack`):
    python tf-op/examples/train_keras.py TRAIN_DS --test TEST_DS --epochs 4

    # or make one here (class-dependent 32x32 patterns, written with TF) and pack it:
    python tf-op/examples/train_keras.py --make-data /tmp/shapes --brand target/release/brand

The input pipeline is BrandDataset with whole batches (one op call per
batch), decoded with tf.io.decode_png. BrandDataset(epochs=E) emits E epochs,
each in its own order, and brand's batches never span epochs, so Keras's
epochs line up with brand's: steps_per_epoch = cardinality / E.

Prints the test accuracy (chance is 1 / classes).
"""

import argparse
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

import brand.tf

IMAGE = 32
CLASSES = 5


def make_images(root, samples, seed, classes=CLASSES):
    """An ImageFolder of `samples` 32x32 RGB PNGs, root/class-CCCC/img-N.png.

    Each class is a shape (horizontal stripes, vertical stripes, diagonal
    stripes, checkerboard, a centred square) in a random colour on a noisy
    background, so colour alone does not tell the class: a CNN has to see
    the pattern.
    """
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:IMAGE, 0:IMAGE]
    period = 8
    masks = [
        (y % period) < period // 2,
        (x % period) < period // 2,
        ((x + y) % period) < period // 2,
        ((x // 4 + y // 4) % 2) == 0,
        (abs(x - IMAGE / 2 + 0.5) < 8) & (abs(y - IMAGE / 2 + 0.5) < 8),
    ][:classes]
    for c in range(classes):
        (root / f"class-{c:04d}").mkdir(parents=True, exist_ok=True)
    labels = rng.integers(0, classes, samples)
    for i, c in enumerate(labels):
        # Random phase shifts keep the patterns from being one fixed image.
        mask = np.roll(masks[c], (rng.integers(0, 4), rng.integers(0, 4)), axis=(0, 1))
        fg = rng.integers(60, 256, 3)
        bg = rng.integers(0, 120, 3)
        img = np.where(mask[..., None], fg, bg) + rng.normal(0, 25, (IMAGE, IMAGE, 3))
        png = tf.io.encode_png(np.clip(img, 0, 255).astype(np.uint8)).numpy()
        (root / f"class-{c:04d}" / f"img-{i:06d}.png").write_bytes(png)
    return labels


def make_data(out, brand, train=1500, test=500, seed=0):
    """Train and test datasets packed from freshly made PNGs; returns their paths."""
    paths = []
    for name, n, s in (("train", train, seed), ("test", test, seed + 1)):
        files, ds = out / f"{name}-png", out / name
        make_images(files, n, s)
        # Small chunks: a small dataset then still has many chunks to shuffle.
        pack = [brand, "pack", str(files), "-o", str(ds), "--seed", str(s), "--chunk-size", "16", "--force"]
        subprocess.run(pack, check=True, stdout=subprocess.DEVNULL)
        paths.append(ds)
    return paths


def decode_batch(batch):
    """A brand batch (PNG bytes, labels) as float images and labels."""

    def decode(png):
        img = tf.io.decode_png(png, channels=3)
        # Images of another size (brand gen --images may choose one) are resized.
        return tf.image.resize(img, (IMAGE, IMAGE))

    images = tf.map_fn(decode, batch["data"], fn_output_signature=tf.TensorSpec((IMAGE, IMAGE, 3), tf.float32))
    return images / 255.0, batch["label"]


def model(classes):
    return tf.keras.Sequential([
        tf.keras.Input((IMAGE, IMAGE, 3)),
        tf.keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(classes),
    ])


def train(train_ds, test_ds=None, *, epochs=4, batch_size=32, memory="25%", classes=CLASSES, seed=0, verbose=2):
    """Trains; returns (train accuracy of the last epoch, test accuracy or None)."""
    tf.keras.utils.set_random_seed(seed)
    ds = brand.tf.BrandDataset(train_ds, batch_size=batch_size, epochs=epochs, memory=memory, seed=seed)
    steps = int(ds.cardinality()) // epochs  # batches per brand epoch (the last one partial)
    pipeline = ds.map(decode_batch, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    m = model(classes)
    m.compile(
        optimizer=tf.keras.optimizers.Adam(3e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    # shuffle=False: the order is brand's (Keras cannot shuffle a tf.data pipeline anyway).
    hist = m.fit(pipeline, epochs=epochs, steps_per_epoch=steps, shuffle=False, verbose=verbose)
    train_acc = float(hist.history["accuracy"][-1])
    test_acc = None
    if test_ds is not None:
        # One pass in file order: an evaluation needs no shuffle.
        test = brand.tf.BrandDataset(test_ds, batch_size=batch_size, policy="sequential", memory=memory)
        _, test_acc = m.evaluate(test.map(decode_batch), verbose=0)
        test_acc = float(test_acc)
    return train_acc, test_acc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("train", nargs="?", type=Path, help="packed training dataset")
    ap.add_argument("--test", type=Path, help="packed test dataset")
    ap.add_argument("--make-data", type=Path, metavar="DIR", help="make PNG train/test datasets in DIR and use them")
    ap.add_argument("--brand", default=os.environ.get("BRAND_BIN", "target/release/brand"), help="brand CLI")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--memory", default="25%")
    ap.add_argument("--classes", type=int, default=CLASSES)
    args = ap.parse_args()
    if args.make_data:
        args.train, args.test = make_data(args.make_data, args.brand)
    if args.train is None:
        ap.error("give a training dataset or --make-data DIR")
    t0 = time.monotonic()
    train_acc, test_acc = train(args.train, args.test, epochs=args.epochs, batch_size=args.batch_size,
                                memory=args.memory, classes=args.classes)
    print(f"train accuracy {train_acc:.3f} after {args.epochs} epochs ({time.monotonic() - t0:.1f} s)")
    if test_acc is not None:
        print(f"test accuracy {test_acc:.3f} (chance {1 / args.classes:.3f})")


if __name__ == "__main__":
    main()
