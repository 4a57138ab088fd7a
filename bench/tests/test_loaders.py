"""The runs a round is made of (no program is started)."""

from pathlib import Path

from brandbench import loaders
from brandbench.dataset import Dataset


def _plan(**kw):
    ds = Dataset(root=Path("/d"), files=Path("/d/files"), pack=Path("/d/pack"), tfrecord=Path("/d/tfrecord"),
                 samples=1000, stored_bytes=10**9, pack_bytes=10**9, chunk_size=64, chunks=16,
                 mean_sample_bytes=1e6, mean_chunk_bytes=64 << 20, shards=8)
    return loaders.Plan(ds=ds, python="/venv/bin/python", brand=Path("/b/brand"), throughput=Path("/b/tp"),
                        budgets=[0.1, 0.25, 1.0], ref_budget=0.1, **kw)


def test_every_loader_and_budget():
    items = loaders.items(_plan())
    by = {}
    for it in items:
        by.setdefault(it.loader, []).append(it)
    assert [i.variant for i in by["torch"]] == ["w4", "w8"] and all(i.kind == "runner" for i in by["torch"])
    assert len(by["brand"]) == 5 * 3 and len(by["capi"]) == 3 and len(by["tf-op"]) == 3
    # The Python package: brand.Loader -> NumPy and brand.torch through a DataLoader, per budget.
    for entry in ("numpy", "torch"):
        runs = by[f"py-{entry}"]
        assert [i.budget for i in runs] == [0.1, 0.25, 1.0] and all(i.kind == "runner" for i in runs)
        argv = runs[0].argv
        assert argv[1].endswith("py_brand.py") and argv[argv.index("--api") + 1] == entry
        assert argv[2] == "/d/pack" and "10%" in argv and argv[argv.index("--read-gap") + 1] == "auto"
    assert [i.extra["shuffle_buffer"] for i in by["tf-tfrecord"]] == [100, 250, 1000]
    whole = next(i for i in by["brand"] if i.variant == "brand/whole" and i.budget == 0.25)
    assert whole.argv[:3] == ["/b/brand", "read", "/d/pack"]
    assert whole.argv[whole.argv.index("--read-gap") + 1] == "whole" and "25%" in whole.argv
    capi = by["capi"][0]
    assert 'memory = "10%"' in capi.argv[capi.argv.index("--config") + 1] and "all" in capi.argv
    # Peers run at the reference budget.
    assert {i.budget for i in by["torch"] + by["spdl"] + by["files"] + by["tf-files"]} == {0.1}


def test_skip_unavailable_and_api_budgets():
    items = loaders.items(_plan(skip={"torch"}, unavailable={"spdl": "no"}, api_budgets=[0.1]))
    loaders_run = {i.loader for i in items}
    assert "torch" not in loaders_run and "spdl" not in loaders_run
    assert [i.budget for i in items if i.loader in ("capi", "tf-op", "py-numpy", "py-torch")] == [0.1] * 4
