#!/usr/bin/env python3
"""Several epochs of a peer loader reading from S3 through its local cache (bench/tier.py's runner).

    tier_peer.py LOADER --endpoint URL --out-prefix IDS --cache DIR [--epochs 3]
                 [--cache-limit BYTES|none] [--seed S] [--workers 2] [--batch 64]

LOADER: mds (MosaicML Streaming StreamingDataset over MDS shards, remote=s3://mds/ds,
local=DIR, shuffle=True, cache_limit=BYTES: its LRU shard eviction; predownload left at
its default) or litdata (LitData StreamingDataset over its optimized chunks, cache_dir=DIR,
max_cache_size=BYTES). One dataset object and one DataLoader for the whole run, iterated
--epochs times (how both are used: the local cache persists across the run's epochs).
Each epoch's served ids go to IDS-e<E>.npy.

Protocol (runners/common.py's tags): imports, then `ready`; then for each epoch it waits
for `go` on stdin, reads the epoch and prints one tagged line
`{"epoch": E, "samples", "bytes", "seconds", "first_batch_s", "cache_bytes"}`: the harness
snapshots the server's counters between epochs (the next epoch's reads start only at its
`go`; DataLoader workers are not persistent, so nothing is read ahead across epochs).
The first epoch's clock includes making the dataset object (index GET), as in
objstore_peer.py.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from objstore_peer import REGION, collate, one_epoch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from objstore import dir_bytes  # noqa: E402


def mds(a):
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()

    def make():
        ds = StreamingDataset(remote="s3://mds/ds", local=a.cache, shuffle=True, shuffle_seed=a.seed,
                              batch_size=a.batch, cache_limit=a.cache_limit)
        return DataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=collate)
    return make


def litdata(a):
    import litdata.streaming.downloader as dl
    from litdata import StreamingDataLoader, StreamingDataset

    # As objstore_peer.py: obstore's client options must allow the plain-HTTP test endpoint.
    dl._OBSTORE_CLIENT_OPTIONS = {**(dl._OBSTORE_CLIENT_OPTIONS or {}), "allow_http": True}

    def make():
        kw = {"max_cache_size": a.cache_limit} if a.cache_limit is not None else {}
        ds = StreamingDataset("s3://litdata/ds", cache_dir=a.cache, shuffle=True, seed=a.seed,
                              storage_options={"endpoint_url": a.endpoint, "region_name": REGION}, **kw)
        return StreamingDataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=collate)
    return make


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loader", choices=["mds", "litdata"])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--out-prefix", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--cache-limit", default="none")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    a.cache_limit = None if a.cache_limit == "none" else int(a.cache_limit)
    os.environ["AWS_ENDPOINT_URL"] = a.endpoint
    os.environ["S3_ENDPOINT_URL"] = a.endpoint  # MosaicML Streaming's variable
    import numpy as np

    make = {"mds": mds, "litdata": litdata}[a.loader](a)
    common.ready_and_wait()
    loader = None
    for epoch in range(a.epochs):
        if epoch > 0:
            line = sys.stdin.readline()
            if line.strip() != "go":
                return
        t0 = time.perf_counter()
        if loader is None:
            loader = make()
        ids, nbytes, first, secs = one_epoch(loader, t0)
        np.save(f"{a.out_prefix}-e{epoch}.npy", np.asarray(ids, dtype=np.int64))
        common.say({"epoch": epoch, "samples": len(ids), "bytes": nbytes, "seconds": secs, "first_batch_s": first,
                    "cache_bytes": dir_bytes(a.cache)})


if __name__ == "__main__":
    common.main_guard(main)
