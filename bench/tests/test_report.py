"""Markdown and plots from the tiny fake results.json (matplotlib only)."""

import json

import pytest

from brandbench import recommend, report, results

from fake import results as fake_results


def _finished():
    res = fake_results()
    runs = [r for r in res["runs"] if r["loader"] != "fio"]
    fio = [r for r in res["runs"] if r["loader"] == "fio"]
    res["summary"] = results.summarize(runs, fio, res["dataset"]["stored_bytes"])
    res["fio_summary"] = results.fio_summary(fio)
    res["ceiling"] = results.ceiling_summary(fio)
    res["recommendation"] = recommend.recommend(res["summary"], res["simulate"])
    return json.loads(json.dumps(res))  # as read back from results.json


def test_markdown_tables():
    md = report.markdown(_finished())
    assert "## Recommendation" in md and "disk at 10%: policy `brand`, read gap `auto`" in md
    assert "## Loaders on `disk`" in md and "## Loaders on `net`" in md
    line = next(x for x in md.splitlines() if x.startswith("| brand read brand/auto (10%) |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2] == "1125 (750–1500)" and cells[3] == "0.60" and cells[4] == "7.50" and cells[5] == "1.03"
    assert "| brand read brand/auto (100%) | 100% † |" in md
    assert "| C ABI brand/auto (10%) | 10% | 1400 | " in md and "1/2 ⚠" in md
    assert "## Device sweep (fio)" in md and "| seq chunk QD32 | 1875 (1250–2500) |" in md
    assert "| tf-shuffle | 0.450 (0.400–0.500) |" in md
    assert "spdl: unavailable: spdl is not installed" in md
    assert "failed: exit 1" in md


def test_plots(tmp_path):
    pytest.importorskip("matplotlib")
    made = report.plots(_finished(), tmp_path)
    names = sorted(p.name for p in made)
    assert names == ["amplification.png", "device.png", "order_quality.png", "peak_rss.png", "throughput.png"]
    for p in made:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_report_without_optional_parts(tmp_path):
    res = _finished()
    for k in ("order_quality", "fio_summary", "recommendation", "unavailable"):
        res.pop(k)
    res["runs"] = [r for r in res["runs"] if r["loader"] != "fio"]
    md = report.markdown(res)
    assert "## Device sweep" not in md and "## Order quality" not in md
    assert report.plot_device(res, tmp_path / "d.png") is None
