"""`brand pack --from mds|parquet|arrow|tar` on fixtures written by the formats' own
libraries (mosaicml-streaming's MDSWriter, Hugging Face `datasets`,
webdataset's ShardWriter): every sample's bytes, label and key come back
from the packed dataset through the CLI (`brand cat --key`, `brand inspect
--samples`). A missing library fails the test: these fixtures are the point."""

import io
import json
import pathlib
import random
import subprocess
import tomllib

import pytest

from conftest import brand_bin


def run(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([brand_bin(), *args], capture_output=True)
    assert proc.returncode == 0, f"brand {' '.join(args)}: {proc.stderr.decode(errors='replace')}"
    return proc


def fails(*args: str) -> str:
    proc = subprocess.run([brand_bin(), *args], capture_output=True)
    assert proc.returncode != 0, f"brand {' '.join(args)} succeeded"
    return proc.stderr.decode(errors="replace")


def packed(ds: pathlib.Path) -> dict[str, tuple[int, bytes]]:
    """Every sample of a packed dataset: key -> (label, bytes)."""
    out = {}
    for line in run("inspect", str(ds), "--samples").stdout.decode().splitlines():
        _, label, key = line.split("\t", 2)
        out[key] = (int(label), run("cat", str(ds), "--key", key).stdout)
    return out


def png(i: int) -> bytes:
    """A small PNG image (real bytes, as a user's would be)."""
    from PIL import Image

    rng = random.Random(i)
    img = Image.new("RGB", (8 + i % 5, 8))
    img.putdata([(rng.randrange(256), rng.randrange(256), i % 256) for _ in range(img.width * img.height)])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# ---- MDS (mosaicml-streaming) ----


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_mds_from_streaming_mdswriter(tmp_path, compression):
    from streaming import MDSWriter

    src = tmp_path / "mds"
    columns = {"image": "bytes", "label": "int", "caption": "str", "score": "float32"}
    want = {}
    # A small size limit: several shards.
    with MDSWriter(out=str(src), columns=columns, compression=compression, size_limit=1 << 14) as w:
        for i in range(120):
            image = png(i) * (1 + i % 3)
            label = -1 if i % 17 == 3 else i % 10
            w.write({"image": image, "label": label, "caption": f"sample {i}", "score": i / 7})
            want[i] = (label, image)
    index = json.loads((src / "index.json").read_text())
    shards = index["shards"]
    assert len(shards) > 2, "the fixture should span several shards"
    if compression:
        # Only the compressed shards exist: the importer must decompress.
        assert all(s["zip_data"] and not (src / s["raw_data"]["basename"]).exists() for s in shards)
    expected, first = {}, 0
    for s in shards:
        for j in range(s["samples"]):
            expected[f"{s['raw_data']['basename']}:{j}"] = want[first + j]
        first += s["samples"]
    ds = tmp_path / "ds"
    run("pack", "--from", "mds", str(src), "--field", "image", "--label", "label", "-o", str(ds))
    assert packed(ds) == expected
    # More than one bytes-like column: --field is required; a float label is refused.
    assert "--field" in fails("pack", "--from", "mds", str(src), "-o", str(tmp_path / "x"))
    err = fails("pack", "--from", "mds", str(src), "--field", "image", "--label", "score", "-o", str(tmp_path / "x"))
    assert "float32" in err, err
    assert not (tmp_path / "x").exists()


# ---- Hugging Face Parquet ----


NAMES = ["airplane", "bird", "cat", "dog", "frog"]


def hf_dataset(n: int, offset: int = 0):
    from datasets import ClassLabel, Dataset, Features, Image, Value

    features = Features({"image": Image(), "label": ClassLabel(names=NAMES), "text": Value("string")})
    rows = {
        "image": [{"bytes": png(offset + i), "path": None} for i in range(n)],
        "label": [(offset + i) % len(NAMES) for i in range(n)],
        "text": [f"row {offset + i}" for i in range(n)],
    }
    return Dataset.from_dict(rows, features=features), rows


def test_parquet_from_datasets_to_parquet(tmp_path):
    ds_hf, rows = hf_dataset(150)
    path = tmp_path / "cifar.parquet"
    ds_hf.to_parquet(str(path))
    ds = tmp_path / "ds"
    run("pack", "--from", "parquet", str(path), "--field", "image", "--label", "label", "-o", str(ds))
    expected = {f"cifar.parquet:{i}": (rows["label"][i], rows["image"][i]["bytes"]) for i in range(150)}
    assert packed(ds) == expected
    manifest = tomllib.loads((ds / "manifest.toml").read_text())
    assert manifest["label_names"] == NAMES


def test_parquet_hub_layout_data_train_shards(tmp_path):
    """push_to_hub's layout: data/train-NNNNN-of-NNNNN.parquet, packed as a directory."""
    ds_hf, rows = hf_dataset(90, offset=1000)
    data = tmp_path / "repo" / "data"
    data.mkdir(parents=True)
    shards = 3
    expected, first = {}, 0
    for k in range(shards):
        shard = ds_hf.shard(num_shards=shards, index=k, contiguous=True)
        name = f"train-{k:05d}-of-{shards:05d}.parquet"
        shard.to_parquet(str(data / name))
        for r in range(len(shard)):
            expected[f"{name}:{r}"] = (rows["label"][first + r], rows["image"][first + r]["bytes"])
        first += len(shard)
    assert first == 90
    ds = tmp_path / "ds"
    run("pack", "--from", "parquet", str(data), "--field", "image", "--label", "label", "-o", str(ds))
    assert packed(ds) == expected
    assert tomllib.loads((ds / "manifest.toml").read_text())["label_names"] == NAMES
    # A label outside the class names is refused (datasets#8596), naming file and row.
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(data / "train-00000-of-00003.parquet")
    labels = table.column("label").to_pylist()
    labels[7] = len(NAMES)
    bad = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels, pa.int64()))
    bad = bad.replace_schema_metadata(table.schema.metadata)
    pq.write_table(bad, data / "train-00000-of-00003.parquet")
    err = fails("pack", "--from", "parquet", str(data), "--field", "image", "--label", "label", "-o", str(tmp_path / "x"))
    assert "train-00000-of-00003.parquet: row 7" in err and "out of range of the 5 class names" in err, err
    assert not (tmp_path / "x").exists()


# ---- Hugging Face save_to_disk (for --from arrow) ----


def read_arrow_stream(path: pathlib.Path):
    """The table in an IPC stream file, read into memory (not mapped: the tests rewrite it)."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.BufferReader(path.read_bytes())).read_all()


def test_arrow_from_datasets_save_to_disk(tmp_path):
    """save_to_disk's layout: data-NNNNN-of-NNNNN.arrow in state.json order, read in place."""
    ds_hf, rows = hf_dataset(120, offset=2000)
    src = tmp_path / "saved"
    ds_hf.save_to_disk(str(src), num_shards=3)
    files = [f["filename"] for f in json.loads((src / "state.json").read_text())["_data_files"]]
    assert len(files) == 3
    expected, first = {}, 0
    import pyarrow as pa

    for name in files:
        n = read_arrow_stream(src / name).num_rows
        for r in range(n):
            expected[f"{name}:{r}"] = (rows["label"][first + r], rows["image"][first + r]["bytes"])
        first += n
    assert first == 120
    ds = tmp_path / "ds"
    run("pack", "--from", "arrow", str(src), "--field", "image", "--label", "label", "-o", str(ds))
    assert packed(ds) == expected
    assert tomllib.loads((ds / "manifest.toml").read_text())["label_names"] == NAMES
    # The default field is the Image column (the text column is a string).
    run("pack", "--from", "arrow", str(src), "-o", str(tmp_path / "nolabel"))
    assert {k: b for k, (_, b) in packed(tmp_path / "nolabel").items()} == {k: b for k, (_, b) in expected.items()}
    # A label outside the class names is refused, naming file and row.
    table = read_arrow_stream(src / files[1])
    labels = table.column("label").to_pylist()
    labels[5] = len(NAMES)
    bad = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels, pa.int64()))
    bad = bad.replace_schema_metadata(table.schema.metadata)
    with pa.OSFile(str(src / files[1]), "wb") as sink, pa.ipc.new_stream(sink, bad.schema) as writer:
        writer.write_table(bad)
    err = fails("pack", "--from", "arrow", str(src), "--field", "image", "--label", "label", "-o", str(tmp_path / "x"))
    assert f"{files[1]}: row 5" in err and "out of range of the 5 class names" in err, err
    assert not (tmp_path / "x").exists()
    # A compressed body is refused by name.
    with pa.OSFile(str(src / files[1]), "wb") as sink, pa.ipc.new_stream(
        sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")
    ) as writer:
        writer.write_table(table)
    err = fails("pack", "--from", "arrow", str(src), "--field", "image", "-o", str(tmp_path / "x"))
    assert files[1] in err and "ZSTD-compressed body" in err, err


def test_arrow_dataset_dict_names_its_splits_and_the_file_format(tmp_path):
    from datasets import DatasetDict

    train, train_rows = hf_dataset(40)
    test, _ = hf_dataset(10, offset=500)
    src = tmp_path / "dict"
    DatasetDict({"train": train, "test": test}).save_to_disk(str(src))
    err = fails("pack", "--from", "arrow", str(src), "-o", str(tmp_path / "x"))
    assert "DatasetDict of splits" in err and "train" in err and "test" in err and str(src / "train") in err, err
    assert not (tmp_path / "x").exists()
    ds = tmp_path / "ds"
    run("pack", "--from", "arrow", str(src / "train"), "--label", "label", "-o", str(ds))
    name = json.loads((src / "train" / "state.json").read_text())["_data_files"][0]["filename"]
    assert packed(ds) == {f"{name}:{i}": (train_rows["label"][i], train_rows["image"][i]["bytes"]) for i in range(40)}
    # The same table as an IPC *file* (ARROW1 magic and footer), a plain input.
    import pyarrow as pa

    table = read_arrow_stream(src / "train" / name)
    path = tmp_path / "table.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=7)
    ds = tmp_path / "ds-file"
    run("pack", "--from", "arrow", str(path), "--label", "label", "-o", str(ds))
    assert packed(ds) == {f"table.arrow:{i}": (train_rows["label"][i], train_rows["image"][i]["bytes"]) for i in range(40)}
    assert tomllib.loads((ds / "manifest.toml").read_text())["label_names"] == NAMES


# ---- WebDataset (for --from tar) ----


def test_tar_from_webdataset_shardwriter(tmp_path):
    import webdataset as wds

    shards = tmp_path / "shards"
    shards.mkdir()
    expected = {}
    with wds.ShardWriter(str(shards / "shard-%06d.tar"), maxcount=25, verbose=0) as sink:
        for i in range(80):
            key = f"sample{i:05d}"
            image = png(i)
            sink.write({"__key__": key, "jpg": image, "cls": i % 7, "json": {"i": i}})
            expected[key] = (i % 7, image)
    assert len(list(shards.glob("*.tar"))) == 4
    ds = tmp_path / "ds"
    run("pack", "--from", "tar", str(shards), "--field", "jpg", "--label", "cls", "-o", str(ds))
    assert packed(ds) == expected
