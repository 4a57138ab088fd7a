"""From run records to figures: min/median/max over rounds, and ratios.

Every ratio is taken within one round on one profile (the same run
conditions: the disk drifts by 2x within minutes here), then summarised over
rounds: a loader's useful MB/s over the device ceiling of that round (the
best job of fio's sweep), and over PyTorch's DataLoader (8 workers) of that
round.
"""

from __future__ import annotations

import statistics

REFERENCE = ("torch", "w8")  # PyTorch DataLoader, 8 workers: the paper's baseline
LOADER_ORDER = ["fio", "files", "torch", "spdl", "tf-files", "tf-tfrecord", "brand", "capi", "tf-op", "py-numpy",
                "py-torch"]
PROFILE_ORDER = ["disk", "net"]


def stats(values) -> dict | None:
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"min": min(v), "median": statistics.median(v), "max": max(v), "n": len(v)}


def ok(rec: dict) -> bool:
    return rec.get("status") == "ok"


def ceilings(fio_runs: list[dict]) -> dict[tuple[str, int], dict]:
    """(profile, round) -> the best fio job of that round: {"mb_per_s", "job"}."""
    out = {}
    for r in fio_runs:
        if not ok(r) or r.get("useful_mb_per_s") is None:
            continue
        k = (r["profile"], r["round"])
        if k not in out or r["useful_mb_per_s"] > out[k]["mb_per_s"]:
            out[k] = {"mb_per_s": r["useful_mb_per_s"], "job": r["variant"]}
    return out


def references(runs: list[dict], ref=REFERENCE) -> dict[tuple[str, int], float]:
    """(profile, round) -> the reference loader's useful MB/s in that round."""
    return {
        (r["profile"], r["round"]): r["useful_mb_per_s"]
        for r in runs
        if ok(r) and (r["loader"], r["variant"]) == ref and r.get("useful_mb_per_s")
    }


def key(rec: dict) -> tuple:
    return rec["profile"], rec["loader"], rec["variant"], rec.get("budget")


def _sort_key(k: tuple, seen: dict) -> tuple:
    """Profile, loader, budget, then the order the variants were first run in."""
    profile, loader, variant, budget = k
    p = PROFILE_ORDER.index(profile) if profile in PROFILE_ORDER else len(PROFILE_ORDER)
    lo = LOADER_ORDER.index(loader) if loader in LOADER_ORDER else len(LOADER_ORDER)
    return p, lo, -1 if budget is None else budget, seen[k]


def summarize(runs: list[dict], fio_runs: list[dict], dataset_bytes: int | None = None) -> list[dict]:
    """One row per (profile, loader, variant, budget)."""
    ceil = ceilings(fio_runs)
    ref = references(runs)
    groups: dict[tuple, list[dict]] = {}
    seen: dict[tuple, int] = {}
    for r in sorted(runs, key=lambda r: r.get("round", 0)):
        groups.setdefault(key(r), []).append(r)
        seen.setdefault(key(r), len(seen))
    rows = []
    for k in sorted(groups, key=lambda k: _sort_key(k, seen)):
        recs = groups[k]
        good = [r for r in recs if ok(r)]
        first = recs[0]

        def ratio(table, r):
            d = table.get((r["profile"], r["round"]))
            base = d["mb_per_s"] if isinstance(d, dict) else d
            return r["useful_mb_per_s"] / base if base and r.get("useful_mb_per_s") else None

        limit = first.get("memory_limit_bytes")
        gaps = sorted({str(r["read_gap_used"]) for r in good if r.get("read_gap_used") is not None})
        row = {
            "profile": k[0],
            "loader": k[1],
            "variant": k[2],
            "budget": k[3],
            "name": first["name"],
            "runs": len(recs),
            "ok": len(good),
            "failures": sorted({r["status"] for r in recs if not ok(r)}),
            "mb_per_s": stats(r.get("useful_mb_per_s") for r in good),
            "samples_per_s": stats(r.get("samples_per_s") for r in good),
            "x_ceiling": stats(ratio(ceil, r) for r in good),
            "x_reference": stats(ratio(ref, r) for r in good),
            "read_amplification": stats(r.get("read_amplification") for r in good),
            "loader_read_amplification": stats(r.get("loader_read_amplification") for r in good),
            "peak_rss_bytes": stats(r.get("peak_rss_bytes") for r in good),
            "stall_p50_s": stats(r.get("stall_p50_s") for r in good),
            "stall_p99_s": stats(r.get("stall_p99_s") for r in good),
            "cpu_s_per_gb": stats(r.get("cpu_s_per_gb") for r in good),
            "exactly_once": None
            if all(r.get("exactly_once") is None for r in good) or not good
            else all(r.get("exactly_once") is not False for r in good),
            "memory_limit_bytes": limit,
            "larger_than_memory": (limit < dataset_bytes) if (limit and dataset_bytes) else None,
            "read_gap_used": gaps or None,
        }
        rows.append(row)
    return rows


def fio_summary(fio_runs: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in fio_runs:
        groups.setdefault((r["profile"], r["variant"]), []).append(r)
    rows = []
    for (profile, variant), recs in groups.items():
        good = [r for r in recs if ok(r)]
        first = recs[0]
        rows.append({
            "profile": profile,
            "job": variant,
            "rw": first.get("rw"),
            "bs": first.get("bs"),
            "qd": first.get("qd"),
            "mb_per_s": stats(r.get("useful_mb_per_s") for r in good),
            "iops": stats(r.get("iops") for r in good),
            "cpu_s_per_gb": stats(r.get("cpu_s_per_gb") for r in good),
            "failures": sorted({r["status"] for r in recs if not ok(r)}),
        })
    rows.sort(key=lambda r: (PROFILE_ORDER.index(r["profile"]) if r["profile"] in PROFILE_ORDER else 9,
                             r["rw"] or "", r["bs"] or 0, r["qd"] or 0))
    return rows


def ceiling_summary(fio_runs: list[dict]) -> dict[str, dict | None]:
    """profile -> min/median/max over rounds of the round's best fio job."""
    c = ceilings(fio_runs)
    out = {}
    for (profile, _round), v in sorted(c.items()):
        out.setdefault(profile, []).append(v["mb_per_s"])
    return {p: stats(v) for p, v in out.items()}
