"""A tf.distribute multi-worker job (2 worker processes on 127.0.0.1, CPU,
TF_CONFIG, MultiWorkerMirroredStrategy) with BrandDataset unchanged: each
worker's dataset is a brand node, and the two serve each epoch exactly once
with the source's bytes."""

import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap

from conftest import SAMPLES

# brand listens on each TF port + this (the default tf_port_offset).
TF_PORT_OFFSET = 1000

WORKER = textwrap.dedent(
    """
    import hashlib, json, os, sys
    import tensorflow as tf
    tf.config.set_visible_devices([], "GPU")
    from brand.tf import BrandDataset

    path, out = sys.argv[1], sys.argv[2]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # A collective across both workers: the strategy's cluster really runs.
    workers = strategy.reduce(
        tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1)), axis=None
    )
    ds = BrandDataset(path, memory="32 slots", batch_size=16, read_gap="whole", epochs=2,
                      config='peer_timeout = "60s"\\nremote_memory = "1MiB"')
    seen = []
    for el in ds:
        for i, d in zip(el["id"].numpy().tolist(), el["data"].numpy().tolist()):
            seen.append([i, hashlib.sha256(d).hexdigest()])
    json.dump({"workers": int(workers), "seen": seen}, open(out, "w"))
    """
)


def free_tf_ports(n):
    """`n` loopback ports free for TF, each with its brand port (+ offset) free too."""
    ports, held = [], []
    while len(ports) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        held.append(s)
        if p + TF_PORT_OFFSET > 65535 or any(abs(p - q) == TF_PORT_OFFSET for q in ports):
            continue
        t = socket.socket()
        try:
            t.bind(("127.0.0.1", p + TF_PORT_OFFSET))
        except OSError:
            continue
        held.append(t)
        ports.append(p)
    for s in held:
        s.close()
    return ports


def test_two_tf_distribute_workers_serve_each_epoch_exactly_once(small_ds, small_bytes, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ports = free_tf_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for index in range(2):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        out = tmp_path / f"worker{index}.json"
        procs.append((subprocess.Popen([sys.executable, str(script), str(small_ds), str(out)], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT), out))
    results = []
    try:
        for p, out in procs:
            log, _ = p.communicate(timeout=240)
            assert p.returncode == 0, log.decode(errors="replace")[-4000:]
            results.append(json.loads(out.read_text()))
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [r["workers"] for r in results] == [2, 2]
    # Each worker's share: half of each of the 2 epochs (100 = 6 batches of 16 and one of 4).
    for epoch in range(2):
        union = []
        for r in results:
            share = r["seen"][epoch * (SAMPLES // 2):(epoch + 1) * (SAMPLES // 2)]
            assert len(share) == SAMPLES // 2
            for i, digest in share:
                assert digest == hashlib.sha256(small_bytes[i]).hexdigest(), f"sample {i}"
            union.extend(i for i, _ in share)
        assert sorted(union) == list(range(SAMPLES)), f"epoch {epoch}: exactly once across the workers"
    assert all(len(r["seen"]) == SAMPLES for r in results)
