"""Every fio command the harness builds is read-only: fio lays out (writes) a
file it finds smaller than the job's size, and once overwrote a packed segment."""

import hashlib
import json
import shutil
import subprocess

import pytest

import compare
import engine
from brandbench import device


def segments(tmp_path):
    """Two segment files of unequal size, as a pack's last segment is."""
    ds = tmp_path / "ds"
    ds.mkdir()
    for name, size in (("data-00000.brd", 3 << 19), ("data-00001.brd", 1 << 19)):
        (ds / name).write_bytes(bytes(i * 7 % 251 for i in range(size)))
    return ds


def digests(ds):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(ds.iterdir())}


def commands(ds):
    """name -> argv of every fio invocation under bench/."""
    segs = [str(p) for p in sorted(ds.iterdir())]
    return {
        "engine": engine.fio_cmd(segs),
        "engine 1 pass": engine.fio_cmd(segs, loops=1),
        "engine small records": engine.fio_small_cmd(segs, 4, 100),
        "compare": compare.fio_cmd(str(ds), 5),
        **{f"device {rw} {bs} QD{qd}": device.item("fio", segs, rw, bs, qd, 0.5, 1 << 20).argv
           for rw, bs, qd in device.sweep(1 << 20)},
    }


def test_every_fio_command_is_readonly(tmp_path):
    cmds = commands(segments(tmp_path))
    assert len(cmds) == 16
    for name, argv in cmds.items():
        assert argv[0].endswith("fio"), name
        assert "--readonly" in argv, name


def test_engine_reads_the_files_own_sizes(tmp_path):
    # With --readonly, a --size above a file's share makes fio refuse the job
    # (no JSON, exit 0); the files' own sizes are the region instead.
    ds = segments(tmp_path)
    argv = engine.fio_cmd([str(p) for p in sorted(ds.iterdir())], loops=3)
    assert not any(a.startswith("--size") for a in argv)
    assert f"--io_size={3 * (2 << 20)}" in argv


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed (apt-get install fio)")
def test_engine_fio_leaves_unequal_segments_intact(tmp_path):
    ds = segments(tmp_path)
    before = digests(ds)
    argv = engine.fio_cmd([str(p) for p in sorted(ds.iterdir())], loops=2)
    r = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert digests(ds) == before, r.stderr
    read = json.loads(r.stdout)["jobs"][0]["read"]
    assert read["io_bytes"] == 2 * (2 << 20)


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed (apt-get install fio)")
def test_engine_small_record_fio_reads_as_many_blocks_as_asked(tmp_path):
    ds = segments(tmp_path)
    before = digests(ds)
    r = subprocess.run(engine.fio_small_cmd([str(p) for p in sorted(ds.iterdir())], 4, 300),
                       capture_output=True, text=True, check=True)
    assert digests(ds) == before, r.stderr
    read = json.loads(r.stdout)["jobs"][0]["read"]
    assert (read["total_ios"], read["io_bytes"]) == (300, 300 * 4096)


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed (apt-get install fio)")
def test_engine_small_record_fio_cpu_in_run_leaves_out_start_up_only(tmp_path):
    # In-run CPU is the whole process's less a one-block run's: positive, below the
    # whole, and (the job thread being only part of the process) at least the job's.
    ds = segments(tmp_path)
    f, _ = engine.fio_small(str(ds), 4, 25_000)
    assert 0 < f["cpu_per_io_run"] < f["cpu_per_io"], f
    assert f["cpu_per_io_run"] >= 0.8 * f["cpu_per_io_job"], f
