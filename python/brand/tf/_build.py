"""Builds brand.tf's op library against the TensorFlow installed here, once.

A TensorFlow op loads only into the TensorFlow major.minor it was compiled
against (TF's C++ ABI and abseil's versioned namespace change between
minors), so no prebuilt op can ship in the wheel. The wheel carries the op's
source and brand.h (in brand._brand); the op is compiled on first use (or by
``python -m brand.tf build``) and linked against brand._brand itself, which
exports brand's C ABI: one copy of brand in the process.

The result is cached per TensorFlow version and source digest under
``$BRAND_CACHE_DIR/tf-op`` (else ``$XDG_CACHE_HOME/brand/tf-op``, else
``~/.cache/brand/tf-op``). Two processes building at once take turns on a
file lock, and the library appears under its final name only complete
(atomic rename), so a reader never loads half a file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import brand
from brand import _brand

LIBRARY = "_brand_tf_ops.so"
# The source #errors outside this range (the DatasetBase API it is written against).
MIN_TF = (2, 16)
# Bumped when the build recipe changes in a way the command line does not show.
RECIPE = "1"


class BuildError(ImportError):
    """The op library for the installed TensorFlow is missing and cannot be
    built (or does not load); the message names the versions and the fix."""


def cache_root() -> Path:
    """Where built op libraries are kept."""
    if os.environ.get("BRAND_CACHE_DIR"):
        return Path(os.environ["BRAND_CACHE_DIR"]) / "tf-op"
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "brand" / "tf-op"
    return Path.home() / ".cache" / "brand" / "tf-op"


def tf_version_parts(version: str) -> tuple[int, int, int]:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if not m:
        raise BuildError(f"brand.tf: cannot parse the TensorFlow version {version!r}")
    return tuple(int(x) for x in m.groups())


def check_supported(version: str) -> tuple[int, int, int]:
    """The version's parts, if brand.tf's op builds against it."""
    parts = tf_version_parts(version)
    if parts[0] != MIN_TF[0] or parts[1] < MIN_TF[1]:
        raise BuildError(
            f"brand.tf needs TensorFlow {MIN_TF[0]}.{MIN_TF[1]} or a later {MIN_TF[0]}.x; TensorFlow {version} "
            f"is installed (brand {brand.__version__})"
        )
    return parts


class Build:
    """The compile command for the running TensorFlow and where its output goes."""

    def __init__(self, tf, cxx: str | None = None):
        self.tf_version = tf.__version__
        major, minor, patch = check_supported(self.tf_version)
        self.cxx = cxx or os.environ.get("CXX") or "g++"
        self.include = tf.sysconfig.get_include()
        # The extension module brand._brand: the op links against it, and
        # finds it again at load time through the rpath.
        self.extension = Path(_brand.__file__).resolve()
        self.sources = {"brand_dataset_op.cc": _brand.TF_OP_SOURCE, "brand.h": _brand.BRAND_H}
        # -isystem for TF's headers: their warnings are not ours to fix.
        cflags = [f for f in tf.sysconfig.get_compile_flags() if not f.startswith("-I")]
        ext_dir = str(self.extension.parent)
        self.command = [
            self.cxx, "-std=c++17", "-shared", "-fPIC", "-O2", "-DNDEBUG",
            # Nothing of ours needs exporting: TF finds the op through the
            # static registrars, which run at load time regardless.
            "-fvisibility=hidden", "-fvisibility-inlines-hidden",
            "-isystem", self.include, *cflags,
            f"-DTF_MAJOR_VERSION={major}", f"-DTF_MINOR_VERSION={minor}", f"-DTF_PATCH_VERSION={patch}",
            "-I", "SRC", "SRC/brand_dataset_op.cc", "-o", "OUT",
            *tf.sysconfig.get_link_flags(),
            f"-L{ext_dir}", f"-l:{self.extension.name}", f"-Wl,-rpath,{ext_dir}",
            # ABI mistakes (a wrong _GLIBCXX_USE_CXX11_ABI, a missing brand_
            # symbol) fail here, not when TensorFlow loads the op.
            "-Wl,--no-undefined",
        ]
        h = hashlib.sha256()
        for name in sorted(self.sources):
            h.update(name.encode() + b"\0" + self.sources[name].encode() + b"\0")
        h.update((RECIPE + "\0" + self.tf_version + "\0" + "\0".join(self.command)).encode())
        self.digest = h.hexdigest()[:16]
        self.dir = cache_root() / f"tf-{self.tf_version}-{self.digest}"
        self.library = self.dir / LIBRARY

    def describe(self) -> str:
        return f"TensorFlow {self.tf_version}, brand {brand.__version__}, compiler {self.cxx}"

    def check_tools(self) -> None:
        """Clear errors for what the compile needs and is not there."""
        if shutil.which(self.cxx) is None:
            raise BuildError(
                f"brand.tf must compile its op against the installed TensorFlow {self.tf_version} once, and "
                f"there is no C++ compiler {self.cxx!r} (set CXX, or install g++, e.g. apt-get install g++); "
                f"{self.describe()}"
            )
        if not Path(self.include, "tensorflow", "core", "framework", "dataset.h").is_file():
            raise BuildError(
                f"brand.tf must compile its op against TensorFlow {self.tf_version}, whose C++ headers are not "
                f"in {self.include} (tensorflow/core/framework/dataset.h): install a TensorFlow wheel that ships "
                f"them (the PyPI tensorflow and tensorflow-cpu wheels do); {self.describe()}"
            )

    def build(self, force: bool = False, log=None) -> Path:
        """The op library, compiled now unless the cache has it. Safe when
        several processes call it at once: one compiles, the others wait."""
        log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        if self.library.is_file() and not force:
            return self.library
        self.check_tools()
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.dir.parent / f"{self.dir.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # Another process may have built it while this one waited.
            if self.library.is_file() and not force:
                return self.library
            self.dir.mkdir(exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="build-", dir=self.dir) as tmp:
                src = Path(tmp) / "src"
                src.mkdir()
                for name, text in self.sources.items():
                    (src / name).write_text(text)
                out = Path(tmp) / LIBRARY
                cmd = [str(src) if a == "SRC" else str(out) if a == "OUT" else a for a in self.command]
                cmd[cmd.index("SRC/brand_dataset_op.cc")] = str(src / "brand_dataset_op.cc")
                log(f"brand.tf: compiling the TensorFlow op for {self.describe()} (once; about half a minute)")
                t0 = time.monotonic()
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    raise BuildError(
                        f"brand.tf: compiling the op failed ({self.describe()}), exit {r.returncode}:\n"
                        f"{r.stderr[-4000:]}\ncommand: {shlex.join(cmd)}"
                    )
                (self.dir / "build.json").write_text(json.dumps({
                    "tf_version": self.tf_version,
                    "brand_version": brand.__version__,
                    "extension": str(self.extension),
                    "command": self.command,
                    "seconds": round(time.monotonic() - t0, 1),
                }, indent=1) + "\n")
                os.replace(out, self.library)
            log(f"brand.tf: built {self.library} in {time.monotonic() - t0:.0f} s")
        return self.library
