"""TFRecord files written by real TensorFlow pack and round-trip through brand."""

import json
import subprocess

import pytest
import tensorflow as tf

from conftest import BRAND


def brand(*args, check=True):
    return subprocess.run([BRAND, *map(str, args)], capture_output=True, check=check)


def example(i):
    payload = bytes((i * 7 + j) % 256 for j in range(100 + 13 * i))
    features = tf.train.Features(
        feature={
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[payload])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 5])),
            "weight": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5 * i])),
        }
    )
    return tf.train.Example(features=features).SerializeToString()


@pytest.fixture
def tfrecords(tmp_path):
    files, records = [], []
    for f in range(2):
        path = tmp_path / f"part-{f}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for i in range(f * 60, f * 60 + 60):
                rec = example(i)
                w.write(rec)
                records.append((f"{path.name}:{i - f * 60}", rec, i % 5))
        files.append(path)
    return files, records


def test_tfrecord_packs_and_round_trips(tmp_path, tfrecords):
    files, records = tfrecords
    out = tmp_path / "ds"
    brand("pack", "--from", "tfrecord", *files, "-o", out, "--chunk-size", "16")
    info = json.loads(brand("inspect", "--json", out).stdout)
    assert info["samples"] == len(records)
    assert info["labels"] == 5
    brand("verify", out)
    for key, rec, label in records:
        got = brand("cat", out, "--key", key).stdout
        assert got == rec, key
        parsed = tf.io.parse_single_example(
            got, {"label": tf.io.FixedLenFeature([], tf.int64), "image": tf.io.FixedLenFeature([], tf.string)}
        )
        assert int(parsed["label"]) == label


def test_a_truncated_tfrecord_is_named(tmp_path, tfrecords):
    files, _ = tfrecords
    data = files[1].read_bytes()
    files[1].write_bytes(data[: len(data) - 40])
    res = brand("pack", "--from", "tfrecord", *files, "-o", tmp_path / "ds", check=False)
    assert res.returncode == 1
    err = res.stderr.decode()
    assert "part-1.tfrecord" in err and "record 59" in err, err
    assert "panicked" not in err
    assert not (tmp_path / "ds").exists()
