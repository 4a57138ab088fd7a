"""cgroup file parsers and layout detection against a fake /sys/fs/cgroup."""

from brandbench import cgroups

PROC_V1 = """9:name=systemd:/
7:blkio:/
4:memory:/process_api/abc
2:cpuacct:/
0::/
"""


def test_parse_blkio_and_io_stat():
    v1 = "254:0 Read 1000\n254:0 Write 5\n254:16 Read 7\n254:0 Read 24\nTotal 1036\n"
    assert cgroups.parse_blkio_bytes(v1, "254:0") == 1024
    assert cgroups.parse_blkio_bytes(v1, "8:0") == 0
    v2 = "8:0 rbytes=9 wbytes=1\n254:0 rbytes=4096 wbytes=0 rios=1 wios=0\n"
    assert cgroups.parse_io_stat_bytes(v2, "254:0") == 4096


def test_parse_kv_and_rss():
    stat = cgroups.parse_kv("cache 100\nrss 50\ntotal_rss 70\ntotal_mapped_file 30\nbogus\nx y\n")
    assert stat["total_rss"] == 70 and "x" not in stat
    assert cgroups.rss_from_stat(stat, v2=False) == 100
    assert cgroups.rss_from_stat({"anon": 10, "file_mapped": 5, "file": 999}, v2=True) == 15


def test_own_group():
    assert cgroups.own_group(PROC_V1, "memory") == "/process_api/abc"
    assert cgroups.own_group(PROC_V1, "blkio") == "/"
    assert cgroups.own_group(PROC_V1, "") == "/"
    assert cgroups.own_group("0::/user.slice/x\n", "") == "/user.slice/x"


def test_detect_v1(tmp_path):
    for c in ("memory", "blkio", "cpuacct"):
        (tmp_path / c).mkdir()
        (tmp_path / c / "cgroup.procs").write_text("")
    (tmp_path / "memory" / "process_api" / "abc").mkdir(parents=True)
    (tmp_path / "memory" / "process_api" / "abc" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    lay = cgroups.detect(tmp_path, PROC_V1, euid=0)
    assert lay.version == 1
    assert lay.memory == tmp_path / "memory" / "process_api" / "abc"
    assert lay.blkio == tmp_path / "blkio"


def test_detect_v2_and_not_root(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    lay = cgroups.detect(tmp_path, "0::/user.slice\n", euid=0)
    assert lay.version == 2 and lay.unified == tmp_path / "user.slice"
    assert not cgroups.detect(tmp_path, "0::/\n", euid=1000).usable


def test_v1_groups_on_a_fake_tree(tmp_path):
    """Groups writes limits and throttles where v1 expects them, and wraps argv to join them."""
    for c in ("memory", "blkio", "cpuacct"):
        (tmp_path / c).mkdir()
    lay = cgroups.Layout(1, memory=tmp_path / "memory", blkio=tmp_path / "blkio", cpuacct=tmp_path / "cpuacct")
    g = cgroups.Groups(lay, "254:0")
    g.profile("net", 300, 380_000_000)
    net = tmp_path / "blkio" / f"{g.prefix}-net"
    assert (net / "blkio.throttle.read_iops_device").read_text() == "254:0 300"
    assert (net / "blkio.throttle.read_bps_device").read_text() == "254:0 380000000"
    run = g.run_group("net", 1 << 30)
    assert (run.mem / "memory.limit_in_bytes").read_text() == str(1 << 30)
    argv = run.wrap(["brand", "read", "x"])
    assert argv[:2] == ["/bin/sh", "-c"] and argv[-3:] == ["brand", "read", "x"]
    assert str(run.mem / "cgroup.procs") in argv[2] and str(net / "cgroup.procs") in argv[2]
    (net / "blkio.throttle.io_service_bytes").write_text("254:0 Read 4096\n")
    (tmp_path / "cpuacct" / f"{g.prefix}-net" / "cpuacct.usage").write_text("1500000000\n")
    c = run.counters()
    assert c.device_read_bytes == 4096 and c.cpu_seconds == 1.5
    # rmdir of a fake (regular) directory with files fails quietly; close() must not raise.
    g.release(run)
    g.close()
