"""Which policy and read gap win on this device at each budget, from the
measured figures (`brand read` runs), among the policies whose order is
near-uniform (`brand simulate`'s chunk-mate dispersion; 1 = a uniform
shuffle). A policy that is faster but mixes samples only within a window
(chunk-shuffle at small budgets) is named, not recommended.
"""

from __future__ import annotations

from .config import pct

MIN_DISPERSION = 0.75  # brand's own protocol scores ~0.8-0.9 at 10-25 %; chunk-shuffle ~0.06-0.2
NOISE = 0.05  # medians closer than this are called a tie


def _gap_text(used) -> str:
    if not used:
        return ""
    parts = []
    for u in used:
        parts.append("whole chunks" if u == "whole" else f"{int(u) // 1024} KiB" if str(u).isdigit() else str(u))
    return ", ".join(parts)


def recommend(summary: list[dict], simulate: dict | None = None) -> list[dict]:
    """One recommendation per (profile, budget) that has brand runs."""
    simulate = simulate or {}
    cells: dict[tuple, list[dict]] = {}
    for row in summary:
        if row["loader"] == "brand" and row.get("mb_per_s"):
            cells.setdefault((row["profile"], row["budget"]), []).append(row)
    out = []
    for (profile, budget), rows in cells.items():
        rows = sorted(rows, key=lambda r: -r["mb_per_s"]["median"])

        def dispersion(r):
            pol = r["variant"].split("/")[0]
            return simulate.get(pol, {}).get(pct(budget), {}).get("chunk_mate_dispersion")

        good = [r for r in rows if dispersion(r) is None or dispersion(r) >= MIN_DISPERSION]
        excluded = [r for r in rows if r not in good]
        best = (good or rows)[0]
        pol, gap = best["variant"].split("/")
        rec = {
            "profile": profile,
            "budget": budget,
            "policy": pol,
            "read_gap": gap,
            "read_gap_used": best.get("read_gap_used"),
            "mb_per_s": best["mb_per_s"]["median"],
            "x_ceiling": (best.get("x_ceiling") or {}).get("median"),
            "x_reference": (best.get("x_reference") or {}).get("median"),
            "dispersion": dispersion(best),
            "ranking": [(r["variant"], r["mb_per_s"]["median"]) for r in rows],
        }
        text = f"{profile} at {pct(budget)}: policy `{pol}`, read gap `{gap}`"
        if gap == "auto" and best.get("read_gap_used"):
            text += f" (chose {_gap_text(best['read_gap_used'])})"
        text += f": {rec['mb_per_s']:.0f} MB/s useful (median)"
        if rec["x_ceiling"]:
            text += f", {rec['x_ceiling']:.2f}x the device ceiling"
        if rec["x_reference"]:
            text += f", {rec['x_reference']:.1f}x PyTorch DataLoader (8 workers)"
        runner_up = next((r for r in (good or rows) if r is not best), None)
        if runner_up:
            ratio = runner_up["mb_per_s"]["median"] / rec["mb_per_s"]
            tie = " (a tie within noise)" if ratio > 1 - NOISE else ""
            text += f"; next {runner_up['variant']} at {runner_up['mb_per_s']['median']:.0f} MB/s{tie}"
        faster = [r for r in excluded if r["mb_per_s"]["median"] > rec["mb_per_s"]]
        for r in faster:
            text += (f"; {r['variant']} is faster ({r['mb_per_s']['median']:.0f} MB/s) but its order is far from "
                     f"a shuffle (dispersion {dispersion(r):.2f})")
        rec["text"] = text + "."
        out.append(rec)
    out.sort(key=lambda r: (r["profile"] != "disk", r["budget"] if r["budget"] is not None else 9))
    return out
