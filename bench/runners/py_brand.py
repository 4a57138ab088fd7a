#!/usr/bin/env python3
"""brand's Python package (pip install brand) over the brand pack.

    py_brand.py DATASET --api numpy|torch --memory 10% --policy brand --read-gap auto --batch-size 64 --seed 1

numpy: ``brand.Loader`` iterated directly; each batch's samples as NumPy
arrays (zero-copy views of brand's buffers).
torch: ``brand.torch.BrandDataset(batched=True)`` through a
``torch.utils.data.DataLoader(batch_size=None)`` (num_workers 0: brand's own
threads read; a worker process would only add a copy), samples as uint8
tensors (zero-copy).

Useful bytes are the samples' lengths, as `brand read` counts them.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    ap.add_argument("--api", choices=["numpy", "torch"], required=True)
    ap.add_argument("--memory", default="10%")
    ap.add_argument("--policy", default="brand")
    ap.add_argument("--read-gap", default="auto")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    config = dict(batch_size=a.batch_size, memory=a.memory, policy=a.policy, read_gap=a.read_gap, seed=a.seed)
    import numpy as np

    if a.api == "numpy":
        import brand

        source = brand.Loader(a.dataset, **config)

        def count(batch):
            samples = batch.samples
            ids.append(batch.ids)
            return len(samples), sum(s.nbytes for s in samples)
    else:
        import torch.utils.data

        import brand.torch

        ds = brand.torch.BrandDataset(a.dataset, batched=True, **config)
        source = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)

        def count(batch):
            data = batch["data"]
            ids.append(batch["id"].numpy())
            return len(data), sum(t.numel() for t in data)

    ids = []
    common.ready_and_wait()
    ep = common.Epoch().consume(source, count)
    flat = np.sort(np.concatenate(ids)) if ids else np.array([])
    once = bool((np.arange(len(flat)) == flat).all())
    common.say({"result": ep.result(exactly_once=once, api=a.api)})


if __name__ == "__main__":
    common.main_guard(main)
