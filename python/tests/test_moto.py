"""brand against a second S3 implementation: moto's server (Python, from the
test venv; its own ETags, listings, multipart and error bodies), not the
s3s-fs server the other object-storage tests use. A dataset packed to it by
`brand pack -o s3://…` reads back exactly once per epoch with its bytes, in
the local copy's order; `brand verify` passes; an object replaced during
a run is an error naming it, never a mix of two datasets."""

import os
import socket
import subprocess
import sys
import time

import pytest

import brand

from conftest import SAMPLES, assert_reads_as_local, brand_bin

CFG = dict(batch_size=16, memory="20%", seed=7)
BUCKET = "moto-bkt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def moto(dataset, tmp_path_factory):
    """(boto3 client, URL of the dataset packed to moto, source files, local
    dataset); the process's environment points at moto while the module runs."""
    import boto3  # with moto, from the test venv's requirements

    root = tmp_path_factory.mktemp("moto")
    port = free_port()
    log = open(root / "moto.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    saved = dict(os.environ)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start: {(root / 'moto.log').read_text()}")
                time.sleep(0.2)
        os.environ.update({
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "moto-ak",
            "AWS_SECRET_ACCESS_KEY": "moto-sk",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            "AWS_CONFIG_FILE": str(root / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(root / "no-aws-credentials"),
            "XDG_CACHE_HOME": str(root / "cache"),
        })
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        files, ds = dataset
        url = f"s3://{BUCKET}/sets/ds"
        subprocess.run([brand_bin(), "pack", str(files), "-o", url, "--chunk-size", "16", "--seed", "2"],
                       check=True, capture_output=True)
        yield client, url, files, ds
    finally:
        os.environ.clear()
        os.environ.update(saved)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_a_dataset_packed_to_moto_reads_exactly_once_in_the_local_order_with_its_bytes(moto):
    _, url, files, ds = moto
    assert_reads_as_local(url, files, ds, CFG)


def test_brand_verify_and_inspect_read_the_dataset_on_moto(moto):
    _, url, _, _ = moto
    out = subprocess.run([brand_bin(), "verify", url], capture_output=True, text=True)
    assert out.returncode == 0 and f"{SAMPLES} samples, 0 problem(s)" in out.stdout, out.stdout + out.stderr
    out = subprocess.run([brand_bin(), "inspect", url], capture_output=True, text=True)
    assert out.returncode == 0 and f"samples      {SAMPLES}" in out.stdout, out.stdout + out.stderr


def test_a_segment_replaced_on_moto_during_a_run_is_an_error_naming_it(moto):
    client, url, _, _ = moto
    key = "sets/ds/data-00000.brd"
    original = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    try:
        # 10 % memory and 64 KiB of read-ahead: after the first batch, most
        # of the epoch's bytes are still to be fetched.
        with brand.Loader(url, **dict(CFG, memory="10%", readahead="64KiB")) as loader:
            next(loader)
            # The same size, one byte changed: only its entity tag tells.
            changed = bytearray(original)
            changed[len(changed) // 2] ^= 1
            client.put_object(Bucket=BUCKET, Key=key, Body=bytes(changed))
            with pytest.raises(brand.BrandError, match="changed since the dataset was opened") as e:
                for _ in loader:
                    pass
            assert key in str(e.value), e.value
    finally:
        client.put_object(Bucket=BUCKET, Key=key, Body=original)
