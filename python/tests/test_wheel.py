"""The wheel: built by maturin here, installed into a fresh venv whose PATH
has no cargo or rustc, then imported and read from there."""

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

from conftest import SAMPLES

PYTHON_DIR = pathlib.Path(__file__).resolve().parent.parent


def path_without_rust() -> str:
    """PATH less every directory that holds cargo or rustc."""
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not any(os.path.exists(os.path.join(d, tool)) for tool in ("cargo", "rustc"))]
    return os.pathsep.join(keep)


def test_the_wheel_installs_and_reads_in_a_fresh_venv_without_rust(dataset, tmp_path):
    files, ds = dataset
    bin_dir = pathlib.Path(sys.executable).parent
    wheels = tmp_path / "wheels"
    subprocess.run([bin_dir / "maturin", "build", "--release", "--locked", "--quiet",
                    "--manifest-path", PYTHON_DIR / "Cargo.toml", "-o", wheels], check=True)
    (wheel,) = wheels.glob("brand-*.whl")
    assert "-cp39-abi3-" in wheel.name, wheel.name  # one wheel for CPython >= 3.9

    venv = tmp_path / "fresh"
    env = dict(os.environ, PATH=path_without_rust())
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, env=env)
    # uv (from the test venv) installs the wheel and numpy, its one dependency.
    subprocess.run([sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", venv / "bin" / "python",
                    wheel], check=True, env=env)
    script = textwrap.dedent(f"""
        import shutil, sys
        assert shutil.which("cargo") is None and shutil.which("rustc") is None, "cargo is on PATH"
        assert sys.prefix == {str(venv)!r}, sys.prefix
        import brand
        assert brand.__file__.startswith({str(venv)!r}), brand.__file__
        loader = brand.Loader({str(ds)!r}, batch_size=32)
        ids = [i for b in loader for i in b.ids.tolist()]
        assert sorted(ids) == list(range({SAMPLES})), ids
        b = next(loader)
        key, arr = b.keys[0], b.samples[0]
        assert arr.tobytes() == open({str(files)!r} + "/" + key, "rb").read()
        print("ok", len(ids))
    """)
    out = subprocess.run([venv / "bin" / "python", "-c", script], check=True, env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.stdout.split() == ["ok", str(SAMPLES)], out.stdout + out.stderr
    assert not (venv / "bin" / "maturin").exists() and shutil.which("cargo", path=env["PATH"]) is None
