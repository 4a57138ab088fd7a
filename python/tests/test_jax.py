"""brand.grain in a JAX program of several processes (real JAX, CPU,
``jax.distributed.initialize`` with a coordinator on 127.0.0.1): each
process is the brand rank ``jax.process_index()`` of ``jax.process_count()``
without being told, and every process takes the same number of batches on an
uneven sample count. The processes run in a network namespace of their own
(the namespace's port 7733 is free: nothing else is there)."""

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

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


def test_jax_processes_are_brand_ranks_with_equal_batches(tmp_path):
    _, ds = make_dataset(tmp_path, samples=SAMPLES, seed=8)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    outs = [tmp_path / f"out-{i}.json" for i in range(PROCESSES)]
    # JAX's coordinator listens on every address: the processes run in a
    # network namespace of their own, where only a loopback exists.
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("unshare (util-linux) and ip (iproute2) are needed to run JAX in a namespace of its own")
    starts = " ".join(f'"{sys.executable}" "{script}" 7733 {i} "{ds}" "{outs[i]}" & ' for i in range(PROCESSES))
    cmd = f"ip link set lo up && {starts} status=0; for p in $(jobs -p); do wait $p || status=1; done; exit $status"
    try:
        run = subprocess.run(["unshare", "--net", "sh", "-c", cmd], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"a JAX process hung (180 s): {(e.stderr or b'')[-2000:]!r}")
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    results = [json.loads(o.read_text()) for o in outs]
    assert [(r["index"], r["count"]) for r in results] == [(i, PROCESSES) for i in range(PROCESSES)]
    counts = [len(r["batches"]) for r in results]
    assert counts[0] == counts[1] == -(-(-(-SAMPLES // PROCESSES)) // 7), counts
    ids = [i for r in results for b in r["batches"] for i in b]
    # Every sample once, and one repeat: rank 1 ends on padding (1001 = 2 x 501 - 1).
    assert set(ids) == set(range(SAMPLES)) and len(ids) == SAMPLES + 1
