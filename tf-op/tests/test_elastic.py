"""Elastic resume of TF iterator checkpoints: a world of 3 ranks (or 3 brand
nodes, each its own process on 127.0.0.1) reads k batches and saves
tf.train.Checkpoints; a world of 2 continues from all 3 checkpoints with the
same total memory. Every sample of the epoch exactly once, bytes equal to the
sources."""

import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import brand
import brand.tf
from brand.tf import BrandDataset
from conftest import SAMPLES

BATCH = 10
# Equal total memory: 3 x 16 slots = 2 x 24 slots.
MEMORY = {3: "16 slots", 2: "24 slots"}


def digests(el):
    return [(i, hashlib.sha256(d).hexdigest()) for i, d in zip(el["id"].numpy().tolist(),
                                                                 el["data"].numpy().tolist())]


def check_once(seen, small_bytes):
    ids = [i for i, _ in seen]
    assert sorted(ids) == list(range(SAMPLES)), f"{len(ids)} served, {len(set(ids))} distinct"
    for i, d in seen:
        assert d == hashlib.sha256(small_bytes[i]).hexdigest(), f"sample {i}"


@pytest.mark.parametrize("k", [0, 1, 3])
def test_three_ranks_resume_as_two(small_ds, small_bytes, tmp_path, k):
    seen, states = [], []
    for r in range(3):
        it = iter(BrandDataset(small_ds, batch_size=BATCH, memory=MEMORY[3], rank=r, world=3, read_gap="whole"))
        for _ in range(k):
            seen += digests(next(it))
        prefix = tf.train.Checkpoint(iterator=it).save(str(tmp_path / f"rank{r}" / "ckpt"))
        if k == 0:
            # Saved before its first element: nothing to resume from.
            with pytest.raises(brand.InvalidStateError, match="before its first element"):
                brand.tf.saved_state(prefix)
            continue
        states.append(brand.tf.saved_state(tmp_path / f"rank{r}"))  # the directory: its latest checkpoint
        assert len(states[-1]) == brand.CHECKPOINT_BYTES
    if k == 0:
        return
    for r in range(2):
        for el in BrandDataset(small_ds, batch_size=BATCH, memory=MEMORY[2], rank=r, world=2, read_gap="whole",
                               resume_world=states):
            seen += digests(el)
    check_once(seen, small_bytes)


def test_a_missing_rank_or_other_total_memory_is_refused(small_ds, tmp_path):
    states = []
    for r in range(3):
        it = iter(BrandDataset(small_ds, batch_size=BATCH, memory=MEMORY[3], rank=r, world=3, read_gap="whole"))
        next(it)
        states.append(brand.tf.saved_state(tf.train.Checkpoint(iterator=it).write(str(tmp_path / f"r{r}"))))
    with pytest.raises(tf.errors.FailedPreconditionError, match="resume_world"):
        next(iter(BrandDataset(small_ds, batch_size=BATCH, memory=MEMORY[2], rank=0, world=2,
                               resume_world=states[:2])))
    with pytest.raises(tf.errors.FailedPreconditionError, match="memory"):
        next(iter(BrandDataset(small_ds, batch_size=BATCH, memory="16 slots", rank=0, world=2,
                               resume_world=states)))


def test_a_per_sample_checkpoint_inside_a_batch_is_refused(small_ds, tmp_path):
    it = iter(BrandDataset(small_ds, memory=MEMORY[3], rank=0, world=3))  # one element per sample
    for _ in range(3):
        next(it)
    prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    with pytest.raises(brand.StateMismatchError, match="inside a brand batch"):
        brand.tf.saved_state(prefix)
    with pytest.raises(brand.NotFoundError, match="no iterator saved as 'data'"):
        brand.tf.saved_state(prefix, key="data")


# One node of a multi-node job (its own process): reads K batches then saves
# its iterator (save), or continues from every old node's checkpoint (resume).
NODE = textwrap.dedent(
    """
    import hashlib, json, sys
    import tensorflow as tf
    import brand.tf

    path, rank, nodes, memory, mode, arg, out = sys.argv[1:8]
    nodes = json.loads(nodes)
    config = "peer_timeout = \\"60s\\"\\nremote_memory = \\"1MiB\\"\\nnodes = " + json.dumps(nodes) + "\\n"
    kw = dict(batch_size=10, memory=memory, read_gap="whole", rank=int(rank), config=config)
    seen = []
    def take(el):
        seen.extend([i, hashlib.sha256(d).hexdigest()]
                    for i, d in zip(el["id"].numpy().tolist(), el["data"].numpy().tolist()))
    if mode == "save":
        it = iter(brand.tf.BrandDataset(path, **kw))
        for _ in range(int(arg)):
            take(next(it))
        tf.train.Checkpoint(iterator=it).write(out + ".ckpt/ckpt")
        del it  # the node closes after k batches (says goodbye to its peers)
    else:
        states = [brand.tf.saved_state(p) for p in json.loads(arg)]
        for el in brand.tf.BrandDataset(path, resume_world=states, **kw):
            take(el)
    json.dump(seen, open(out, "w"))
    """
)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_nodes(script, small_ds, world, mode, arg, tmp_path, name):
    nodes = [f"127.0.0.1:{p}" for p in free_ports(world)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    procs = []
    for r in range(world):
        out = tmp_path / f"{name}{r}.json"
        procs.append((subprocess.Popen([sys.executable, script, small_ds, str(r), json.dumps(nodes), MEMORY[world],
                                        mode, arg, out], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT), out))
    results = []
    try:
        for p, out in procs:
            log, _ = p.communicate(timeout=240)
            assert p.returncode == 0, log.decode(errors="replace")[-4000:]
            results.append((json.loads(out.read_text()), out))
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def test_three_nodes_resume_as_two_nodes(small_ds, small_bytes, tmp_path):
    script = tmp_path / "node.py"
    script.write_text(NODE)
    saved = run_nodes(script, small_ds, 3, "save", "2", tmp_path, "old")
    seen = [tuple(x) for r, _ in saved for x in r]
    assert len(seen) == 3 * 2 * BATCH
    prefixes = [str(out) + ".ckpt/ckpt" for _, out in saved]
    resumed = run_nodes(script, small_ds, 2, "resume", json.dumps(prefixes), tmp_path, "new")
    seen += [tuple(x) for r, _ in resumed for x in r]
    check_once(seen, small_bytes)
