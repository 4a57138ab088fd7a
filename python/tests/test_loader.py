"""brand.Loader against the real numpy: exactly once per epoch, bytes equal to
the source files, zero copy, resume, elastic resume, errors, GIL and Ctrl-C."""

import gc
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import brand

from conftest import SAMPLES, source_bytes

# Small batches and a small memory budget: many batches, refills and reads.
CFG = dict(batch_size=16, memory="20%", seed=7, io_backend="threads")


def run(loader, batches):
    """The ids of the next `batches` batches (fewer at an epoch's end: stops there)."""
    out = []
    for _ in range(batches):
        b = next(loader, None)
        if b is None:
            break
        out.append(b.ids.tolist())
    return out


def epoch_ids(loader):
    return [i for b in loader for i in b.ids.tolist()]


def test_every_sample_once_per_epoch_with_its_bytes_label_and_key(dataset):
    files, ds = dataset
    loader = brand.Loader(ds, **CFG)
    assert len(loader) == math.ceil(SAMPLES / 16) == math.ceil(loader.epoch_len / loader.batch_size)
    orders = []
    for epoch in range(2):
        seen = []
        batches = 0
        for batch in loader:
            batches += 1
            assert batch.epoch == epoch
            assert len(batch) == len(batch.samples) == len(batch.ids) == len(batch.labels) == len(batch.keys)
            assert batch.ids.dtype == np.uint64 and batch.labels.dtype == np.int64
            for arr, key, label in zip(batch.samples, batch.keys, batch.labels):
                assert isinstance(key, str)
                assert arr.dtype == np.uint8 and arr.ndim == 1
                assert arr.tobytes() == source_bytes(files, key), key
                # brand gen puts class c's files under class-000c/.
                assert key.split("/")[0] == f"class-{label:04d}", (key, label)
            seen += batch.ids.tolist()
        assert batches == len(loader)
        assert sorted(seen) == list(range(SAMPLES)), f"epoch {epoch} is not every sample once"
        orders.append(seen)
    assert orders[0] != orders[1], "two epochs in the same order"


def test_samples_are_zero_copy_aligned_readonly_views_that_outlive_the_batch(dataset):
    files, ds = dataset
    loader = brand.Loader(ds, **CFG)
    batch = next(loader)
    arrays, keys = batch.samples, batch.keys
    assert batch.samples[0] is arrays[0], "each access must give the same arrays"
    for arr in arrays:
        assert not arr.flags.owndata
        assert isinstance(arr.base, brand.SampleBuffer)
        assert arr.base.address == arr.ctypes.data
        assert arr.ctypes.data % 64 == 0
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[0] = 1
    view = arrays[0][1:]  # a slice keeps the buffer too
    del batch
    gc.collect()
    # More batches (buffers freed and reused by the loader) must not touch them.
    for _ in loader:
        pass
    for _ in range(2):
        next(loader)
    gc.collect()
    for arr, key in zip(arrays, keys):
        assert arr.tobytes() == source_bytes(files, key)
    assert view.tobytes() == source_bytes(files, keys[0])[1:]


def test_keys_are_the_source_paths_as_str(tmp_path):
    """Non-ASCII file names come back as the same str. (brand pack stores a
    file name that is not UTF-8 with U+FFFD in place of the bad bytes, so
    such keys cannot be made here; keys from other sources that are not
    UTF-8 decode with surrogateescape.)"""
    from conftest import brand_bin

    files = tmp_path / "files"
    (files / "0").mkdir(parents=True)
    (files / "0" / "café ü.bin").write_bytes(b"x" * 100)
    (files / "0" / "plain.bin").write_bytes(b"y" * 50)
    subprocess.run([brand_bin(), "pack", str(files), "-o", str(tmp_path / "ds"), "--chunk-size", "16"],
                   check=True, capture_output=True)
    keys = [k for b in brand.Loader(tmp_path / "ds", batch_size=4) for k in b.keys]
    assert sorted(keys) == ["0/café ü.bin", "0/plain.bin"]


def events(loader, ends, stop_after=None):
    """What next() gives until `ends` epoch ends: each batch's ids, None for an end."""
    out = []
    while ends and (stop_after is None or len(out) < stop_after):
        b = next(loader, None)
        out.append(None if b is None else b.ids.tolist())
        ends -= b is None
    return out


def uninterrupted(ds, epochs=2, **cfg):
    loader = brand.Loader(ds, **cfg)
    return [b.ids.tolist() for _ in range(epochs) for b in loader]


# 10 batches an epoch: 22 events in two epochs. Cut 10 is right after epoch
# 0's last batch (before the loop sees its end), 11 right after its end.
@pytest.mark.parametrize("cut", [0, 1, 4, 9, 10, 11, 12, 19, 21])
def test_resume_at_any_point_equals_the_uninterrupted_run(dataset, cut):
    _, ds = dataset
    whole = events(brand.Loader(ds, **CFG), ends=2)
    assert len(whole) == 22 and whole[10] is None and whole[21] is None
    first = brand.Loader(ds, **CFG)
    got = events(first, ends=2, stop_after=cut)
    state = json.loads(json.dumps(first.state_dict()))
    assert len(bytes.fromhex(state["checkpoint"])) == brand.CHECKPOINT_BYTES
    first.close()
    # I/O settings may differ on resume; the order may not.
    second = brand.Loader(ds, **dict(CFG, queue_depth=4, readahead="1MiB"))
    second.load_state_dict(state)
    got += events(second, ends=2 - got.count(None))
    assert got == whole


def test_resume_right_after_the_last_batch_ends_that_epoch_first(dataset):
    _, ds = dataset
    loader = brand.Loader(ds, **CFG)
    batches = [b.ids.tolist() for b in [next(loader) for _ in range(len(loader))]]
    state = loader.state_dict()
    assert (state["epoch"], state["served"]) == (0, SAMPLES)
    again = brand.Loader(ds, **CFG)
    again.load_state_dict(state)
    assert list(again) == [], "the rest of epoch 0 is empty"
    assert list(loader) == []  # the original sees the end too
    nxt = [b.ids.tolist() for b in again]
    assert nxt == [b.ids.tolist() for b in loader]  # then epoch 1, as the original
    assert len(batches) == len(nxt)


def test_elastic_resume_from_every_rank_of_another_world(dataset):
    """2 ranks × 48 slots stop after 3 batches; 3 ranks × 32 slots (the same
    total memory) serve the rest of the epoch: every sample exactly once."""
    _, ds = dataset
    cfg = dict(batch_size=8, seed=3, io_backend="threads")
    old = [brand.Loader(ds, rank=r, world=2, memory="48 slots", **cfg) for r in range(2)]
    served = [i for ld in old for _ in range(3) for i in next(ld).ids.tolist()]
    states = [json.loads(json.dumps(ld.state_dict())) for ld in old]
    new = []
    for r in range(3):
        ld = brand.Loader(ds, rank=r, world=3, memory="32 slots", **cfg)
        ld.load_state_dict({"world": states})
        new.append(ld)
    rest = [i for ld in new for i in epoch_ids(ld)]
    # drop_last=False pads ranks to equal steps: a padded sample repeats one served.
    assert set(served) | set(rest) == set(range(SAMPLES))
    assert len(served) + len(rest) - SAMPLES < 3, "more than padding repeated"
    # Then a whole next epoch on the new world, every sample once.
    nxt = [i for ld in new for i in epoch_ids(ld)]
    assert set(nxt) == set(range(SAMPLES))


def test_a_bad_keyword_raises_config_error_naming_the_key(dataset):
    _, ds = dataset
    with pytest.raises(brand.ConfigError, match="batch_sise"):
        brand.Loader(ds, batch_sise=4)
    with pytest.raises(brand.ConfigError, match="batch_size"):
        brand.Loader(ds, batch_size=0)
    with pytest.raises(brand.ConfigError, match="memory"):
        brand.Loader(ds, memory="lots")
    with pytest.raises(brand.ConfigError, match="seed"):
        brand.Loader(ds, seed={"a": 1})
    with pytest.raises(brand.ConfigError, match="queue_depth"):
        brand.Loader(ds, queue_depth=2**70)
    assert issubclass(brand.ConfigError, brand.BrandError)


def test_the_docstring_names_every_key_the_config_accepts(dataset):
    _, ds = dataset
    with pytest.raises(brand.ConfigError) as e:
        brand.Loader(ds, no_such_key=1)
    listed = str(e.value).split("expected one of ", 1)[1].split(", ")
    assert "batch_size" in listed and "nodes" in listed, listed
    missing = [k for k in listed if f"``{k}``" not in brand.Loader.__doc__]
    assert not missing, missing


def test_errors_are_typed(dataset, tmp_path):
    _, ds = dataset
    with pytest.raises(brand.NotFoundError, match=str(tmp_path / "none")):
        brand.Loader(tmp_path / "none")
    loader = brand.Loader(ds, **CFG)
    with pytest.raises(brand.StateMismatchError, match="seed"):
        brand.Loader(ds, **dict(CFG, seed=8)).load_state_dict(loader.state_dict())
    bad = dict(loader.state_dict(), checkpoint="00" * brand.CHECKPOINT_BYTES)
    with pytest.raises(brand.InvalidStateError):
        loader.load_state_dict(bad)
    with pytest.raises(brand.InvalidStateError):
        loader.load_state_dict({"checkpoint": "zz"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(brand.BrandError):
        brand.Loader(tmp_path / "empty")


def test_corrupt_data_raises_data_loss_error_naming_the_sample(corrupt_copy):
    loader = brand.Loader(corrupt_copy, batch_size=16, io_backend="threads", direct=False)
    with pytest.raises(brand.DataLossError, match=r"chunk \d+ at byte \d+, sample \d+") as e:
        for _ in loader:
            pass
    assert str(corrupt_copy) in str(e.value)
    # on_corrupt="skip" serves the rest and counts what it left out.
    skipping = brand.Loader(corrupt_copy, batch_size=16, io_backend="threads", on_corrupt="skip")
    n = sum(len(b) for b in skipping)
    assert 0 < n < SAMPLES
    assert skipping.metrics()["skipped_corrupt"] == SAMPLES - n


def test_metrics_is_a_dict_of_the_loaders_counters(dataset):
    _, ds = dataset
    loader = brand.Loader(ds, **CFG)
    for _ in loader:
        pass
    m = loader.metrics()
    assert m["samples_served"] == SAMPLES and m["threads_backend"] is True
    json.dumps(m)


def test_set_last_epoch_reads_nothing_ahead_of_the_next_epoch_and_still_serves_it(dataset):
    _, ds = dataset
    cfg = dict(batch_size=16, memory="10%", read_gap="whole", seed=3)

    def run(readahead, last=None, reopen=False):
        with brand.Loader(str(ds), readahead=readahead, **cfg) as loader:
            if last is not None:
                loader.set_last_epoch(last)
            if reopen:  # load_state_dict opens a new reader: the hint is kept
                loader.load_state_dict(loader.state_dict())
            e0 = [i for b in loader for i in b.ids.tolist()]
            issued = loader.metrics()["reads_issued"]
            e1 = [i for b in loader for i in b.ids.tolist()]
        return issued, e0, e1

    own, e0, e1 = run(0)  # no read-ahead: each read issued when reached
    ahead, a0, a1 = run(64 << 20)
    bounded, b0, b1 = run(64 << 20, last=0)
    kept, k0, k1 = run(64 << 20, last=0, reopen=True)
    assert ahead > own, f"read-ahead crosses into epoch 1: {ahead} reads, {own} of epoch 0"
    assert bounded == own == kept, (bounded, own, kept)
    assert sorted(e0) == sorted(e1) == list(range(len(e0))) and e0 != e1
    assert (a0, a1) == (b0, b1) == (k0, k1) == (e0, e1)
    with brand.Loader(str(ds), **cfg) as loader, pytest.raises(TypeError):
        loader.set_last_epoch("last")


def test_close_and_context_manager(dataset):
    _, ds = dataset
    with brand.Loader(ds, **CFG) as loader:
        batch = next(loader)
    with pytest.raises(brand.InvalidStateError, match="closed"):
        next(loader)
    assert len(batch.samples) == len(batch)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hung_loader_cfg() -> dict:
    """A node of a two-node job whose peer never comes: its first batch waits
    (up to peer_timeout) for the peer: a read that does not return."""
    return dict(nodes=[f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"], rank=0,
                peer_timeout="60s", batch_size=8, io_backend="threads")


def test_waiting_for_a_batch_releases_the_gil(dataset):
    _, ds = dataset
    loader = brand.Loader(ds, **dict(hung_loader_cfg(), peer_timeout="2s"))
    counts = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counts[0] += 1

    t = threading.Thread(target=count)
    t.start()
    start = time.monotonic()
    try:
        with pytest.raises(brand.BrandError):
            next(loader)
        waited = time.monotonic() - start
        during = counts[0]
        time.sleep(0.5)
        after_half_second = counts[0] - during
    finally:
        stop.set()
        t.join()
    assert waited >= 1.5
    # Holding the GIL while waiting would leave the counter at ~0 (the
    # 5 ms switch interval gives it nothing while the main thread is in C).
    assert during > after_half_second, (during, after_half_second)


def test_ctrl_c_interrupts_a_waiting_iteration_within_a_tenth_of_a_second(dataset, tmp_path):
    _, ds = dataset
    script = textwrap.dedent(f"""
        import sys, time, brand
        loader = brand.Loader({str(ds)!r}, **{hung_loader_cfg()!r})
        print("waiting", flush=True)
        try:
            next(loader)
        except KeyboardInterrupt:
            print("interrupted", time.monotonic(), flush=True)
            sys.exit(0)
        print("no interrupt", flush=True)
        sys.exit(1)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.5)  # well inside next()
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        line = proc.stdout.readline().split()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    assert line and line[0] == "interrupted", line
    assert float(line[1]) - sent < 0.1, f"KeyboardInterrupt {float(line[1]) - sent:.3f} s after SIGINT"


def test_an_interrupted_wait_loses_no_batch(dataset):
    """The batch being awaited when Ctrl-C came is the next one returned, and
    a state saved in between does not count it."""
    _, ds = dataset
    whole = uninterrupted(ds, epochs=1, **CFG)
    loader = brand.Loader(ds, **CFG)
    first = next(loader).ids.tolist()
    import _thread

    got = [first]
    interrupted = False
    try:
        # As SIGINT does: the flag is seen inside next(), after its request
        # went to the loader's thread.
        _thread.interrupt_main()
        got.append(next(loader).ids.tolist())
    except KeyboardInterrupt:
        interrupted = True
        assert loader.state_dict()["served"] == 16
    assert interrupted
    got += [b.ids.tolist() for b in loader]
    assert got == whole


def test_a_loader_opened_before_fork_raises_in_the_child(dataset):
    _, ds = dataset
    loader = brand.Loader(ds, **CFG)
    next(loader)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never hang
        os.close(r)
        try:
            next(loader)
            msg = "no error"
        except brand.ConfigError as e:
            msg = "ConfigError: " + str(e)
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            msg = f"{type(e).__name__}: {e}"
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the child hung")
    msg = os.read(r, 4096).decode()
    assert msg.startswith("ConfigError") and "fork" in msg, msg
    assert len(next(loader)) == 16  # the parent goes on


# -- brand's log in Python's logging (issue 55, item 7) ----------------------


def test_brands_log_reaches_the_brand_logger_at_the_programs_level(dataset, caplog):
    """run_length = "auto" says what it chose, at INFO: a record of the
    logger "brand" when the program's logging lets INFO through, none when
    brand's logger is at WARNING."""
    _, ds = dataset
    cfg = dict(run_length="auto", read_gap="1MiB", batch_size=16, seed=5)

    def chosen():
        return [r for r in caplog.records if r.name == "brand" and "run_length auto" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="brand"):
        with brand.Loader(ds, **cfg) as loader:
            next(loader)
        assert brand._brand._flush_log()
    assert chosen() == []
    with caplog.at_level(logging.INFO, logger="brand"):
        with brand.Loader(ds, **cfg) as loader:
            next(loader)
        assert brand._brand._flush_log()
    got = chosen()
    assert len(got) == 1 and got[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]
    assert "read gap" in got[0].getMessage()
