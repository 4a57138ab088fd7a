"""The order-quality experiment (bench/runners/order_quality.py), run once
outside the memory groups (it is small: scikit-learn's digits)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from . import parse
from .config import RUNNERS


def run(python: str, work: Path, brand: Path, budget: float, epochs: int, seeds: str, timeout: float = 900,
        env: dict | None = None, methods: str | None = None) -> dict:
    argv = [python, str(RUNNERS / "order_quality.py"), str(work), "--brand", str(brand), "--budget", str(budget),
            "--epochs", str(epochs), "--seeds", seeds]
    if methods:
        argv += ["--methods", methods]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": f"failed: timeout after {timeout:.0f} s"}
    return interpret(r.returncode, r.stdout, r.stderr)


def interpret(returncode: int, stdout: str, stderr: str = "") -> dict:
    lines = parse.runner_lines(stdout)
    result = next((x["result"] for x in lines if "result" in x), None)
    notes = {k: v for x in lines if "unavailable" in x for k, v in x["unavailable"].items()}
    if result is None:
        err = next((x["error"] for x in lines if "error" in x), None)
        tail = " | ".join(line for line in stderr.strip().splitlines()[-3:])
        return {"status": f"failed: {err or f'exit {returncode}'} {tail[-400:]}".strip()}
    result["status"] = "ok"
    if notes:
        result["unavailable"] = notes
    return result


def summary(oq: dict) -> dict:
    """method -> mean/min/max accuracy."""
    out = {}
    for m, v in (oq.get("methods") or {}).items():
        acc = v["accuracy"]
        out[m] = {"mean": sum(acc) / len(acc), "min": min(acc), "max": max(acc)}
    return out
