"""brand.tf.service: tf.data service servers that can run ``BrandDataset``.

    python -m brand.tf.service dispatcher --port 5050 [--work-dir DIR --fault-tolerant]
    python -m brand.tf.service worker --dispatcher HOST:5050 --port 5051 [--worker-address HOST:%port%]

or from Python, ``start_dispatcher(port, ...)`` / ``start_worker(dispatcher_address, port, ...)``,
which return the started ``tf.data.experimental.service`` server.

tf.data service ships the dataset's *graph* to its servers, never code: every
process that runs it needs brand's op registered, or the client gets
``NotFoundError: Op type not registered 'BrandDataset' in binary running on
<host>``. Each worker needs it (it builds the pipeline); the dispatcher needs
it under dynamic sharding (``processing_mode="distributed_epoch"`` /
``ShardingPolicy.DYNAMIC``: it makes the splits from the graph). TensorFlow
loads no op library over the network and a running server cannot be fixed:
restart it through these helpers, which load the op (compiling it once for
this TensorFlow, see ``brand.tf._build``) and check TensorFlow's version
*before* the server starts. Every process must run the same TensorFlow
major.minor as the client that registers the dataset (``--tensorflow X.Y``
makes a server refuse to start otherwise). The dataset's path must be readable
at the same path by the workers and, under dynamic sharding, the dispatcher.

brand's own multi-node mode (nodes that read once and push to each other) is
off in these processes: they set ``BRAND_TF_SERVICE=1``, under which the op
opens every loader with ``nodes = []``, so neither a dataset's config nor the
environment (``BRAND_NODES``, ``TF_CONFIG``) makes a worker a brand node (the
service already moves the data); a dataset whose config sets ``nodes`` fails
naming this.

Sharding (``distribute(processing_mode=...)``):
  * ``OFF`` / "parallel_epochs": each worker serves the whole dataset (with 2
    workers every sample twice per epoch); a restarted worker starts over.
  * ``DYNAMIC`` / "distributed_epoch": each epoch is cut into ``splits``
    (``BrandDataset(splits=...)``); split k of S is rank k of a world of S under
    brand's plan, so a run without failures serves every sample exactly once.
    tf.data service hands a split out at most once: a worker that dies
    mid-split loses the rest of that split for that epoch (those samples are
    missing, none comes twice). TensorFlow 2.21's dispatcher keeps a lost
    worker's task and the client waits for it: restart the worker at its
    address (same ``--port`` and ``--worker-address``). ``.repeat()`` moves on to
    new epochs.
  * ``DATA`` (and ``FILE_OR_DATA``, since BrandDataset is not one of
    TensorFlow's file readers; ``FILE`` fails): every worker reads everything
    and keeps every n-th element (n x the I/O). ``HINT`` only rewrites
    ``.shard(SHARD_HINT, SHARD_HINT)``; a bare BrandDataset is then as OFF.
    All static policies need the dispatcher's ``worker_addresses``.
"""

from __future__ import annotations

import argparse
import os
import sys

# Before the op is loaded or any dataset opened in this process.
SERVICE_ENV = "BRAND_TF_SERVICE"

__all__ = ["prepare", "start_dispatcher", "start_worker", "main", "SERVICE_ENV"]


def prepare(tensorflow: str | None = None) -> str:
    """Makes this process able to run BrandDataset graphs as a tf.data
    service server: brand's multi-node push off, TensorFlow's version checked
    (``tensorflow="X.Y"``: the cluster's, refused if this process runs another),
    the op loaded. Returns a one-line description (versions, op library)."""
    os.environ[SERVICE_ENV] = "1"
    import tensorflow as tf

    import brand
    from brand.tf import _build, load_ops

    running = _build.check_supported(tf.__version__)
    if tensorflow is not None:
        want = tensorflow.strip().split(".")
        n = min(len(want), 3)
        if n < 2 or [str(p) for p in running[:n]] != want[:n]:
            raise _build.BuildError(
                f"brand.tf.service: this process runs TensorFlow {tf.__version__}, the cluster's is {tensorflow}: "
                "tf.data service ships graphs, not code, and brand's op loads only into the TensorFlow "
                "major.minor it was built for; install the same TensorFlow everywhere"
            )
    load_ops()
    library = _build.Build(tf).library
    return f"TensorFlow {tf.__version__}, brand {brand.__version__}, op {library}"


def _host_port(address: str) -> str:
    for scheme in ("grpc://", "grpc+loas://"):
        if address.startswith(scheme):
            return address[len(scheme):]
    return address


def start_dispatcher(port: int = 0, *, work_dir=None, fault_tolerant: bool = False, worker_addresses=None,
                     worker_timeout_ms=None, protocol=None, tensorflow=None):
    """Starts a tf.data service dispatcher that can make BrandDataset's splits
    (see the module doc) and returns it (``.target`` is its address for
    ``distribute(service=...)``; ``.join()`` serves until killed)."""
    prepare(tensorflow)
    import tensorflow as tf

    config = tf.data.experimental.service.DispatcherConfig(
        port=port,
        protocol=protocol,
        work_dir=None if work_dir is None else os.fspath(work_dir),
        fault_tolerant_mode=fault_tolerant,
        worker_addresses=worker_addresses,
        worker_timeout_ms=worker_timeout_ms,
    )
    return tf.data.experimental.service.DispatchServer(config)


def start_worker(dispatcher_address: str, port: int = 0, *, worker_address=None, heartbeat_interval_ms=None,
                 protocol=None, tensorflow=None):
    """Starts a tf.data service worker of the dispatcher at
    ``dispatcher_address`` ("host:port" or "grpc://host:port") with brand's op
    loaded, and returns it. ``worker_address`` is what the dispatcher tells
    clients ("host:%port%"; TensorFlow's default is "localhost:%port%")."""
    prepare(tensorflow)
    import tensorflow as tf

    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=_host_port(dispatcher_address),
        worker_address=worker_address,
        port=port,
        protocol=protocol,
        heartbeat_interval_ms=heartbeat_interval_ms,
    )
    return tf.data.experimental.service.WorkerServer(config)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m brand.tf.service", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tensorflow", metavar="X.Y",
                    help="the cluster's TensorFlow version: refuse to start under another")
    sub = ap.add_subparsers(dest="role", required=True)
    d = sub.add_parser("dispatcher", help="start a dispatcher (and serve until killed)")
    d.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    d.add_argument("--work-dir", help="where the dispatcher keeps its state")
    d.add_argument("--fault-tolerant", action="store_true", help="journal state in --work-dir (restartable)")
    d.add_argument("--worker-address", action="append", dest="worker_addresses",
                   help="a worker's address, for static sharding (repeat; in worker order)")
    d.add_argument("--worker-timeout-ms", type=int, help="a worker silent this long is gone")
    w = sub.add_parser("worker", help="start a worker (and serve until killed)")
    w.add_argument("--dispatcher", required=True, help="the dispatcher's host:port")
    w.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    w.add_argument("--worker-address", help='what clients connect to, e.g. "10.0.0.5:%%port%%"')
    w.add_argument("--heartbeat-ms", type=int, help="heartbeat interval to the dispatcher")
    args = ap.parse_args(argv)

    from brand.tf._build import BuildError

    try:
        if args.role == "dispatcher":
            if args.fault_tolerant and not args.work_dir:
                ap.error("--fault-tolerant needs --work-dir")
            server = start_dispatcher(args.port, work_dir=args.work_dir, fault_tolerant=args.fault_tolerant,
                                      worker_addresses=args.worker_addresses,
                                      worker_timeout_ms=args.worker_timeout_ms, tensorflow=args.tensorflow)
            address = server.target
        else:
            server = start_worker(args.dispatcher, args.port, worker_address=args.worker_address,
                                  heartbeat_interval_ms=args.heartbeat_ms, tensorflow=args.tensorflow)
            address = server._address  # "localhost:PORT", the port it bound
    except BuildError as e:
        sys.exit(str(e))
    # One line a launcher (or a test) can wait for.
    print(f"brand.tf.service: {args.role} ready at {address} ({prepare(args.tensorflow)})", flush=True)
    server.join()


if __name__ == "__main__":
    main()
