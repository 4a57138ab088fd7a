"""The wheel: built by maturin here, installed into a fresh venv whose PATH
has no cargo or rustc, then imported and read from there, and used to make
datasets: its `brand` command, brand.pack and brand.Writer."""

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

    # The wheel's `brand` command packs what the brand binary packs (the
    # fixture's dataset: same input, seed and chunk size), byte for byte.
    brand_cmd = venv / "bin" / "brand"
    packed = tmp_path / "packed"
    subprocess.run([brand_cmd, "pack", str(files), "-o", packed, "--chunk-size", "16", "--seed", "2"],
                   check=True, env=env, cwd=tmp_path, capture_output=True)
    assert tree(packed) == tree(ds)
    inspect = subprocess.run([brand_cmd, "inspect", packed], check=True, env=env, capture_output=True, text=True)
    assert f"{SAMPLES}" in inspect.stdout, inspect.stdout
    version = subprocess.run([venv / "bin" / "python", "-m", "brand", "--version"], check=True, env=env,
                             capture_output=True, text=True)
    assert version.stdout.startswith("brand "), version.stdout

    # brand.pack and brand.Writer from the installed package.
    script = textwrap.dedent(f"""
        import brand
        s = brand.pack({str(files)!r}, {str(tmp_path / "by-pack")!r}, chunk_size=16, seed=2)
        assert s.samples == {SAMPLES}, s
        with brand.Writer({str(tmp_path / "by-writer")!r}, seed=1) as w:
            for i in range(50):
                w.write(bytes([i]) * (i + 1), label=i % 5, key=f"k{{i}}")
        got = {{}}
        for b in brand.Loader({str(tmp_path / "by-writer")!r}, batch_size=8):
            got.update((k, (a.tobytes(), int(l))) for k, a, l in zip(b.keys, b.samples, b.labels))
        assert got == {{f"k{{i}}": (bytes([i]) * (i + 1), i % 5) for i in range(50)}}, got
        print("made", s.samples, len(got))
    """)
    out = subprocess.run([venv / "bin" / "python", "-c", script], env=env, cwd=tmp_path, capture_output=True,
                         text=True)
    assert out.stdout.split() == ["made", str(SAMPLES), "50"], out.stdout + out.stderr
    assert tree(tmp_path / "by-pack") == tree(ds)


def tree(d: pathlib.Path) -> dict:
    """Every file under d (relative name -> bytes)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(pathlib.Path(d).rglob("*")) if p.is_file()}
