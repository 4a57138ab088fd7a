"""Making datasets from Python: brand.pack against the CLI byte for byte,
progress, typed errors and interrupts that leave no dataset; brand.Writer
round trips, its equivalence with `brand pack --from list`, and a Writer that
fails or is killed leaving nothing; the `brand` command of the package
(`python -m brand`, as the wheel's console script runs it) interrupted."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import brand

from conftest import SAMPLES, brand_bin, source_bytes

MANIFEST = "manifest.toml"


def tree(d: pathlib.Path) -> dict:
    """Every file under d (relative name -> bytes)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def leftovers(parent: pathlib.Path, name: str) -> list:
    """What a pack into parent/name left beside it (its hidden work directories)."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}.packing"))


def without_provenance(manifest: bytes) -> list:
    return [line for line in manifest.decode().splitlines() if not line.startswith(("source", "inputs"))]


def many_samples_list(tmp_path: pathlib.Path, lines: int) -> pathlib.Path:
    """A list file naming one small file `lines` times: a pack that takes a
    while (a chunk per sample) without much disk."""
    (tmp_path / "one.bin").write_bytes(os.urandom(200))
    listing = tmp_path / "many.txt"
    listing.write_text("".join(f"one.bin\t{i % 3}\n" for i in range(lines)))
    return listing


@pytest.mark.parametrize("extra", [{}, {"zstd": 3}], ids=["plain", "zstd"])
def test_pack_makes_the_cli_s_dataset_byte_for_byte(dataset, tmp_path, extra):
    files, _ = dataset
    flags = ["--zstd", str(extra["zstd"])] if extra else []
    cli, py = tmp_path / "cli", tmp_path / "py"
    subprocess.run([brand_bin(), "pack", str(files), "-o", str(cli), "--chunk-size", "8", "--seed", "5", *flags],
                   check=True, capture_output=True)
    s = brand.pack(str(files), py, chunk_size=8, seed=5, **extra)
    assert tree(py) == tree(cli)
    assert (s.samples, s.chunks, s.path) == (SAMPLES, -(-SAMPLES // 8), str(py))
    assert s.segments == 1 and s.data_bytes == sum(len(b) for n, b in tree(py).items() if n.endswith(".brd"))
    assert s.raw_bytes == sum(p.stat().st_size for p in files.rglob("*") if p.is_file())
    # Another seed, another order: the comparison above can fail.
    brand.pack(str(files), tmp_path / "other", chunk_size=8, seed=6, **extra)
    assert tree(tmp_path / "other")["index.bin"] != tree(py)["index.bin"]


def test_pack_from_a_list_and_the_cli_agree(tmp_path):
    for i in range(40):
        (tmp_path / f"f{i}.bin").write_bytes(os.urandom(i * 31))
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"f{i}.bin\t{i % 4}\n" for i in range(40)))
    subprocess.run([brand_bin(), "pack", "--from", "list", str(listing), "-o", str(tmp_path / "cli"), "--seed", "1",
                    "--chunk-size", "4"], check=True, capture_output=True)
    brand.pack([listing], tmp_path / "py", source="list", seed=1, chunk_size=4)
    assert tree(tmp_path / "py") == tree(tmp_path / "cli")


def test_progress_is_reported_while_packing_and_at_the_end(tmp_path):
    listing = many_samples_list(tmp_path, 20000)
    calls = []
    s = brand.pack(listing, tmp_path / "ds", source="list", chunk_size=1, progress=lambda d, t: calls.append((d, t)))
    assert s.samples == 20000
    assert calls[-1] == (20000, 20000)
    assert all(t == 20000 for _, t in calls)
    done = [d for d, _ in calls]
    assert done == sorted(done) and len(set(done)) == len(done), done
    assert len(calls) >= 2 and 0 < done[-2] < 20000, f"no progress before the end: {calls}"


def test_the_gil_is_free_while_packing(tmp_path):
    import threading

    listing = many_samples_list(tmp_path, 20000)
    ticks, running = [], threading.Event()

    def tick():
        running.set()
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    stop = threading.Event()
    t = threading.Thread(target=tick)
    t.start()
    running.wait()
    start = time.monotonic()
    brand.pack(listing, tmp_path / "ds", source="list", chunk_size=1)
    end = time.monotonic()
    stop.set()
    t.join()
    during = [x for x in ticks if start < x < end]
    assert len(during) >= 10, f"{len(during)} ticks of another thread in a {end - start:.2f} s pack"


def test_an_exception_from_progress_stops_the_pack_and_leaves_nothing(tmp_path):
    listing = many_samples_list(tmp_path, 20000)
    seen = []

    def stop(done, total):
        seen.append(done)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        brand.pack(listing, tmp_path / "ds", source="list", chunk_size=1, progress=stop)
    assert seen and seen[0] < 20000, "the pack was over before it could be stopped"
    assert not (tmp_path / "ds").exists() and leftovers(tmp_path, "ds") == []
    # Not stopped, it packs.
    assert brand.pack(listing, tmp_path / "ds", source="list", chunk_size=1).samples == 20000


def test_sigint_during_pack_raises_keyboard_interrupt_and_leaves_nothing(tmp_path):
    listing = many_samples_list(tmp_path, 200000)
    out = tmp_path / "ds"
    script = textwrap.dedent(f"""
        import sys, brand
        def progress(done, total):
            if done:
                print("packing", flush=True)
        try:
            brand.pack({str(listing)!r}, {str(out)!r}, source="list", chunk_size=1, progress=progress)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(0)
        print("finished", flush=True)
        sys.exit(1)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "packing"
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read().split()
        assert proc.wait(timeout=30) == 0, rest
    finally:
        proc.kill()
    assert rest[-1] == "interrupted", rest
    assert not out.exists() and leftovers(tmp_path, "ds") == []


def test_bad_input_is_a_typed_error_naming_the_file_and_leaves_nothing(tmp_path):
    listing = tmp_path / "list.txt"
    (tmp_path / "a.bin").write_bytes(b"a")
    listing.write_text("a.bin\t0\na.bin\tseven\n")
    with pytest.raises(brand.FormatError, match=r"list\.txt: line 2: label \"seven\" is not an integer"):
        brand.pack(listing, tmp_path / "ds", source="list")
    with pytest.raises(brand.NotFoundError, match="no-such-dir"):
        brand.pack(tmp_path / "no-such-dir", tmp_path / "ds")
    with pytest.raises(brand.ConfigError, match="unknown input format \"csv\""):
        brand.pack(listing, tmp_path / "ds", source="csv")
    assert not (tmp_path / "ds").exists() and leftovers(tmp_path, "ds") == []


def test_a_corrupt_input_found_mid_pack_leaves_nothing(tmp_path):
    src = tmp_path / "tfr"
    subprocess.run([brand_bin(), "gen", str(src), "--samples", "300", "--format", "tfrecord", "--shards", "1",
                    "--mean-bytes", "2000", "--min-bytes", "1000", "--max-bytes", "3000"],
                   check=True, capture_output=True)
    (shard,) = src.glob("*.tfrecord")
    data = bytearray(shard.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 16] = bytes(b ^ 0xFF for b in data[mid:mid + 16])
    shard.write_bytes(bytes(data))
    with pytest.raises(brand.BrandError, match=shard.name) as e:
        brand.pack(shard, tmp_path / "ds", source="tfrecord", chunk_size=4)
    assert isinstance(e.value, (brand.FormatError, brand.DataLossError)), repr(e.value)
    assert not (tmp_path / "ds").exists() and leftovers(tmp_path, "ds") == []


def test_a_rerun_reuses_the_gzipped_tars_an_earlier_pack_listed(tmp_path):
    """brand.pack keeps what it listed before a damaged input in `.OUT.listing`,
    and the same call, once the input is mended, reads only the rest: the
    first two shards are replaced by junk of the same size and time, which a
    read would refuse, and the dataset equals an uninterrupted pack's."""
    import gzip
    import io
    import tarfile

    shards = []
    for k in range(4):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            for i in range(25):
                for ext, body in (("jpg", os.urandom(300 + i)), ("cls", str((k + i) % 5).encode())):
                    info = tarfile.TarInfo(f"s{k}-{i:03}.{ext}")
                    info.size = len(body)
                    tar.addfile(info, io.BytesIO(body))
        path = tmp_path / f"shard-{k}.tar.gz"
        good = gzip.compress(raw.getvalue())
        path.write_bytes(good)
        shards.append((path, good))
    inputs = [str(p) for p, _ in shards]
    brand.pack(inputs, tmp_path / "reference", source="tar", field="jpg", label="cls")

    out = tmp_path / "out" / "ds"
    out.parent.mkdir()
    path2, good2 = shards[2]
    path2.write_bytes(good2[: len(good2) // 2])
    with pytest.raises(brand.BrandError, match=path2.name):
        brand.pack(inputs, out, source="tar", field="jpg", label="cls")
    assert not out.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == [".ds.listing"]
    for path, good in shards[:2]:
        st = path.stat()
        path.write_bytes(b"\x1f\x8b" + bytes(len(good) - 2))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    path2.write_bytes(good2)
    brand.pack(inputs, out, source="tar", field="jpg", label="cls")
    for name in ("data-00000.brd", "index.bin"):
        assert (out / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), name
    assert sorted(p.name for p in out.parent.iterdir()) == ["ds"]


def test_an_existing_dataset_is_refused_unless_force(dataset, tmp_path):
    files, _ = dataset
    brand.pack(files, tmp_path / "ds", seed=1)
    first = tree(tmp_path / "ds")
    with pytest.raises(brand.ConfigError, match="already exists"):
        brand.pack(files, tmp_path / "ds", seed=2)
    assert tree(tmp_path / "ds") == first
    brand.pack(files, tmp_path / "ds", seed=2, force=True)
    assert tree(tmp_path / "ds") != first


def read_back(ds) -> dict:
    """key -> (bytes, label) of every sample of ds, read by brand.Loader."""
    out = {}
    with brand.Loader(ds, batch_size=16, io_backend="threads") as loader:
        for b in loader:
            for arr, key, label in zip(b.samples, b.keys, b.labels):
                assert key not in out, f"{key} served twice"
                out[key] = (arr.tobytes(), int(label))
    return out


def test_writer_round_trip(dataset, tmp_path):
    files, _ = dataset
    keys = sorted(str(p.relative_to(files)) for p in files.rglob("*") if p.is_file())
    with brand.Writer(tmp_path / "ds", seed=3, chunk_size=16) as w:
        for i, key in enumerate(keys):
            w.write(source_bytes(files, key), label=i % 7, key=key)
        w.write(bytearray(b"no key, no label"))
        assert len(w) == len(keys) + 1
    assert w.closed
    got = read_back(tmp_path / "ds")
    assert len(got) == len(keys) + 1
    for i, key in enumerate(keys):
        assert got[key] == (source_bytes(files, key), i % 7), key
    assert got[str(len(keys))] == (b"no key, no label", -1)


def test_writer_packs_as_brand_pack_from_list_does(tmp_path):
    """Same samples, keys, labels and seed: segments and index byte for byte,
    the manifest but for its provenance (source "writer", no inputs)."""
    listing = tmp_path / "list.txt"
    lines = []
    with brand.Writer(tmp_path / "w", seed=11, chunk_size=8) as w:
        for i in range(100):
            data = os.urandom((i * 97) % 5000)
            (tmp_path / f"s{i}.bin").write_bytes(data)
            lines.append(f"s{i}.bin\t{i % 9}\n")
            w.write(data, i % 9, f"s{i}.bin")
    listing.write_text("".join(lines))
    subprocess.run([brand_bin(), "pack", "--from", "list", str(listing), "-o", str(tmp_path / "cli"), "--seed", "11",
                    "--chunk-size", "8"], check=True, capture_output=True)
    a, b = tree(tmp_path / "w"), tree(tmp_path / "cli")
    assert sorted(a) == sorted(b) and len(a) >= 3
    for name in a:
        if name == MANIFEST:
            assert without_provenance(a[name]) == without_provenance(b[name])
            assert 'source = "writer"' in a[name].decode()
        else:
            assert a[name] == b[name], name


def test_an_exception_inside_the_writer_leaves_nothing(tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    with pytest.raises(RuntimeError, match="the user's"):
        with brand.Writer(tmp_path / "ds", spill_dir=spill) as w:
            for i in range(1000):
                w.write(os.urandom(1000), i)
            raise RuntimeError("the user's")
    assert w.closed
    assert not (tmp_path / "ds").exists() and leftovers(tmp_path, "ds") == []
    assert list(spill.iterdir()) == []
    with pytest.raises(brand.ConfigError, match="closed"):
        w.write(b"late")


def test_writer_errors(tmp_path):
    with pytest.raises(brand.ConfigError, match="chunk size 0"):
        brand.Writer(tmp_path / "ds", chunk_size=0)
    with pytest.raises(brand.ConfigError, match="zstd level 99"):
        brand.Writer(tmp_path / "ds", zstd=99)
    (tmp_path / "taken").mkdir()
    with pytest.raises(brand.ConfigError, match="already exists"):
        brand.Writer(tmp_path / "taken")
    with pytest.raises(brand.NotFoundError, match="no-such"):
        brand.Writer(tmp_path / "ds", spill_dir=tmp_path / "no-such")
    w = brand.Writer(tmp_path / "ds")
    w.write(b"x", key="a")
    w.write(b"y")  # key "1"
    with pytest.raises(brand.ConfigError, match='key "a" of sample 2 was already given to sample 0'):
        w.write(b"z", key="a")
    with pytest.raises(TypeError):
        w.write("text, not bytes")
    with pytest.raises(brand.ConfigError, match="no samples"):
        brand.Writer(tmp_path / "empty").close()
    assert w.close().samples == 2
    assert not (tmp_path / "empty").exists()


def test_a_killed_writer_leaves_nothing(tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    out = tmp_path / "ds"
    script = textwrap.dedent(f"""
        import os, brand
        with brand.Writer({str(out)!r}, spill_dir={str(spill)!r}) as w:
            for i in range(10**9):
                w.write(os.urandom(4096), i % 10)
                if i == 1000:
                    print("writing", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        # The spill file exists only as an open descriptor of the process.
        fds = [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")]
        assert any(f.startswith(str(spill)) and f.endswith("(deleted)") for f in fds), fds
        assert list(spill.iterdir()) == []
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
    assert not out.exists() and leftovers(tmp_path, "ds") == []
    assert list(spill.iterdir()) == []


def test_sigint_to_the_brand_command_removes_the_unfinished_dataset(tmp_path):
    """`python -m brand pack` (what the wheel's console script runs) taken by
    SIGINT mid-pack: the process ends by the signal and leaves nothing."""
    listing = many_samples_list(tmp_path, 200000)
    out = tmp_path / "ds"
    proc = subprocess.Popen([sys.executable, "-m", "brand", "pack", "--from", "list", str(listing), "-o", str(out),
                             "--chunk-size", "1"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not leftovers(tmp_path, "ds") and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.005)
        assert leftovers(tmp_path, "ds"), "the pack never started"
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == -signal.SIGINT, proc.stderr.read()
    finally:
        proc.kill()
    assert "the unfinished dataset was removed" in proc.stderr.read()
    assert not out.exists() and leftovers(tmp_path, "ds") == []


def test_the_brand_command_runs_every_subcommand(dataset, tmp_path):
    files, ds = dataset
    run = lambda *a: subprocess.run([sys.executable, "-m", "brand", *a], capture_output=True, text=True)  # noqa: E731
    out = run("inspect", str(ds), "--json")
    assert out.returncode == 0, out.stderr
    assert f'"samples": {SAMPLES}' in out.stdout
    assert run("verify", str(ds)).stdout.startswith("OK")
    key = sorted(str(p.relative_to(files)) for p in files.rglob("*") if p.is_file())[0]
    cat = subprocess.run([sys.executable, "-m", "brand", "cat", str(ds), "--key", key], capture_output=True)
    assert cat.returncode == 0 and cat.stdout == source_bytes(files, key)
    bad = run("inspect", str(tmp_path / "missing"))
    assert bad.returncode == 1 and "missing" in bad.stderr
    assert run("--version").stdout.startswith("brand ")
    assert run("no-such-command").returncode == 2


def test_pack_and_writer_to_object_storage(dataset, tmp_path, monkeypatch):
    """An output URL: packed in the staging directory, uploaded, read back;
    the staging directory is left empty."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
    import s3server

    server_bin = os.environ.get("BRAND_S3_SERVER")
    if not server_bin or not os.access(server_bin, os.X_OK):
        pytest.fail("BRAND_S3_SERVER must name tools/s3-server's binary (make py-test sets it)")
    files, ds = dataset
    staging = tmp_path / "staging"
    staging.mkdir()
    with s3server.serve(server_bin) as server:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        bucket = server.bucket("bkt")
        s = brand.pack(files, f"{bucket}/by-pack", chunk_size=16, seed=2, staging=staging)
        assert s.samples == SAMPLES and s.path == f"{bucket}/by-pack"
        with brand.Writer(f"{bucket}/by-writer", seed=4, staging=staging) as w:
            for i in range(30):
                w.write(bytes([i]) * 100, i % 3, f"k{i}")
        assert list(staging.iterdir()) == []
        with brand.Loader(f"{bucket}/by-pack", batch_size=16) as remote, brand.Loader(ds, batch_size=16) as local:
            for a, b in zip(remote, local):
                assert a.keys == b.keys and [x.tobytes() for x in a.samples] == [x.tobytes() for x in b.samples]
        assert read_back(f"{bucket}/by-writer") == {f"k{i}": (bytes([i]) * 100, i % 3) for i in range(30)}
        with pytest.raises(brand.BrandError, match="already holds a dataset"):
            brand.pack(files, f"{bucket}/by-pack", staging=staging)
