"""brand.grain in a JAX program of several processes (real JAX, CPU,
``jax.distributed.initialize`` with a coordinator on 127.0.0.1): each
process is the brand rank ``jax.process_index()`` of ``jax.process_count()``
without being told, and every process takes the same number of batches on an
uneven sample count."""

import json
import socket
import subprocess
import sys
import textwrap

from conftest import make_dataset

SAMPLES = 1001
PROCESSES = 2

WORKER = textwrap.dedent("""
    import json, sys
    import jax
    port, pid, path, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=PROCESSES,
                               process_id=pid, initialization_timeout=60)
    import brand.grain
    ds = brand.grain.BrandIterDataset(path, batch_size=16, seed=5).map(lambda it: it["id"]).batch(7)
    batches = [[int(i) for i in b] for b in ds]
    with open(out, "w") as f:
        json.dump({"index": jax.process_index(), "count": jax.process_count(), "batches": batches}, f)
    jax.distributed.shutdown()
""").replace("PROCESSES", str(PROCESSES))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jax_processes_are_brand_ranks_with_equal_batches(tmp_path):
    _, ds = make_dataset(tmp_path, samples=SAMPLES, seed=8)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    outs = [tmp_path / f"out-{i}.json" for i in range(PROCESSES)]
    procs = [subprocess.Popen([sys.executable, script, str(port), str(i), str(ds), outs[i]],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(PROCESSES)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("a JAX process hung (180 s)")
    assert all(p.returncode == 0 for p in procs), "\\n".join(logs)[-4000:]
    results = [json.loads(o.read_text()) for o in outs]
    assert [(r["index"], r["count"]) for r in results] == [(i, PROCESSES) for i in range(PROCESSES)]
    counts = [len(r["batches"]) for r in results]
    assert counts[0] == counts[1] == -(-(-(-SAMPLES // PROCESSES)) // 7), counts
    ids = [i for r in results for b in r["batches"] for i in b]
    # Every sample once, and one repeat: rank 1 ends on padding (1001 = 2 x 501 - 1).
    assert set(ids) == set(range(SAMPLES)) and len(ids) == SAMPLES + 1
