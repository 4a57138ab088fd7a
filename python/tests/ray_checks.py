"""What test_ray.py checks, run in a network namespace of its own (Ray's
servers listen on every address; there, only a loopback exists):
``unshare --net`` + ``ip link set lo up``, then this script observes a real
local Ray (``ray.init(num_cpus=2)``) and prints its observations as JSON."""

import json
import sys
import threading

import ray

import brand
import brand.ray


def ids_of(ds) -> list[int]:
    return [i for b in ds.iter_batches(batch_size=None, batch_format="pyarrow") for i in b.column("id").to_pylist()]


def main() -> None:
    path, samples = sys.argv[1], int(sys.argv[2])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1")
    ray.data.DataContext.get_current().enable_progress_bars = False
    out: dict = {}

    ds = brand.ray.read_brand(path, seed=1, tasks=3, batch_size=32)
    out["schema"] = ds.schema().names
    out["rows"] = [r for b in ds.iter_batches(batch_size=None, batch_format="pyarrow") for r in
                   ({"id": i, "label": lab, "key": k, "data": d.hex()} for i, lab, k, d in
                    zip(*(b.column(c).to_pylist() for c in ("id", "label", "key", "data"))))]

    # Two datasets of one seed, each executed twice (1 task: brand's own order).
    out["orders"] = []
    for _ in range(2):
        ds = brand.ray.read_brand(path, seed=7, tasks=1, batch_size=32)
        out["orders"].append([ids_of(ds), ids_of(ds)])
    out["pinned"] = ids_of(brand.ray.read_brand(path, seed=7, tasks=1, epoch=1, batch_size=32))

    ds = brand.ray.read_brand(path, seed=2, tasks=4, batch_size=16)
    seen: list[list[int]] = [[], []]

    def consume(i, it):
        for b in it.iter_batches(batch_size=None, batch_format="pyarrow"):
            seen[i].extend(b.column("id").to_pylist())

    # streaming_split's iterators must be consumed concurrently.
    threads = [threading.Thread(target=consume, args=(i, it)) for i, it in enumerate(ds.streaming_split(2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    out["split_hung"] = any(t.is_alive() for t in threads)
    out["split"] = seen
    ray.shutdown()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
