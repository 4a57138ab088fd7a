"""BrandDataset in tf.data service: a dispatcher and two workers, each its own
process on 127.0.0.1 started by `python -m brand.tf.service` (the client is
this process). Dynamic sharding serves every sample once and uses both
workers, each split being brand's plan for one rank of one epoch; OFF serves
the whole epoch on each worker; .repeat(2) under dynamic sharding serves two
epochs in two orders, the same again for the same seed; a worker killed
mid-epoch serves no sample twice; and a worker started without brand's op
gives the error users meet.

Every wait is bounded: servers must say they are ready within START_S, each
test is ended by a watchdog after TEST_S (its stack dump on the terminal),
and the servers die with this process (PR_SET_PDEATHSIG) as well as in
teardown."""

import ctypes
import faulthandler
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

import brand.tf.service as service
from brand.tf import BrandDataset, BuildError
from conftest import make_dataset

# Not a multiple of SPLITS: some splits are shorter (a short rank is padded; a split is not).
SAMPLES = 1203
START_S = 90
TEST_S = 150
# Each split: rank k of a world of SPLITS (100 or 101 samples).
SPLITS = 12
MEMORY = "32 slots"

PLAIN_WORKER = """
import sys
import tensorflow as tf
w = tf.data.experimental.service.WorkerServer(tf.data.experimental.service.WorkerConfig(
    dispatcher_address=sys.argv[1], worker_address="127.0.0.1:%port%", heartbeat_interval_ms=500))
print("plain worker ready", flush=True)
w.join()
"""


def _die_with_parent():
    # SIGKILL this child if pytest dies (the watchdog exits without teardown).
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Server:
    """A child process whose output is drained (a full pipe would block it)
    and kept for failure messages."""

    def __init__(self, argv, ready):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        env.pop(service.SERVICE_ENV, None)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     preexec_fn=_die_with_parent)
        self.lines = []
        self._ready = queue.Queue()
        self._marker = ready
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if self._marker in line:
                self._ready.put(line)
        self._ready.put(None)

    def wait_ready(self):
        try:
            line = self._ready.get(timeout=START_S)
        except queue.Empty:
            line = None
        if line is None:
            raise AssertionError(f"{self.proc.args} not ready in {START_S} s:\n{self.log()}")
        return line

    def log(self):
        return "".join(self.lines)[-4000:]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def ready_port(server):
    line = server.wait_ready()
    m = re.search(r"ready at (?:grpc://)?localhost:(\d+) ", line)
    assert m, line
    return m.group(1)


def brand_service(*args):
    return Server([sys.executable, "-m", "brand.tf.service", *args], "ready at")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def brand_worker(dispatcher, port=0):
    """A brand worker; at a fixed `port` it can be restarted at its address."""
    address = f"127.0.0.1:{port}" if port else "127.0.0.1:%port%"
    return brand_service("worker", "--dispatcher", dispatcher, "--port", str(port), "--worker-address", address,
                         "--heartbeat-ms", "500")


def start_service(worker_ports=(0, 0)):
    """A dispatcher and a brand worker per port; returns (address, [dispatcher, workers...])."""
    dispatcher = brand_service("dispatcher", "--port", "0")
    servers = [dispatcher]
    try:
        address = f"127.0.0.1:{ready_port(dispatcher)}"
        servers.extend(brand_worker(address, port) for port in worker_ports)
        # A worker registers with the dispatcher before it says it is ready.
        for w in servers[1:]:
            w.wait_ready()
    except BaseException:
        for s in servers:
            s.kill()
        raise
    return address, servers


def _terminal(config):
    """The terminal's stderr, which pytest's fd capture saved: a watchdog's
    dump written to the captured fd 2 would vanish with the exit. None if
    this pytest keeps it elsewhere."""
    capman = config.pluginmanager.getplugin("capturemanager")
    err = getattr(getattr(capman, "_global_capturing", None), "err", None)
    fd = getattr(err, "targetfd_save", None)
    return os.fdopen(os.dup(fd), "w") if fd is not None else None


@pytest.fixture(autouse=True)
def watchdog(pytestconfig):
    out = _terminal(pytestconfig)
    faulthandler.dump_traceback_later(TEST_S, exit=True, file=out or sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()
    if out is not None:
        out.close()


@pytest.fixture(scope="module")
def svc_ds(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("service"), SAMPLES, seed=3)


@pytest.fixture(scope="module")
def cluster():
    address, servers = start_service()
    yield address, servers
    for s in servers:
        s.kill()


def tagged(ds):
    """Each element's id and the pid of the process that made it: the map
    runs where the pipeline runs, in a worker."""

    def tag(el):
        stat = tf.io.read_file("/proc/self/stat")
        return {"id": el["id"], "pid": tf.strings.to_number(tf.strings.split(stat, " ")[0], tf.int64)}

    return ds.map(tag)


def run_job(ds, address, mode):
    ds = ds.apply(tf.data.experimental.service.distribute(processing_mode=mode, service=f"grpc://{address}"))
    return [(int(e["id"]), int(e["pid"])) for e in ds.as_numpy_iterator()]


def by_worker(served):
    out = {}
    for i, pid in served:
        out.setdefault(pid, []).append(i)
    return out


def expected_splits(path, epochs, seed):
    """(epoch, k) -> the ids of split k: rank k of a world of SPLITS under
    brand's plan, without a short rank's padding (positions k, k + SPLITS, ...
    below SAMPLES), read here without the service."""
    out = {}
    for epoch in range(epochs):
        for k in range(SPLITS):
            ids = [int(e["id"]) for e in BrandDataset(path, memory=MEMORY, seed=seed, epoch=epoch, rank=k,
                                                      world=SPLITS).as_numpy_iterator()]
            out[(epoch, k)] = ids[:len(range(k, SAMPLES, SPLITS))]
    return out


def cut_into_splits(stream, expected):
    """A worker's stream as the splits it served, in order: each run of it
    must be one expected split, whole."""
    runs, pos = [], 0
    while pos < len(stream):
        match = [key for key, ids in expected.items() if ids and stream[pos:pos + len(ids)] == ids]
        assert match, f"position {pos} of a worker's stream starts no split of brand's plan: {stream[pos:pos + 8]}"
        key = min(match)
        runs.append(key)
        pos += len(expected[key])
    return runs


def test_dynamic_serves_every_sample_once_as_brand_splits_on_both_workers(svc_ds, cluster):
    address, servers = cluster
    served = run_job(tagged(BrandDataset(svc_ds, memory=MEMORY, seed=5, splits=SPLITS)), address,
                     "distributed_epoch")
    ids = [i for i, _ in served]
    assert sorted(ids) == list(range(SAMPLES)), "every sample exactly once"
    workers = by_worker(served)
    assert set(workers) == {s.proc.pid for s in servers[1:]}, "both workers served"
    # Each worker served whole splits, each split once across the workers,
    # in the order of brand's plan for that rank.
    expected = expected_splits(svc_ds, 1, seed=5)
    runs = [key for stream in workers.values() for key in cut_into_splits(stream, expected)]
    assert sorted(runs) == sorted(expected)


def test_off_serves_the_whole_epoch_on_each_worker(svc_ds, cluster):
    address, servers = cluster
    served = run_job(tagged(BrandDataset(svc_ds, memory=MEMORY, seed=5)), address, "parallel_epochs")
    workers = by_worker(served)
    assert set(workers) == {s.proc.pid for s in servers[1:]}
    for pid, ids in workers.items():
        assert sorted(ids) == list(range(SAMPLES)), f"worker {pid}: the whole epoch"
        # brand's epoch-0 order, as without the service.
        assert ids == [int(e["id"]) for e in BrandDataset(svc_ds, memory=MEMORY, seed=5).as_numpy_iterator()]
    assert len(served) == 2 * SAMPLES


def test_repeat_under_dynamic_serves_two_epochs_in_two_orders_the_same_for_the_same_seed(svc_ds, cluster):
    address, _ = cluster
    expected = expected_splits(svc_ds, 2, seed=9)
    # The two epochs' splits differ: two orders.
    assert all(expected[(0, k)] != expected[(1, k)] for k in range(SPLITS))
    jobs = []
    for _ in range(2):
        served = run_job(tagged(BrandDataset(svc_ds, memory=MEMORY, seed=9, splits=SPLITS).repeat(2)), address,
                         "distributed_epoch")
        ids = [i for i, _ in served]
        assert sorted(ids) == sorted(list(range(SAMPLES)) * 2), "every sample once in each of two epochs"
        runs = {}
        for pid, stream in by_worker(served).items():
            for key in cut_into_splits(stream, expected):
                runs[key] = runs.get(key, 0) + 1
        assert runs == {key: 1 for key in expected}, "each split of both epochs once"
        jobs.append(sorted(runs))
    assert jobs[0] == jobs[1]


def test_dynamic_refuses_a_config_with_rank(svc_ds, cluster):
    address, _ = cluster
    with pytest.raises(tf.errors.OpError, match="must not set rank, world or nodes"):
        run_job(tagged(BrandDataset(svc_ds, memory=MEMORY, rank=0, world=2, splits=SPLITS)), address,
                "distributed_epoch")


def test_worker_killed_mid_epoch_serves_no_sample_twice(svc_ds):
    # TensorFlow 2.21's dispatcher keeps a lost worker's task (worker_timeout
    # only logs it) and the client waits for it: the worker is restarted at
    # its address, as tf.data service expects, and goes on with new splits.
    ports = [free_port(), free_port()]
    address, servers = start_service(ports)
    try:
        victim, survivor = servers[1], servers[2]
        ds = tagged(BrandDataset(svc_ds, memory=MEMORY, seed=5, splits=SPLITS)).apply(
            tf.data.experimental.service.distribute(processing_mode="distributed_epoch",
                                                    service=f"grpc://{address}"))
        it = iter(ds)
        before, after = [], []
        while len(before) < SAMPLES // 4 or {p for _, p in before} != {victim.proc.pid, survivor.proc.pid}:
            e = next(it)
            before.append((int(e["id"]), int(e["pid"])))
            assert len(before) < SAMPLES, "both workers should have served by now"
        victim.kill()
        restarted = brand_worker(address, ports[0])
        servers.append(restarted)
        restarted.wait_ready()
        for e in it:
            after.append((int(e["id"]), int(e["pid"])))
    finally:
        for s in servers:
            s.kill()
    ids = [i for i, _ in before + after]
    assert len(ids) == len(set(ids)), "no sample twice"
    assert set(ids) <= set(range(SAMPLES))
    # The client had some of the victim's elements in flight; after them,
    # only the survivor and the restarted worker serve.
    late = after[len(after) // 2:]
    assert late and victim.proc.pid not in {p for _, p in late}
    # What is missing is what the victim held: the rest of its split, and
    # what it had made ahead of the client (at most a split more).
    missing = SAMPLES - len(ids)
    assert missing <= 2 * -(-SAMPLES // SPLITS), f"{missing} samples lost"
    print(f"killed worker: {missing} samples lost, {len(after)} served after the kill")


def test_worker_without_the_op_names_the_missing_op(svc_ds):
    dispatcher = brand_service("dispatcher", "--port", "0")
    servers = [dispatcher]
    try:
        port = ready_port(dispatcher)
        plain = Server([sys.executable, "-c", PLAIN_WORKER, f"127.0.0.1:{port}"], "plain worker ready")
        servers.append(plain)
        plain.wait_ready()
        with pytest.raises(tf.errors.NotFoundError) as e:
            run_job(tagged(BrandDataset(svc_ds, memory=MEMORY)), f"127.0.0.1:{port}", "parallel_epochs")
        assert "Op type not registered 'BrandDataset' in binary running on" in str(e.value)
    finally:
        for s in servers:
            s.kill()


def test_service_processes_turn_brand_multi_node_off(svc_ds, monkeypatch):
    # What a worker does with a dataset whose config asks for brand nodes.
    monkeypatch.setenv(service.SERVICE_ENV, "1")
    # An environment that would make every loader a node of 2 (brand on port + 1000).
    cluster = {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    ds = BrandDataset(svc_ds, memory=MEMORY, config='peer_timeout = "2s"')
    assert sorted(int(e["id"]) for e in ds.as_numpy_iterator()) == list(range(SAMPLES)), "a loader alone"
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"opens every loader with `nodes = \[\]`"):
        BrandDataset(svc_ds, memory=MEMORY, config='nodes = ["127.0.0.1:1", "127.0.0.1:2"]\nrank = 0')
    monkeypatch.setenv(service.SERVICE_ENV, "0")
    with pytest.raises(BuildError, match="the cluster's is 1.0"):
        service.prepare(tensorflow="1.0")
