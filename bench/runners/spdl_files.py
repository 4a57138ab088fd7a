#!/usr/bin/env python3
"""SPDL's pipeline over the ImageFolder files.

Source: a shuffled list of sample indices; one stage reads each file
(open/read/close, `concurrency` tasks on the pipeline's thread pool); samples
are aggregated into batches. Threads, not processes (SPDL's design).

    spdl_files.py FILES_DIR --threads 8 --batch-size 64 --seed 1
"""

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    from spdl.pipeline import PipelineBuilder

    items = common.list_files(a.files)
    order = list(range(len(items)))
    random.Random(a.seed).shuffle(order)

    def load(i):
        path, label = items[i]
        return i, label, common.read_file(path)

    pipeline = (
        PipelineBuilder()
        .add_source(order)
        .pipe(load, concurrency=a.threads)
        .aggregate(a.batch_size)
        .add_sink(4)
        .build(num_threads=a.threads)
    )
    seen = bytearray(len(items))

    def count(batch):
        for i, _label, _data in batch:
            seen[i] += 1
        return len(batch), sum(len(d) for _i, _l, d in batch)

    common.ready_and_wait()
    with pipeline.auto_stop():
        ep = common.Epoch().consume(pipeline.get_iterator(), count)
    common.say({"result": ep.result(exactly_once=all(s == 1 for s in seen), threads=a.threads)})


if __name__ == "__main__":
    common.main_guard(main)
