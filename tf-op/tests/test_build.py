"""brand.tf's op as users get it: compiled from the installed wheel against the
installed TensorFlow on first use, cached, built once when two processes want
it at the same time, and clear errors when it cannot be built."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tensorflow as tf

import brand
import brand.tf
from brand.tf import _build
from conftest import SAMPLES, TF_OP

WHEELS = os.environ.get("BRAND_WHEELS")


def path_without_rust():
    """PATH less every directory that holds cargo or rustc."""
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not any(os.path.exists(os.path.join(d, t)) for t in ("cargo", "rustc"))]
    return os.pathsep.join(keep)


# Two of these run at once in the fresh venv, on an empty cache: each loads
# the op (the first use builds it) and reads an epoch.
READER = textwrap.dedent(
    """
    import hashlib, json, os, shutil, sys
    assert shutil.which("cargo") is None, "cargo is on PATH"
    import tensorflow as tf
    import brand.tf
    assert brand.tf.__file__.startswith(sys.prefix), (brand.tf.__file__, sys.prefix)
    ds = brand.tf.BrandDataset(sys.argv[1], batch_size=32)
    seen = {}
    for el in ds:
        for i, d in zip(el["id"].numpy().tolist(), el["data"].numpy().tolist()):
            seen[i] = hashlib.sha256(d).hexdigest()
    print(json.dumps(seen))
    """
)


@pytest.mark.skipif(not WHEELS, reason="BRAND_WHEELS (the directory of the built wheel) is not set: make python-test")
def test_the_wheel_builds_its_op_in_a_fresh_venv_once_for_two_processes(small_ds, small_bytes, tmp_path):
    (wheel,) = Path(WHEELS).glob("brand-*.whl")
    venv = tmp_path / "fresh"
    env = dict(os.environ, PATH=path_without_rust(), BRAND_CACHE_DIR=str(tmp_path / "cache"),
               TF_CPP_MIN_LOG_LEVEL="2")
    for var in ("VIRTUAL_ENV", "PYTHONPATH", "CARGO_TARGET_DIR"):
        env.pop(var, None)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, env=env)
    python = venv / "bin" / "python"
    # TensorFlow as pinned for the tests (from uv's cache: hard links), and the wheel.
    subprocess.run([sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", python,
                    f"tensorflow-cpu=={tf.__version__}", wheel], check=True, env=env)
    script = tmp_path / "reader.py"
    script.write_text(READER)
    procs = [subprocess.Popen([python, script, small_ds], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-4000:]
            outs.append((json.loads(out), err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for seen, _ in outs:
        assert sorted(map(int, seen)) == list(range(SAMPLES))
        for i, digest in seen.items():
            assert digest == hashlib.sha256(small_bytes[int(i)]).hexdigest(), f"sample {i}"
    # One compile: the other process waited on the lock, then found it built.
    compiles = sum(err.count("brand.tf: compiling the TensorFlow op") for _, err in outs)
    assert compiles == 1, [err for _, err in outs]
    (built,) = (tmp_path / "cache" / "tf-op").glob(f"tf-{tf.__version__}-*/{_build.LIBRARY}")
    info = json.loads((built.parent / "build.json").read_text())
    assert info["tf_version"] == tf.__version__
    assert info["extension"].startswith(str(venv)), info["extension"]  # linked against the fresh venv's brand
    # Cached: a third process loads it without compiling.
    r = subprocess.run([python, script, small_ds], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "compiling" not in r.stderr


def test_the_op_links_brand_from_the_extension_module_and_exports_nothing_of_it():
    b = _build.Build(tf)
    assert b.library.is_file()
    dynamic = subprocess.run(["readelf", "-d", b.library], capture_output=True, text=True, check=True).stdout
    assert f"[{b.extension.name}]" in dynamic, dynamic  # NEEDED _brand.abi3.so
    assert str(b.extension.parent) in dynamic, dynamic  # found by its RUNPATH
    out = subprocess.run(["nm", "-D", "--defined-only", b.library], capture_output=True, text=True,
                         check=True).stdout
    exported = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert not [s for s in exported if s.startswith("brand_") or "rust" in s.lower()], exported
    undefined = subprocess.run(["nm", "-D", "--undefined-only", b.library], capture_output=True, text=True,
                               check=True).stdout
    assert "brand_next" in undefined  # brand comes from the extension module: one copy in the process


def test_the_cache_key_follows_the_tensorflow_version_and_the_source(monkeypatch):
    b = _build.Build(tf)
    assert f"tf-{tf.__version__}-" in b.dir.name
    monkeypatch.setattr(brand._brand, "TF_OP_SOURCE", brand._brand.TF_OP_SOURCE + "\n// changed\n")
    assert _build.Build(tf).dir != b.dir


@pytest.mark.parametrize("version", ["2.15.1", "1.15.0", "3.0.0"])
def test_an_unsupported_tensorflow_is_named(version):
    with pytest.raises(brand.tf.BuildError, match=rf"TensorFlow 2\.16 or a later 2\.x; TensorFlow {version} is installed"):
        _build.check_supported(version)


def test_a_missing_compiler_is_named_with_the_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("BRAND_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    b = _build.Build(tf)
    with pytest.raises(brand.tf.BuildError) as e:
        b.build()
    msg = str(e.value)
    assert f"TensorFlow {tf.__version__}" in msg and "no-such-g++" in msg and "install g++" in msg, msg
    assert not b.library.exists()


def test_missing_tensorflow_headers_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("BRAND_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tf.sysconfig, "get_include", lambda: str(tmp_path / "include"))
    with pytest.raises(brand.tf.BuildError, match=rf"TensorFlow {tf.__version__}, whose C\+\+ headers are not in"):
        _build.Build(tf).build()


def test_a_failed_compile_leaves_nothing_and_shows_the_compiler_output(tmp_path, monkeypatch):
    cxx = tmp_path / "failing-cxx"
    cxx.write_text("#!/bin/sh\necho 'fatal: no space left on this pretend device' >&2\nexit 3\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("BRAND_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(cxx))
    b = _build.Build(tf)
    with pytest.raises(brand.tf.BuildError, match="(?s)exit 3.*no space left on this pretend device"):
        b.build()
    assert not b.library.exists() and not list(b.dir.glob("build-*"))


def test_the_command_line_build_prints_the_cached_library():
    r = subprocess.run([sys.executable, "-m", "brand.tf", "build"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert r.returncode == 0, r.stderr[-4000:]
    assert Path(r.stdout.strip()) == _build.Build(tf).library


def test_the_old_brand_tf_name_is_the_same_module():
    sys.path.insert(0, str(TF_OP))
    try:
        import brand_tf
    finally:
        sys.path.remove(str(TF_OP))
    assert brand_tf.BrandDataset is brand.tf.BrandDataset
