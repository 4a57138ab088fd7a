"""The loaders measured, as runs (`Item`s), and whether each can run here.

Peers (each reads every sample once per epoch in random order and copies
every byte into its own buffers):

  files        `brand bench files DIR --threads T --json`: native open/read/close
  torch        PyTorch DataLoader, map-style over the files, num_workers 4 and 8
  spdl         SPDL's pipeline over the files (thread pool)
  tf-tfrecord  tf.data TFRecordDataset + interleave + shuffle(buffer = budget)
  tf-files     tf.data list_files + read_file

brand:

  brand        `brand read DS --memory B --policy P --read-gap G --json` (Rust API)
  capi         cpp-examples' brand_throughput (C ABI), --touch all
  tf-op        brand.tf.BrandDataset (the tf.data op), batched
  py-numpy     brand.Loader (the Python package), batches as NumPy arrays
  py-torch     brand.torch.BrandDataset(batched=True) through a torch DataLoader(batch_size=None)
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import config, parse
from .config import RUNNERS, pct
from .dataset import Dataset
from .execute import Item


@dataclass
class Plan:
    ds: Dataset
    python: str
    brand: Path
    throughput: Path
    budgets: list[float]
    ref_budget: float  # the peers' memory budget (their group, tf's shuffle buffer)
    batch_size: int = 64
    threads: int = 8
    seed: int = 1
    variants: list = field(default_factory=lambda: list(config.BRAND_VARIANTS))
    api_variants: list = field(default_factory=lambda: list(config.API_VARIANTS))
    api_budgets: list | None = None  # budgets of the C ABI and BrandDataset runs (None: all)
    skip: set = field(default_factory=set)
    unavailable: dict = field(default_factory=dict)  # loader -> why


def _has_module(python: str, module: str) -> bool:
    if python == os.sys.executable:
        return importlib.util.find_spec(module) is not None
    r = subprocess.run([python, "-c", f"import importlib.util,sys; sys.exit(importlib.util.find_spec('{module}') is None)"],
                       capture_output=True)
    return r.returncode == 0


def check(plan: Plan, log=print) -> dict[str, str]:
    """Why each unavailable loader cannot run here (loader -> reason)."""
    why = {}
    b = plan.brand
    if not (b.is_file() and os.access(b, os.X_OK)):
        why["brand"] = why["files"] = f"no brand CLI at {b} (BRAND_BIN; cargo build --release)"
    if not (plan.throughput.is_file() and os.access(plan.throughput, os.X_OK)):
        why["capi"] = f"no brand_throughput at {plan.throughput} (BRAND_THROUGHPUT_BIN; make cpp-test)"
    for loader, module in (("torch", "torch"), ("spdl", "spdl.pipeline"), ("tf-tfrecord", "tensorflow"),
                           ("tf-files", "tensorflow"), ("tf-op", "tensorflow"), ("order", "sklearn"),
                           ("py-numpy", "brand"), ("py-torch", "brand"), ("py-torch", "torch")):
        top = module.split(".")[0]
        if loader not in why and not _has_module(plan.python, top):
            why[loader] = f"{top} is not installed in {plan.python} (scripts/bench-venv.sh)"
    if "order" not in why and not _has_module(plan.python, "tensorflow"):
        why["order"] = "tensorflow is not installed"
    if plan.ds.tfrecord is None and "tf-tfrecord" not in why:
        why["tf-tfrecord"] = "no TFRecord shards (TensorFlow missing when the dataset was made)"
    if "tf-op" not in why:
        # brand.tf's op, compiled against the venv's TensorFlow (cached): once
        # here, so that no measured run pays for the compile.
        r = subprocess.run([plan.python, "-m", "brand.tf", "build"], capture_output=True, text=True,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        if r.returncode != 0:
            lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
            why["tf-op"] = "brand.tf's op does not build: " + (lines[-1] if lines else f"exit {r.returncode}")[:300]
    return why


def brand_name(policy: str, gap: str) -> str:
    return f"{policy}/{gap}"


def items(plan: Plan) -> list[Item]:
    """Every run of one round on one profile (fio's sweep aside)."""
    ds, py, out = plan.ds, plan.python, []
    off = plan.skip | set(plan.unavailable)
    B, T, seed = plan.batch_size, plan.threads, plan.seed
    ref = plan.ref_budget
    files = str(ds.files)

    def runner(loader, variant, name, script, args, budget=ref, **extra):
        return Item(loader, variant, name, [py, str(RUNNERS / script), *map(str, args)], kind="runner",
                    budget=budget, extra=extra)

    if "files" not in off:
        out.append(Item("files", f"t{T}", f"brand bench files ({T} threads)",
                        [str(plan.brand), "bench", "files", files, "--threads", str(T), "--seed", str(seed), "--json"],
                        budget=ref, parse=parse.bench_files))
    if "torch" not in off:
        for w in (4, 8):
            out.append(runner("torch", f"w{w}", f"PyTorch DataLoader ({w} workers)", "torch_files.py",
                              [files, "--workers", w, "--batch-size", B, "--seed", seed]))
    if "spdl" not in off:
        out.append(runner("spdl", f"t{T}", f"SPDL pipeline ({T} threads)", "spdl_files.py",
                          [files, "--threads", T, "--batch-size", B, "--seed", seed]))
    if "tf-files" not in off:
        out.append(runner("tf-files", "list_files", "tf.data list_files + read_file", "tf_files.py",
                          [files, "--batch-size", B, "--seed", seed]))
    for b in plan.budgets:
        if "tf-tfrecord" not in off:
            buf = max(1, int(round(b * ds.samples)))
            out.append(runner("tf-tfrecord", "shuffle", f"tf.data TFRecord + shuffle ({pct(b)})", "tf_tfrecord.py",
                              [ds.tfrecord, "--buffer", buf, "--batch-size", B, "--seed", seed,
                               "--samples", ds.samples], budget=b, shuffle_buffer=buf))
        if "brand" not in off:
            for pol, gap in plan.variants:
                out.append(Item("brand", brand_name(pol, gap), f"brand read {pol}/{gap} ({pct(b)})",
                                [str(plan.brand), "read", str(ds.pack), "--memory", pct(b), "--policy", pol,
                                 "--read-gap", gap, "--epochs", "1", "--batch", str(B), "--seed", str(seed),
                                 "--json"],
                                budget=b, parse=parse.brand_read, extra={"policy": pol, "read_gap": gap}))
        api = plan.api_budgets is None or b in plan.api_budgets
        if "capi" not in off and api:
            for pol, gap in plan.api_variants:
                cfg = (f'memory = "{pct(b)}"\npolicy = "{pol}"\nread_gap = "{gap}"\nbatch_size = {B}\n'
                       f"seed = {seed}\n")
                out.append(Item("capi", brand_name(pol, gap), f"C ABI brand_throughput {pol}/{gap} ({pct(b)})",
                                [str(plan.throughput), str(ds.pack), "--config", cfg, "--epochs", "1", "--touch",
                                 "all", "--json"],
                                budget=b, parse=parse.brand_throughput, extra={"policy": pol, "read_gap": gap}))
        if "tf-op" not in off and api:
            for pol, gap in plan.api_variants:
                out.append(runner("tf-op", brand_name(pol, gap), f"BrandDataset {pol}/{gap} ({pct(b)})", "tf_brand.py",
                                  [ds.pack, "--memory", pct(b), "--policy", pol, "--read-gap", gap,
                                   "--batch-size", B, "--seed", seed], budget=b, policy=pol, read_gap=gap))
        for entry, what in (("numpy", "brand.Loader -> NumPy"), ("torch", "brand.torch via DataLoader")):
            if f"py-{entry}" not in off and api:
                for pol, gap in plan.api_variants:
                    out.append(runner(f"py-{entry}", brand_name(pol, gap), f"{what} {pol}/{gap} ({pct(b)})",
                                      "py_brand.py", [ds.pack, "--api", entry, "--memory", pct(b), "--policy", pol,
                                                      "--read-gap", gap, "--batch-size", B, "--seed", seed],
                                      budget=b, policy=pol, read_gap=gap))
    return out
