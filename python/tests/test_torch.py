"""brand.torch.BrandDataset against the real torch and torchdata: exactly once,
bytes, StatefulDataLoader resume with 0 and 2 workers, DDP-style ranks ×
workers, elastic resume over a different number of workers, and memory that
the process's workers share (issue 37)."""

import copy
import json
import os
import pickle
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import brand
import brand.torch
from brand.torch import BrandDataset, worker_states

from conftest import SAMPLES, make_dataset, source_bytes

# 40 % of 150 samples: 60 slots, 30 for each of 2 workers (two batches and a
# chunk of 16 each).
CFG = dict(batch_size=8, memory="40%", seed=5, io_backend="threads")


def as_list(items):
    return items  # collate: keep the per-sample dicts


def ids_of(step):
    """The sample ids of one DataLoader step (a list of per-sample dicts, or a batched dict)."""
    if isinstance(step, dict):
        return step["id"].tolist()
    return [item["id"] for item in step]


def run_epochs(dl, ds, epochs, first_epoch=0):
    out = []
    for e in range(first_epoch, epochs):
        ds.set_epoch(e)
        out.append([ids_of(s) for s in dl])
    return out


@pytest.fixture(scope="module")
def even_dataset(tmp_path_factory):
    """160 samples: 4 ranks × workers divide it, so no padding repeats."""
    return make_dataset(tmp_path_factory.mktemp("brand-even"), samples=160)


def test_per_sample_items_are_every_sample_once_with_its_bytes(dataset):
    files, ds_path = dataset
    ds = BrandDataset(ds_path, **CFG)
    dl = DataLoader(ds, batch_size=10, collate_fn=as_list)
    for epoch in range(2):
        ds.set_epoch(epoch)
        seen = []
        for step in dl:
            for item in step:
                assert isinstance(item["data"], torch.Tensor) and item["data"].dtype == torch.uint8
                assert item["data"].numpy().tobytes() == source_bytes(files, item["key"])
                assert item["key"].startswith(f"class-{item['label']:04d}/")
                seen.append(item["id"])
        assert sorted(seen) == list(range(SAMPLES))


def test_batched_items_are_brand_batches(dataset):
    files, ds_path = dataset
    ds = BrandDataset(ds_path, batched=True, **CFG)
    steps = list(DataLoader(ds, batch_size=None))
    assert len(steps) == -(-SAMPLES // 8)
    ids = [i for s in steps for i in s["id"].tolist()]
    assert sorted(ids) == list(range(SAMPLES))
    s = steps[0]
    assert s["label"].dtype == torch.int64 and s["epoch"] == 0 and len(s["data"]) == len(s["key"]) == 8
    for t, key in zip(s["data"], s["key"]):
        assert t.numpy().tobytes() == source_bytes(files, key)


def stateful(ds, workers, batched):
    if batched:
        return StatefulDataLoader(ds, batch_size=None, num_workers=workers)
    return StatefulDataLoader(ds, batch_size=5, num_workers=workers, collate_fn=as_list)


# A cut is the steps taken before the save; "end" saves after epoch 0's
# loop has ended (the DataLoader raised StopIteration).
@pytest.mark.parametrize("workers,batched,cuts", [
    (0, False, [0, 1, 7, 29, 30, "end", 31, 45]),  # 30 steps of 5 an epoch: 30 = right after its last step
    (0, True, [3, 19, "end"]),                     # 19 steps of 8 an epoch
    (2, False, [1, 8, 30, "end", 31, 44]),         # two workers × 75 samples, steps of 5 from each in turn
    (2, True, [5, 20, "end"]),                     # 2 × 10 batches a worker
])
def test_stateful_dataloader_resumes_exactly(dataset, workers, batched, cuts):
    _, ds_path = dataset
    whole_ds = BrandDataset(ds_path, batched=batched, **CFG)
    whole = run_epochs(stateful(whole_ds, workers, batched), whole_ds, 2)
    flat = [s for epoch in whole for s in epoch]
    for epoch in whole:
        assert sorted(i for s in epoch for i in s) == list(range(SAMPLES))
    for cut in cuts:
        ds = BrandDataset(ds_path, batched=batched, **CFG)
        dl = stateful(ds, workers, batched)
        got, epoch, it = [], 0, None
        if cut == "end":
            ds.set_epoch(0)
            got = [ids_of(s) for s in dl]
            epoch = 1
        while cut != "end" and len(got) < cut:
            if it is None:
                ds.set_epoch(epoch)
                it = iter(dl)
            step = next(it, None)
            if step is None:
                it, epoch = None, epoch + 1
                continue
            got.append(ids_of(step))
        saved = pickle.loads(pickle.dumps(dl.state_dict()))
        json.dumps(worker_states(saved))  # the brand part is JSON too
        del dl, it, ds
        # A new process would start here: a new dataset and DataLoader.
        ds = BrandDataset(ds_path, batched=batched, **dict(CFG, queue_depth=2))
        dl = stateful(ds, workers, batched)
        dl.load_state_dict(saved)
        # The training loop's own count: the epoch it was in when it saved.
        for e in range(epoch, 2):
            ds.set_epoch(e)
            got += [ids_of(s) for s in dl]
        assert got == flat, f"cut {cut}: resumed run differs"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_ranks_by_two_workers_serve_every_sample_exactly_once(even_dataset, tmp_path):
    """Two processes in a gloo process group (RANK/WORLD_SIZE set wrong on
    purpose: torch.distributed wins), each a DataLoader with 2 workers."""
    _, ds_path = even_dataset
    port = free_port()
    script = textwrap.dedent("""
        import json, sys, torch, torch.distributed as dist
        from torch.utils.data import DataLoader
        from brand.torch import BrandDataset
        rank, port, ds, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        data = BrandDataset(ds, batch_size=4, memory="30%", seed=9, io_backend="threads")
        epochs = []
        for epoch in range(2):
            data.set_epoch(epoch)
            dl = DataLoader(data, batch_size=6, num_workers=2, collate_fn=lambda x: x)
            epochs.append([item["id"] for step in dl for item in step])
        json.dump(epochs, open(out, "w"))
        dist.destroy_process_group()
    """)
    env = dict(os.environ, RANK="5", WORLD_SIZE="9")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(port), str(ds_path),
                               str(tmp_path / f"rank{r}.json")], env=env) for r in range(2)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    for epoch in range(2):
        every = ranks[0][epoch] + ranks[1][epoch]
        assert sorted(every) == list(range(160)), f"epoch {epoch}: not every sample exactly once"
        assert len(ranks[0][epoch]) == len(ranks[1][epoch]) == 80
    assert ranks[0][0] != ranks[0][1]


def test_rank_and_world_from_the_environment(even_dataset, monkeypatch):
    _, ds_path = even_dataset
    got = []
    for r in range(2):
        monkeypatch.setenv("RANK", str(r))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = BrandDataset(ds_path, **CFG)
        got.append([i for s in DataLoader(ds, batch_size=4, num_workers=2, collate_fn=as_list) for i in ids_of(s)])
    assert len(got[0]) == len(got[1]) == 80
    assert sorted(got[0] + got[1]) == list(range(160))


def test_elastic_resume_on_another_number_of_workers(even_dataset):
    """2 workers (48 slots each) save after 4 steps (2 batches each); 3
    workers with the same memory (32 slots each: the same total) serve the
    rest of the epoch."""
    _, ds_path = even_dataset
    cfg = dict(CFG, memory="96 slots")
    ds = BrandDataset(ds_path, batched=True, **cfg)
    dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    it = iter(dl)
    served = [i for _ in range(4) for i in next(it)["id"].tolist()]
    states = worker_states(dl.state_dict())
    assert len(states) == 2 and all(s["skip"] == 0 for s in states)
    del it, dl
    ds3 = BrandDataset(ds_path, batched=True, **cfg)
    ds3.load_world_state(json.loads(json.dumps(states)))
    dl3 = DataLoader(ds3, batch_size=None, num_workers=3)
    rest = [i for step in dl3 for i in step["id"].tolist()]
    # 160 samples on 3 ranks: drop_last=False pads each to 54, repeating 2.
    assert set(served + rest) == set(range(160))
    assert len(served) + len(rest) - 160 < 3, "more than padding repeated"


def test_elastic_resume_refuses_states_inside_a_batch(dataset):
    _, ds_path = dataset
    ds = BrandDataset(ds_path, **CFG)
    dl = StatefulDataLoader(ds, batch_size=3, num_workers=0, collate_fn=as_list)
    next(iter(dl))
    with pytest.raises(brand.StateMismatchError, match="inside a brand batch"):
        BrandDataset(ds_path, **CFG).load_world_state(worker_states(dl.state_dict()))


def test_epochs_names_the_last_epoch_so_nothing_is_read_ahead_past_it(dataset):
    """A run that knows its length reads no further than its last epoch
    (the reads issued are those of read-ahead off), serves the same order,
    and still serves an epoch asked for after it."""
    _, ds_path = dataset
    cfg = dict(CFG, read_gap="whole")

    def run(readahead, epochs=None):
        ds = BrandDataset(ds_path, epochs=epochs, readahead=readahead, **cfg)
        dl = DataLoader(ds, batch_size=None, num_workers=0)
        e0 = [item["id"] for item in dl]
        issued = ds._loader.metrics()["reads_issued"]
        e1 = [item["id"] for item in dl]  # asked for anyway
        ds._loader.close()
        return issued, e0, e1

    own, e0, e1 = run(0)
    ahead, a0, a1 = run(64 << 20)
    bounded, b0, b1 = run(64 << 20, epochs=1)
    assert ahead > own, f"read-ahead crosses into epoch 1: {ahead} reads, {own} of epoch 0"
    assert bounded == own, (bounded, own)
    assert sorted(e0) == sorted(e1) == list(range(SAMPLES)) and e0 != e1
    assert (a0, a1) == (b0, b1) == (e0, e1)
    with pytest.raises(ValueError, match="at least 1"):
        BrandDataset(ds_path, epochs=0, **cfg)
    with pytest.raises(TypeError, match="int or None"):
        BrandDataset(ds_path, epochs="2", **cfg)


def test_set_epoch_after_a_saved_epoch_starts_that_epoch(dataset):
    """A state of epoch 0 loaded with set_epoch(1) starts epoch 1 afresh (the
    later epoch wins); set_epoch(0) resumes inside epoch 0."""
    _, ds_path = dataset
    ds = BrandDataset(ds_path, **CFG)
    whole = run_epochs(StatefulDataLoader(ds, batch_size=5, collate_fn=as_list), ds, 2)
    ds = BrandDataset(ds_path, **CFG)
    dl = StatefulDataLoader(ds, batch_size=5, collate_fn=as_list)
    it = iter(dl)
    first = [ids_of(next(it)) for _ in range(3)]
    saved = dl.state_dict()
    for epoch, expected in ((1, whole[1]), (0, whole[0][3:])):
        ds = BrandDataset(ds_path, **CFG)
        dl = StatefulDataLoader(ds, batch_size=5, collate_fn=as_list)
        dl.load_state_dict(saved)
        ds.set_epoch(epoch)
        assert [ids_of(s) for s in dl] == expected
    assert first == whole[0][:3]


# -- memory is the process's, shared by its workers (issue 37) ----------------

# 4 and 8 workers on a 2-core machine: torch warns that they may be slow.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

MEM_SAMPLES = 640  # 4 KiB on average: 2.5 MiB


@pytest.fixture(scope="module")
def mem_dataset(tmp_path_factory):
    files, ds = make_dataset(tmp_path_factory.mktemp("brand-mem"), samples=MEM_SAMPLES, seed=3)
    sizes = {p.relative_to(files).as_posix(): p.stat().st_size for p in files.rglob("*") if p.is_file()}
    return ds, sizes


class Tag:
    """A transform that tags each brand batch with the worker that served it
    and that worker's brand metrics."""

    def __init__(self, ds):
        self.ds = ds

    def __call__(self, item):
        info = torch.utils.data.get_worker_info()
        ds = info.dataset if info is not None else self.ds
        item["worker"] = info.id if info is not None else 0
        item["world"] = ds._loader.world
        item["metrics"] = ds._loader.metrics()
        return item


# 320 slots (50 %), batches of 8, 64 KiB in flight per worker.
MEM_CFG = dict(batched=True, batch_size=8, memory="50%", seed=7, io_backend="threads", readahead="64KiB")


def global_order(ds_path, workers, **overrides):
    """One epoch: the ids ordered by brand's global position (worker w of k
    serves positions w, w + k, ...), and each worker's last metrics."""
    ds = BrandDataset(ds_path, **dict(MEM_CFG, **overrides))
    ds.transform = Tag(ds)
    k = max(workers, 1)
    by_position, metrics, steps = {}, {}, {}
    for item in DataLoader(ds, batch_size=None, num_workers=workers):
        assert item["world"] == k
        w = item["worker"]
        for i in item["id"].tolist():
            step = steps.get(w, 0)
            by_position[step * k + w] = i
            steps[w] = step + 1
        metrics[w] = item["metrics"]
    return [by_position[p] for p in sorted(by_position)], metrics


@pytest.mark.parametrize("workers", [0, 2, 4])
def test_workers_share_the_memory_of_their_process(mem_dataset, workers):
    """The workers' resident samples together stay within the process's
    budget plus its read-ahead (the workers split both; each rank may start
    one read beyond its share); before, each worker held a budget and a
    read-ahead of its own."""
    ds_path, sizes = mem_dataset
    order, metrics = global_order(ds_path, workers)
    assert sorted(order) == list(range(MEM_SAMPLES))
    k = max(workers, 1)
    assert len(metrics) == k
    total = sum(sizes.values())
    budget = -(-total * (MEM_SAMPLES // 2) // MEM_SAMPLES)  # 50 %: 320 slots of the mean size
    chunk = 16 * max(sizes.values())  # the largest read (a whole chunk)
    held = sum(m["peak_resident_bytes"] for m in metrics.values())
    assert held <= budget + 64 * 1024 + k * chunk, (held, budget, [m["peak_resident_bytes"] for m in metrics.values()])
    if workers:
        # Each worker's share is its budget: a quarter, not all of it, with 4.
        assert max(m["peak_resident_bytes"] for m in metrics.values()) <= budget // k + 64 * 1024 // k + chunk


def test_the_global_order_does_not_depend_on_the_number_of_workers(mem_dataset):
    """320 slots shared by 1, 2 or 4 workers: the same total, so the same
    sequence of samples in brand's global order."""
    ds_path, _ = mem_dataset
    orders = {k: global_order(ds_path, k)[0] for k in (0, 2, 4)}
    assert sorted(orders[2]) == sorted(orders[4]) == list(range(MEM_SAMPLES))
    assert orders[2] == orders[4] == orders[0]
    # Another seed is another order (the comparison can fail).
    assert global_order(ds_path, 2, seed=8)[0] != orders[2]


def test_resume_on_four_workers_from_two_serves_the_rest_exactly_once(mem_dataset):
    """A StatefulDataLoader state of 2 workers (after 6 steps: 3 brand batches
    each), resumed on 4 workers with the same memory: the rest of the epoch,
    every sample once."""
    ds_path, _ = mem_dataset
    cfg = dict(MEM_CFG, readahead=None)
    ds = BrandDataset(ds_path, **cfg)
    dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    it = iter(dl)
    served = [i for _ in range(6) for i in next(it)["id"].tolist()]
    saved = pickle.loads(pickle.dumps(dl.state_dict()))
    del it, dl
    ds4 = BrandDataset(ds_path, **cfg)
    ds4.load_world_state(worker_states(saved))
    rest = [i for step in DataLoader(ds4, batch_size=None, num_workers=4) for i in step["id"].tolist()]
    assert len(served) == 48
    assert sorted(served + rest) == list(range(MEM_SAMPLES))
    # The first 48 positions of the global order that 0 workers serve, then the rest.
    whole = global_order(ds_path, 0)[0]
    assert sorted(served) == sorted(whole[:48])


def test_a_budget_too_small_for_the_workers_names_them_and_the_least(mem_dataset):
    """64 slots on 8 workers is 8 each, less than a chunk (16): a budget in
    slots is the user's limit, an error."""
    ds_path, _ = mem_dataset
    ds = BrandDataset(ds_path, **dict(MEM_CFG, memory="64 slots"))
    with pytest.raises(brand.ConfigError, match=r"its 8 workers: 8 each.*one chunk, 16 samples.*\"128 slots\""):
        next(iter(DataLoader(ds, batch_size=None, num_workers=8)))
    # The same budget is enough for 4 workers (16 each).
    assert len(list(DataLoader(BrandDataset(ds_path, **dict(MEM_CFG, memory="64 slots")), batch_size=None,
                               num_workers=4))) == MEM_SAMPLES // 8


def test_a_percentage_too_small_for_the_workers_rounds_up_with_one_warning(mem_dataset, tmp_path):
    """10 % of 640 samples is 64 slots, 8 for each of 8 workers: less than a
    chunk (16), so each holds a chunk, one warning says so (worker 0's, in a
    process of its own: counted on stderr), and each worker's metrics() has
    its real share (issue 54: defaults work at any dataset size)."""
    ds_path, _ = mem_dataset
    script = textwrap.dedent("""
        import json, sys, torch
        from brand.torch import BrandDataset
        ds = BrandDataset(sys.argv[1], batched=True, batch_size=8, memory="10%", seed=7, io_backend="threads")
        def tag(item):
            item["memory_slots"] = torch.utils.data.get_worker_info().dataset._loader.metrics()["memory_slots"]
            return item
        ds.transform = tag
        items = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=8))
        json.dump({"ids": [i for item in items for i in item["id"].tolist()],
                   "slots": sorted({item["memory_slots"] for item in items})}, open(sys.argv[2], "w"))
    """)
    out = tmp_path / "out.json"
    run = subprocess.run([sys.executable, "-c", script, str(ds_path), str(out)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.load(open(out))
    assert sorted(got["ids"]) == list(range(MEM_SAMPLES))
    assert got["slots"] == [16]
    said = "memory 10% is 64 slots (samples' worth) for this process, too few for each of its 8 workers to hold one " \
           "chunk (16 samples): each holds 16 slots instead, 128 in all"
    assert run.stderr.count(said) == 1, run.stderr[-3000:]


def test_a_tiny_dataset_at_the_defaults_works_with_four_workers(tmp_path):
    """200 samples in brand pack's default chunks of 64, BrandDataset at its
    defaults (memory "10%", internal batches of 256), 4 workers: every
    sample once per epoch, where it was a ConfigError (issue 54)."""
    _, ds_path = make_dataset(tmp_path, samples=200, seed=4, chunk_size=None)
    ds = BrandDataset(ds_path)
    for epoch in range(2):
        ds.set_epoch(epoch)
        ids = [i for s in DataLoader(ds, batch_size=8, num_workers=4, collate_fn=as_list) for i in ids_of(s)]
        assert sorted(ids) == list(range(200)), f"epoch {epoch}"


def test_a_small_share_of_an_internal_batch_shrinks_it(tmp_path):
    """Issue 54's first case in one process: 2,401 samples, memory "10%"
    (240 slots), 2 workers of 120 slots: batches of 60 inside, no warning
    (nothing was rounded up); batched=True at a world of 3 rounds each share
    up to its whole share of the epoch (401) with a warning; 240 slots given
    as such stay an error naming the least that works."""
    _, ds_path = make_dataset(tmp_path, samples=2401, seed=7, chunk_size=None)
    share = brand._brand._worker_memory(ds_path, 2, False, memory="10%")
    assert (share["worker_slots"], share["worker_batch_size"], share["rounded_up"]) == (120, 60, None)
    ds = BrandDataset(ds_path, memory="10%", seed=7)
    ids = [i for s in DataLoader(ds, batch_size=8, num_workers=2, collate_fn=as_list) for i in ids_of(s)]
    # 1,201 each: one sample repeats, as DistributedSampler pads.
    assert set(ids) == set(range(2401)) and len(ids) == 2402
    share = brand._brand._worker_memory(ds_path, 2, True, memory="10%", rank=0, world=3)
    assert (share["worker_slots"], share["worker_batch_size"]) == (401, 256)
    assert "its whole share of an epoch (401 samples" in share["rounded_up"]
    with pytest.raises(brand.ConfigError, match=r"whole share of an epoch, 401 samples.*\"802 slots\""):
        brand._brand._worker_memory(ds_path, 2, True, memory="240 slots", rank=0, world=3)


def test_a_state_of_per_worker_memory_is_refused_naming_the_memory_that_resumes_it(mem_dataset):
    """A state whose workers had other slots (as version 1 states, saved when
    each worker had all of memory, have): StateMismatchError names the
    memory that resumes it, and that memory does, exactly."""
    ds_path, _ = mem_dataset
    whole_ds = BrandDataset(ds_path, **MEM_CFG)
    whole = [s["id"].tolist() for s in StatefulDataLoader(whole_ds, batch_size=None, num_workers=2)]
    ds = BrandDataset(ds_path, **MEM_CFG)
    dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    it = iter(dl)
    got = [next(it)["id"].tolist() for _ in range(5)]
    saved = dl.state_dict()
    del it, dl
    # As a version-1 state of 2 workers with memory="80 slots" each would be.
    old = copy.deepcopy(saved)
    for w in worker_states(old):
        w["version"] = 1
    ds = BrandDataset(ds_path, **dict(MEM_CFG, memory="80 slots"))
    dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    dl.load_state_dict(old)
    with pytest.raises(brand.StateMismatchError, match=r"160 slots per DataLoader worker \(a state of version 1.*memory=\"320 slots\""):
        next(iter(dl))
    ds = BrandDataset(ds_path, **dict(MEM_CFG, memory="320 slots"))
    dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    dl.load_state_dict(old)
    assert got + [s["id"].tolist() for s in dl] == whole


def test_an_elastic_resume_that_cannot_keep_the_total_memory_says_why(mem_dataset):
    """320 slots saved by 2 workers: 3 workers cannot share them equally, and
    memory="160 slots" does not hold them (the error names the memory that does)."""
    ds_path, _ = mem_dataset
    ds = BrandDataset(ds_path, **MEM_CFG)
    dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    it = iter(dl)
    for _ in range(2):
        next(it)
    states = worker_states(dl.state_dict())
    del it, dl
    for workers, memory, why in [(3, "320 slots", r"320 slots in total.*3 brand ranks cannot share"),
                                 (4, "160 slots", r"320 slots in total.*pass memory=\"320 slots\"")]:
        ds = BrandDataset(ds_path, **dict(MEM_CFG, memory=memory))
        ds.load_world_state(states)
        with pytest.raises(brand.StateMismatchError, match=why):
            next(iter(DataLoader(ds, batch_size=None, num_workers=workers)))
