"""brand.torch under torchrun: 3 ranks (gloo, an all-reduce per step) take the
same number of steps on an uneven sample count, with 0 and 2 DataLoader
workers, and never hang; padding repeats like DistributedSampler's, and
drop_last leaves the tail out instead. At brand's defaults (``memory="10%"``,
batches of 256) a small dataset works with workers too (issue 54).

torchrun runs in a network namespace of its own (``unshare --net``, only a
loopback), so its rendezvous store listens nowhere else."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import shlex
import textwrap
from typing import Optional

import pytest

from conftest import make_dataset

SAMPLES = 1001  # uneven for 3 ranks and for 3 x 2 workers
RANKS = 3
BATCH = 7

TRAIN = textwrap.dedent("""
    import datetime, json, os, sys
    import torch, torch.distributed as dist
    import brand.torch

    path, workers, config, batch, out = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    ds = brand.torch.BrandDataset(path, **config)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers,
                                         collate_fn=lambda items: [int(i["id"]) for i in items])
    ids, steps = [], 0
    for batch in loader:
        ids.extend(batch)
        steps += 1
        # What DDP does each step: every rank must arrive, or all hang.
        dist.all_reduce(torch.ones(1))
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, {"steps": steps, "ids": ids})
    if rank == 0:
        with open(out, "w") as f:
            json.dump(every, f)
    dist.destroy_process_group()
""")


def torchrun(tmp_path: pathlib.Path, ds: pathlib.Path, workers: int, drop_last: bool = False,
             config: Optional[dict] = None, batch: int = BATCH) -> list[dict]:
    """``config``: BrandDataset's keywords (default: seed 3, batches of 16, ``drop_last``)."""
    config = config if config is not None else dict(seed=3, batch_size=16, drop_last=drop_last)
    script, out = tmp_path / "train.py", tmp_path / f"out-{workers}-{int(drop_last)}.json"
    script.write_text(TRAIN)
    torchrun = pathlib.Path(sys.executable).parent / "torchrun"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("unshare (util-linux) and ip (iproute2) are needed to run torchrun in a namespace of its own")
    cmd = (f"ip link set lo up && exec {torchrun} --standalone --nproc-per-node={RANKS} "
           f"{script} {ds} {workers} {shlex.quote(json.dumps(config))} {batch} {out}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        run = subprocess.run(["unshare", "--net", "sh", "-c", cmd], env=env, capture_output=True, text=True,
                             timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun hung (240 s): {(e.stderr or b'')[-2000:]!r}")
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("brand-torchrun"), samples=SAMPLES, seed=6)[1]


def assert_equal_steps_every_sample_padded(every: list[dict], samples: int, workers: int) -> None:
    """Every rank took the same steps, every sample came, and each of the
    3 × max(workers, 1) brand ranks served ceil(N / ranks) (padding repeats)."""
    steps = [r["steps"] for r in every]
    assert len(set(steps)) == 1 and steps[0] > 0, steps
    ids = [i for r in every for i in r["ids"]]
    assert set(ids) == set(range(samples))
    ranks = RANKS * max(workers, 1)
    assert len(ids) == -(-samples // ranks) * ranks, len(ids)


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_take_equal_steps_and_padding_repeats_the_fewest_samples(uneven, tmp_path, workers):
    every = torchrun(tmp_path, uneven, workers, drop_last=False)
    assert_equal_steps_every_sample_padded(every, SAMPLES, workers)


def test_drop_last_serves_no_sample_twice_and_leaves_out_only_the_tail(uneven, tmp_path):
    every = torchrun(tmp_path, uneven, 2, drop_last=True)
    steps = [r["steps"] for r in every]
    assert len(set(steps)) == 1 and steps[0] > 0, steps
    ids = [i for r in every for i in r["ids"]]
    assert len(ids) == len(set(ids)), "a sample was served twice"
    ranks = RANKS * 2
    assert len(ids) == SAMPLES // ranks * ranks


# Issue 54: 2,401 samples packed at brand's defaults (chunks of 64), and
# BrandDataset at its own (memory "10%", batches of 256): 240 slots a rank,
# 120 for each of 2 workers, less than two batches; the internal batches
# shrink to fit, as they did not when memory became the process's.
DEFAULT_SAMPLES = 2401


@pytest.fixture(scope="module")
def small_at_defaults(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("brand-defaults"), samples=DEFAULT_SAMPLES, seed=7,
                        chunk_size=None)[1]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_small_dataset_at_the_defaults_serves_every_sample_with_equal_steps(small_at_defaults, tmp_path, workers):
    every = torchrun(tmp_path, small_at_defaults, workers, config=dict(memory="10%", seed=7), batch=8)
    assert_equal_steps_every_sample_padded(every, DEFAULT_SAMPLES, workers)
