import pytest

from brandbench import config, dataset, device


def test_sizes_are_read_as_brand_reads_them():
    # The cases of crates/format/src/units.rs's test, then the harness's own.
    assert config.parse_size("4096") == 4096
    assert config.parse_size("64KiB") == 65536
    assert config.parse_size("1.5g") == 3 << 29
    assert config.parse_size("2 MiB") == 2 << 20
    assert config.parse_size("16384T") == 1 << 54
    assert config.parse_size(" 7b ") == 7
    assert config.parse_size("0.5k") == 512
    for bad in ["10%", "x", "", "-1", "1e3", "kib"]:
        with pytest.raises(ValueError, match="not a byte count"):
            config.parse_size(bad)
    with pytest.raises(ValueError, match="too large"):
        config.parse_size("99999999999T")
    with pytest.raises(ValueError, match="not a number"):
        config.parse_size("1.0.0")
    # Every unit binary: "2G" is 2 GiB, as `brand --memory 2G`.
    for text in ["2G", "2g", "2GB", "2GiB", "2gib"]:
        assert config.parse_size(text) == 2 << 30, text
    assert config.parse_size("1KB") == config.parse_size("1k") == 1024
    assert config.parse_size("640MiB") == 640 << 20
    # Fractions round to the nearest byte, halves up as Rust's f64::round.
    assert config.parse_size("2.5b") == 3 and config.parse_size("0.5b") == 1 and config.parse_size("1.4b") == 1
    # The largest count is u64's, whole or fractional.
    assert config.parse_size("16777215T") == (1 << 64) - (1 << 40)
    for big in ["16777216T", "16777216.0T", "1" + "0" * 400 + ".5"]:
        with pytest.raises(ValueError, match="too large"):
            config.parse_size(big)


def test_budgets():
    assert config.parse_budgets("10,25%, 100") == [0.1, 0.25, 1.0]
    assert config.pct(0.1) == "10%" and config.pct(1.0) == "100%" and config.pct(None) == ""


def test_small_preset_is_larger_than_its_memory_groups():
    p = config.PRESETS["small"]
    data = p.samples * p.mean_kib * 1024
    for b in p.budgets:
        if b < 1:
            assert p.allowance + b * data < data
    assert config.PRESETS["full"].samples * 110 * 1024 >= 8 << 30


def test_fio_sweep_and_shards():
    jobs = device.sweep(7 << 20)
    assert len(jobs) == 12 and ("randread", 4096, 1) in jobs and ("read", 7 << 20, 32) in jobs
    assert device.job_name("randread", 7 << 20, 32, 7 << 20) == "rand chunk QD32"
    assert device.job_name("read", 131072, 1, 7 << 20) == "seq 128K QD1"
    assert dataset.shard_count(10 << 20) == 8 and dataset.shard_count(9 * 10**9) == 68


def test_env_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("BRAND_BIN", str(tmp_path / "b"))
    monkeypatch.setenv("BRAND_THROUGHPUT_BIN", str(tmp_path / "t"))
    assert config.brand_bin() == tmp_path / "b" and config.throughput_bin() == tmp_path / "t"


def test_fio_runtime_is_in_milliseconds():
    it = device.item("fio", ["/d/pack/data-00000.brd"], "randread", 4096, 32, 0.5, 7 << 20)
    assert "--runtime=500ms" in it.argv and "--time_based" in it.argv and "--direct=1" in it.argv
    assert "--filename=/d/pack/data-00000.brd" in it.argv and it.variant == "rand 4K QD32"
