"""`brand pack --from mds|parquet|tar` on fixtures written by the formats' own
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
