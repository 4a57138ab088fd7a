#!/usr/bin/env python3
"""brand.tf.BrandDataset (the tf.data op of the brand package) over the brand pack.

Whole batches (batch_size=B: one op call per batch); every sample's bytes
are copied into the batch's string tensor.

    tf_brand.py DATASET --memory 10% --policy brand --read-gap auto --batch-size 64 --seed 1
                [--run-length 1|auto|N] [--order-out FILE.npy]

`--order-out` saves the served ids in order (for the order's spread).

brand comes from the bench venv (scripts/bench-venv.sh installs the wheel);
its op was built by the harness (python -m brand.tf build) before any run.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402


def run_length_toml(v):
    """The loader TOML setting `run_length` (None: the default)."""
    if v is None:
        return None
    return f'run_length = "{v}"' if v == "auto" else f"run_length = {int(v)}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    ap.add_argument("--memory", default="10%")
    ap.add_argument("--policy", default="brand")
    ap.add_argument("--read-gap", default="auto")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--run-length", default=None, help="the loader's run_length (1..64 or auto)")
    ap.add_argument("--order-out", default=None, help="save the served ids, in order, to this .npy file")
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import brand.tf

    ds = brand.tf.BrandDataset(a.dataset, batch_size=a.batch_size, epochs=1, memory=a.memory, policy=a.policy,
                               read_gap=a.read_gap, seed=a.seed, config=run_length_toml(a.run_length))
    ds = ds.map(lambda el: (el["id"], tf.reduce_sum(tf.strings.length(el["data"], unit="BYTE"))))
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
    once = bool((np.arange(len(flat)) == flat).all())
    common.say({"result": ep.result(exactly_once=once)})


if __name__ == "__main__":
    common.main_guard(main)
