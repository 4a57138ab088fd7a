#!/usr/bin/env python3
"""One epoch of a peer loader reading from S3 (bench/objstore.py's runner).

    objstore_peer.py LOADER --endpoint URL --out IDS.npy [--cache DIR] [--seed S]
                     [--workers 8] [--batch 64] [--shuffle-buffer N]

LOADER: s3map (s3torchconnector S3MapDataset, one object per sample, DataLoader
shuffle), s3iter (s3torchconnector S3IterableDataset over tar shards, shard order
shuffled, webdataset's tarfile_to_samples + shuffle buffer), mds (MosaicML
Streaming StreamingDataset over MDS shards, local cache), litdata (LitData
StreamingDataset over its optimized chunks, local cache). Every sample is
`{id: int, data: bytes}`; the ids served, in order, go to IDS.npy.

Protocol (runners/common.py): imports, then `ready`, waits for `go`; the clock
starts at `go`, before the dataset object is made (its listing or index GET
counts), so `first_batch_s` is go → first batch.
"""

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

REGION = "us-east-1"



def one_epoch(loader, t0: float):
    """Iterates `loader` once: the ids served in order, their bytes, and the seconds from `t0` to
    the first batch and to the end."""
    ids, nbytes, first = [], 0, None
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        for item in batch:
            ids.append(int(item["id"]))
            nbytes += len(item["data"])
    return ids, nbytes, first, time.perf_counter() - t0

def collate(batch):
    # LitData hands out memoryviews (zero-copy views of its chunk), which cannot cross the worker
    # queue: copy them into bytes in the worker, as any consumer would.
    for item in batch:
        if isinstance(item["data"], memoryview):
            item["data"] = bytes(item["data"])
    return batch


def s3map(a):
    from s3torchconnector import S3ClientConfig, S3MapDataset
    from torch.utils.data import DataLoader

    def make():
        # from_prefix listed nothing from this server (len 0); the URIs come from boto3's listing.
        ds = S3MapDataset.from_objects(list_keys(a, "s3map", "samples/"), region=REGION, endpoint=a.endpoint,
                                       s3client_config=S3ClientConfig(force_path_style=True),
                                       transform=to_item)
        g = __import__("torch").Generator()
        g.manual_seed(a.seed)
        return DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers, collate_fn=collate,
                          generator=g)
    return make


def list_keys(a, bucket, prefix):
    import boto3

    s3 = boto3.client("s3", endpoint_url=a.endpoint, region_name=REGION)
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", [])]
    return sorted(keys)


def to_item(obj):
    return {"id": int(obj.key.rsplit("/", 1)[1].split(".")[0]), "data": obj.read()}


def s3iter(a):
    import webdataset as wds
    from s3torchconnector import S3ClientConfig, S3IterableDataset
    from torch.utils.data import DataLoader
    from webdataset.tariterators import group_by_keys, tar_file_expander

    def tar_stream(obj):
        return {"url": obj.key, "stream": obj}

    def tar_samples(src):
        # webdataset's tarfile_to_samples without its url_opener: the stream is the S3 reader.
        return group_by_keys(tar_file_expander(src))

    def make():
        keys = list_keys(a, "s3tar", "shards/")
        random.Random(a.seed).shuffle(keys)
        ds = S3IterableDataset.from_objects(keys, region=REGION, endpoint=a.endpoint,
                                            s3client_config=S3ClientConfig(force_path_style=True),
                                            enable_sharding=True, transform=tar_stream)
        per_worker = max(1, a.shuffle_buffer // max(1, a.workers))
        pipe = wds.DataPipeline(ds, tar_samples, wds.shuffle(per_worker, initial=per_worker),
                                wds.map(lambda s: {"id": int(s["__key__"]), "data": s["bin"]}))
        return DataLoader(pipe, batch_size=a.batch, num_workers=a.workers, collate_fn=collate)
    return make


def mds(a):
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()

    def make():
        ds = StreamingDataset(remote="s3://mds/ds", local=a.cache, shuffle=True, shuffle_seed=a.seed,
                              batch_size=a.batch)
        return DataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=collate)
    return make


def litdata(a):
    import litdata.streaming.downloader as dl
    from litdata import StreamingDataLoader, StreamingDataset

    # LitData builds obstore's S3Store from the boto3 client's endpoint but with its own client
    # options, which do not allow plain HTTP ("HTTP error: builder error" on every chunk GET from
    # http://...). A test-endpoint artefact (real S3 is HTTPS): allow it, nothing else changed.
    dl._OBSTORE_CLIENT_OPTIONS = {**(dl._OBSTORE_CLIENT_OPTIONS or {}), "allow_http": True}

    def make():
        ds = StreamingDataset("s3://litdata/ds", cache_dir=a.cache, shuffle=True, seed=a.seed,
                              storage_options={"endpoint_url": a.endpoint, "region_name": REGION})
        return StreamingDataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=collate)
    return make


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loader", choices=["s3map", "s3iter", "mds", "litdata"])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--shuffle-buffer", type=int, default=1000)
    a = ap.parse_args()
    os.environ["AWS_ENDPOINT_URL"] = a.endpoint
    os.environ["S3_ENDPOINT_URL"] = a.endpoint  # MosaicML Streaming's variable
    import numpy as np

    make = {"s3map": s3map, "s3iter": s3iter, "mds": mds, "litdata": litdata}[a.loader](a)
    common.ready_and_wait()
    t0 = time.perf_counter()
    ids, nbytes, first, secs = one_epoch(make(), t0)
    np.save(a.out, np.asarray(ids, dtype=np.int64))
    common.say({"samples": len(ids), "bytes": nbytes, "seconds": secs, "first_batch_s": first})


if __name__ == "__main__":
    common.main_guard(main)
