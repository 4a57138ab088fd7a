"""results.json -> a Markdown report and PNG plots (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from . import config
from .config import pct

MiB = 1 << 20


def _f(x, fmt="{:.0f}", none="–"):
    return none if x is None else fmt.format(x)


def _med(s, fmt="{:.0f}", scale=1.0):
    return "–" if not s else fmt.format(s["median"] * scale)


def _range(s, fmt="{:.0f}", scale=1.0):
    if not s:
        return "–"
    m = fmt.format(s["median"] * scale)
    if s["n"] < 2:
        return m
    return f"{m} ({fmt.format(s['min'] * scale)}–{fmt.format(s['max'] * scale)})"


def row_label(row: dict) -> str:
    return row["name"]


def loader_table(rows: list[dict]) -> list[str]:
    out = [
        "| loader | budget | useful MB/s median (min–max) | × ceiling | × PyTorch w8 | read amp. | peak RSS MiB "
        "| stall P50 / P99 ms | CPU s/GB | runs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["loader"] == "fio":
            continue
        runs = f"{r['ok']}/{r['runs']}"
        if r["failures"]:
            runs += " ⚠"
        stall = "–"
        if r.get("stall_p50_s") or r.get("stall_p99_s"):
            stall = f"{_med(r['stall_p50_s'], '{:.1f}', 1e3)} / {_med(r['stall_p99_s'], '{:.1f}', 1e3)}"
        budget = pct(r["budget"])
        if r.get("larger_than_memory") is False:
            budget += " †"
        out.append(
            f"| {row_label(r)} | {budget} | {_range(r['mb_per_s'])} | {_med(r['x_ceiling'], '{:.2f}')} "
            f"| {_med(r['x_reference'], '{:.2f}')} | {_med(r['read_amplification'], '{:.2f}')} "
            f"| {_med(r['peak_rss_bytes'], '{:.0f}', 1 / MiB)} | {stall} | {_med(r['cpu_s_per_gb'], '{:.2f}')} "
            f"| {runs} |"
        )
    return out


def fio_table(rows: list[dict], profiles: list[str]) -> list[str]:
    jobs = []
    for r in rows:
        if r["job"] not in jobs:
            jobs.append(r["job"])
    by = {(r["profile"], r["job"]): r for r in rows}
    head = "| fio job (io_uring, O_DIRECT) | " + " | ".join(f"{p} MB/s median (min–max) | {p} IOPS" for p in profiles)
    out = [head + " |", "|---|" + "---|---|" * len(profiles)]
    for j in jobs:
        cells = []
        for p in profiles:
            r = by.get((p, j))
            cells.append(_range(r["mb_per_s"]) if r else "–")
            cells.append(_med(r["iops"]) if r else "–")
        out.append(f"| {j} | " + " | ".join(cells) + " |")
    return out


def order_table(oq: dict) -> list[str]:
    out = [
        f"{oq['dataset']}: {oq['train']} training samples sorted by label, {oq['test']} test; a Keras MLP, "
        f"{oq['epochs']} epochs, batch {oq['batch_size']}; budget {pct(oq['budget'])} "
        f"(shuffle buffer {oq['shuffle_buffer']} samples); seeds {', '.join(map(str, oq['seeds']))}.",
        "",
        "| feed | test accuracy mean (min–max) | per seed | labels per batch (epoch 1, of 10) |",
        "|---|---|---|---|",
    ]
    for m, v in oq["methods"].items():
        acc = v["accuracy"]
        mean = sum(acc) / len(acc)
        out.append(f"| {m} | {mean:.3f} ({min(acc):.3f}–{max(acc):.3f}) | {', '.join(f'{a:.3f}' for a in acc)} "
                   f"| {v['labels_per_batch']:.1f} |")
    return out


def markdown(res: dict) -> str:
    meta, ds = res.get("meta", {}), res.get("dataset", {})
    profiles = [p for p in res.get("profiles", {}) if res["profiles"][p].get("available")]
    lines = [f"# brand bench: {meta.get('preset', '')} preset, {meta.get('started', '')}", ""]
    if ds:
        lines.append(
            f"Dataset: {ds.get('samples')} samples, {ds.get('stored_bytes', 0) / 1e9:.2f} GB "
            f"(mean {ds.get('mean_sample_bytes', 0) / 1024:.0f} KiB; chunks of {ds.get('chunk_size')}, "
            f"{ds.get('mean_chunk_bytes', 0) / MiB:.1f} MiB mean). "
            f"{meta.get('rounds', '?')} interleaved rounds; one epoch per run, every sample once, random order."
        )
    if meta.get("memory"):
        lines.append(f"Memory: {meta['memory']}")
    if meta.get("cache"):
        lines.append(f"Page cache: {meta['cache']}")
    for p, info in res.get("profiles", {}).items():
        lines.append(f"Profile `{p}`: {info.get('description', '')}")
    lines.append("")
    if res.get("recommendation"):
        lines += ["## Recommendation", ""]
        lines += [f"- {r['text']}" for r in res["recommendation"]]
        lines.append("")
    summary = res.get("summary", [])
    ceil = res.get("ceiling", {})
    for p in profiles:
        rows = [r for r in summary if r["profile"] == p]
        c = ceil.get(p)
        lines += [f"## Loaders on `{p}`", ""]
        if c:
            lines.append(f"Device ceiling (best fio job per round): {_range(c)} MB/s.")
            lines.append("")
        lines += loader_table(rows)
        lines.append("")
    lines += [
        "Useful MB/s = sample bytes delivered / epoch seconds. Ratios are taken per round, then the median. "
        "Read amplification = bytes the group read from the block device / sample bytes. Peak RSS = the "
        "memory group's anonymous + mapped pages, sampled every 50 ms (all processes of the loader, its "
        "runtime included). Stalls = the consumer's wait per batch. CPU = the group's CPU time (every "
        "thread and process) per GB delivered. † = the run's memory group is not smaller than the dataset (always so at a 100 % budget): not a larger-than-memory run.",
        "",
    ]
    fio_rows = res.get("fio_summary", [])
    if fio_rows:
        lines += ["## Device sweep (fio)", ""] + fio_table(fio_rows, profiles) + [""]
    oq = res.get("order_quality")
    if oq:
        lines += ["## Order quality in training", ""]
        if oq.get("methods"):
            lines += order_table(oq)
        else:
            lines.append(oq.get("status", "not run"))
        lines.append("")
    un = res.get("unavailable", {})
    failed = [r for r in summary if r["failures"]]
    if un or failed:
        lines += ["## Unavailable or failed", ""]
        for k, v in un.items():
            lines.append(f"- {k}: unavailable: {v}")
        for r in failed:
            lines.append(f"- {r['profile']} / {r['name']}: {'; '.join(r['failures'])}")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- plots


def _bars(ax, labels, stats, scale=1.0, color="C0"):
    import numpy as np

    y = np.arange(len(labels))
    med = [s["median"] * scale if s else 0 for s in stats]
    lo = [(s["median"] - s["min"]) * scale if s else 0 for s in stats]
    hi = [(s["max"] - s["median"]) * scale if s else 0 for s in stats]
    ax.barh(y, med, xerr=[lo, hi], color=color, capsize=2)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)


def _loader_plot(res, path, field, xlabel, scale=1.0, title=""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = [r for r in res.get("summary", []) if r["loader"] != "fio"]
    profiles = [p for p in res.get("profiles", {}) if any(r["profile"] == p for r in summary)]
    if not profiles:
        return None
    n = max(len([r for r in summary if r["profile"] == p]) for p in profiles)
    fig, axes = plt.subplots(1, len(profiles), figsize=(6.5 * len(profiles), 0.28 * n + 1.5), squeeze=False)
    for ax, p in zip(axes[0], profiles):
        rows = [r for r in summary if r["profile"] == p]
        colors = ["C1" if r["loader"] in config.BRAND_LOADERS else "C0" for r in rows]
        labels = [r["name"] for r in rows]
        _bars(ax, labels, [r.get(field) for r in rows], scale)
        for patch, c in zip(ax.patches, colors):
            patch.set_color(c)
        ax.set_title(f"{title} — {p}", fontsize=9)
        ax.set_xlabel(xlabel)
        c = res.get("ceiling", {}).get(p)
        if field == "mb_per_s" and c:
            ax.axvline(c["median"], color="k", ls="--", lw=1)
            ax.text(c["median"], -0.6, " fio ceiling", fontsize=7, va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_device(res, path):
    rows = res.get("fio_summary", [])
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    profiles = [p for p in res.get("profiles", {}) if any(r["profile"] == p for r in rows)]
    jobs = []
    for r in rows:
        if r["job"] not in jobs:
            jobs.append(r["job"])
    by = {(r["profile"], r["job"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(jobs) * len(profiles)), 4))
    x = np.arange(len(jobs))
    w = 0.8 / max(1, len(profiles))
    for i, p in enumerate(profiles):
        st = [by.get((p, j), {}).get("mb_per_s") for j in jobs]
        med = [s["median"] if s else 0 for s in st]
        err = [[(s["median"] - s["min"]) if s else 0 for s in st], [(s["max"] - s["median"]) if s else 0 for s in st]]
        ax.bar(x + i * w - 0.4 + w / 2, med, w, yerr=err, capsize=2, label=p)
    ax.set_xticks(x)
    ax.set_xticklabels(jobs, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("MB/s")
    ax.set_title("fio sweep (io_uring, O_DIRECT): median, min–max", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_order(res, path):
    oq = res.get("order_quality") or {}
    m = oq.get("methods")
    if not m:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    names = list(m)
    for i, n in enumerate(names):
        acc = m[n]["accuracy"]
        ax.scatter([i] * len(acc), acc, color="C0", s=12)
        ax.bar(i, sum(acc) / len(acc), color="C0", alpha=0.4)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("test accuracy")
    ax.set_title(f"label-sorted source, budget {pct(oq.get('budget'))}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plots(res: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = [
        _loader_plot(res, out / "throughput.png", "mb_per_s", "useful MB/s (median, min–max)", title="useful MB/s"),
        _loader_plot(res, out / "amplification.png", "read_amplification", "device bytes read / sample bytes",
                     title="read amplification"),
        _loader_plot(res, out / "peak_rss.png", "peak_rss_bytes", "peak RSS of the memory group (MiB)",
                     scale=1 / MiB, title="peak RSS"),
        plot_device(res, out / "device.png"),
        plot_order(res, out / "order_quality.png"),
    ]
    return [p for p in made if p]
