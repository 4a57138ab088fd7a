from brandbench import config, dataset, device


def test_sizes_and_budgets():
    assert config.parse_size("640MiB") == 640 << 20
    assert config.parse_size("2GiB") == 2 << 30
    assert config.parse_size("1.5G") == 1_500_000_000
    assert config.parse_size("4096") == 4096
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
    monkeypatch.setenv("BRAND_TF_LIB", str(tmp_path / "op.so"))
    assert config.brand_bin() == tmp_path / "b" and config.throughput_bin() == tmp_path / "t"
    assert config.tf_op_lib() == tmp_path / "op.so"


def test_fio_runtime_is_in_milliseconds():
    it = device.item("fio", ["/d/pack/data-00000.brd"], "randread", 4096, 32, 0.5, 7 << 20)
    assert "--runtime=500ms" in it.argv and "--time_based" in it.argv and "--direct=1" in it.argv
    assert "--filename=/d/pack/data-00000.brd" in it.argv and it.variant == "rand 4K QD32"
