#!/usr/bin/env python3
"""Builds brand_tf/_brand_tf_ops.so against the TensorFlow installed in this Python.

    python tf-op/build.py [--lib PATH/libbrand.a] [--force]

A built op only loads into the TensorFlow minor version it was compiled
against (TF's C++ ABI and abseil's versioned namespace change between
minors), so this runs wherever the op is used, against the installed TF,
and records that version in brand_tf/_build_info.py for the loader to check.

The brand C ABI is linked statically (libbrand.a, from
`cargo build --release -p brand-capi`) with its symbols hidden. The new .so
is loaded in a subprocess before it replaces the old one, so a broken build
never lands in the package (and a crash while loading cannot take down this
script).
"""

import argparse
import hashlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SRC = HERE / "src" / "brand_dataset_op.cc"
PKG = HERE / "brand_tf"
OUT = PKG / "_brand_tf_ops.so"
INFO = PKG / "_build_info.py"
HEADER_DIR = REPO / "capi" / "include"

# What a Rust staticlib needs from the system (`cargo rustc --release -p
# brand-capi --lib --crate-type staticlib -- --print native-static-libs`);
# -Wl,--no-undefined turns a missing one into a link error here.
NATIVE_LIBS = ["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"]


def default_lib():
    target = os.environ.get("CARGO_TARGET_DIR") or str(REPO / "target")
    return Path(target) / "release" / "libbrand.a"


def tf_version_parts(version):
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if not m:
        sys.exit(f"build.py: cannot parse TensorFlow version {version!r}")
    return tuple(int(x) for x in m.groups())


def digest(paths, extra):
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).read_bytes())
    h.update(extra.encode())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", type=Path, default=None, help="libbrand.a (default: $CARGO_TARGET_DIR/release/libbrand.a)")
    ap.add_argument("--force", action="store_true", help="rebuild even if nothing changed")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    args = ap.parse_args()
    lib = (args.lib or default_lib()).resolve()
    if not lib.is_file():
        sys.exit(f"build.py: {lib} not found: run `cargo build --release --locked -p brand-capi` first")

    import tensorflow as tf

    major, minor, patch = tf_version_parts(tf.__version__)
    include = tf.sysconfig.get_include()
    # -isystem for TF's headers: their own warnings are not ours to fix, and
    # hiding them keeps -Wall -Wextra useful for this file.
    cflags = [f for f in tf.sysconfig.get_compile_flags() if not f.startswith("-I")]
    lflags = tf.sysconfig.get_link_flags()
    cmd = [
        args.cxx, "-std=c++17", "-shared", "-fPIC", "-O2", "-DNDEBUG",
        # Nothing of ours needs exporting: TF finds the op through the
        # static registrars, which run at load time regardless.
        "-fvisibility=hidden", "-fvisibility-inlines-hidden",
        "-Wall", "-Wextra",
        "-isystem", include, *cflags,
        f"-DTF_MAJOR_VERSION={major}", f"-DTF_MINOR_VERSION={minor}", f"-DTF_PATCH_VERSION={patch}",
        f"-I{HEADER_DIR}", str(SRC),
        "-o", "OUT",
        *lflags, str(lib), *NATIVE_LIBS,
        # The Rust core's symbols stay inside this .so; ABI mistakes (e.g. a
        # wrong _GLIBCXX_USE_CXX11_ABI) fail here, not at load time.
        "-Wl,--exclude-libs,ALL", "-Wl,--no-undefined",
    ]
    stamp = digest([SRC, HEADER_DIR / "brand.h", lib], tf.__version__ + " ".join(cmd))
    if not args.force and OUT.is_file() and INFO.is_file() and f"BUILD_DIGEST = {stamp!r}" in INFO.read_text():
        print(f"build.py: {OUT.relative_to(REPO)} is up to date (TensorFlow {tf.__version__})")
        return

    with tempfile.TemporaryDirectory(prefix="brand-tf-build-") as tmp:
        tmp_so = Path(tmp) / OUT.name
        cmd[cmd.index("OUT")] = str(tmp_so)
        print("build.py:", shlex.join(cmd), flush=True)
        t0 = time.monotonic()
        subprocess.run(cmd, check=True)
        print(f"build.py: compiled in {time.monotonic() - t0:.1f} s", flush=True)
        # Smoke-load in a fresh interpreter, with a timeout: an undefined
        # symbol or a crash in a static initializer shows up here.
        smoke = (
            "import sys, tensorflow as tf\n"
            "m = tf.load_op_library(sys.argv[1])\n"
            "assert hasattr(m, 'brand_dataset'), dir(m)\n"
        )
        r = subprocess.run([sys.executable, "-c", smoke, str(tmp_so)], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            sys.exit(f"build.py: the new op does not load:\n{r.stderr[-4000:]}")
        os.replace(tmp_so, OUT)
    INFO.write_text(
        "# Written by tf-op/build.py: the TensorFlow this _brand_tf_ops.so was built\n"
        "# against (it loads only into the same major.minor).\n"
        f"TF_VERSION = {tf.__version__!r}\n"
        f"BUILD_DIGEST = {stamp!r}\n"
    )
    print(f"build.py: wrote {OUT.relative_to(REPO)} for TensorFlow {tf.__version__}")


if __name__ == "__main__":
    main()
