"""The Keras example trains from a brand dataset to clearly better than chance."""

import importlib.util

import pytest

from conftest import BRAND, TF_OP


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_keras", TF_OP / "examples" / "train_keras.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_keras_learns_the_png_classes(example, tmp_path):
    # PNGs made with TF (tf.io.encode_png) into an ImageFolder, packed by brand.
    train_ds, test_ds = example.make_data(tmp_path, BRAND, train=640, test=200, seed=3)
    train_acc, test_acc = example.train(train_ds, test_ds, epochs=4, batch_size=32, verbose=0)
    # Chance is 0.2 for 5 classes.
    assert test_acc > 0.7, (train_acc, test_acc)
