#!/usr/bin/env python3
"""A real S3 server for brand's tests outside Rust: tools/s3-server (s3s-fs on
127.0.0.1, SigV4 on, fault injection under /_admin/).

As a module (the Python and TF test suites)::

    with s3server.serve(bin_path) as s3:
        os.environ.update(s3.env)                 # what a user sets: AWS_ENDPOINT_URL, keys, ...
        s3.admin("faults", fail=3, status=503)    # POST /_admin/faults?fail=3&status=503
        s3.stats()["get_requests"]

As a command (the C ABI test in the Makefile)::

    scripts/s3server.py BIN -- CMD ARGS...        # CMD runs with the env of a fresh server

The server reads its stdin and stops when it closes, so it never outlives its
user; its directory is removed afterwards. Nothing listens beyond 127.0.0.1.
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

ACCESS_KEY = "brand-test-ak"
SECRET_KEY = "brand-test-sk"


class S3Server:
    def __init__(self, endpoint: str, root: str):
        self.endpoint = endpoint
        self.root = root
        self.env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            # No profile of the user's may leak into a test.
            "AWS_CONFIG_FILE": os.path.join(root, "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": os.path.join(root, "no-aws-credentials"),
        }

    def bucket(self, name: str) -> str:
        """Creates bucket `name` (a directory of the store) and returns its URL."""
        os.makedirs(os.path.join(self.root, "store", name), exist_ok=True)
        return f"s3://{name}"

    def admin(self, what: str, **params) -> dict:
        """POST /_admin/WHAT?params (faults, clear, reset-stats, release-stalls)."""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        req = urllib.request.Request(f"{self.endpoint}/_admin/{what}?{query}", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body.strip() else {}

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.endpoint}/_admin/stats", timeout=10) as r:
            return json.loads(r.read())


@contextlib.contextmanager
def serve(binary: str):
    """A fresh server on a free port of 127.0.0.1, stopped on exit."""
    root = tempfile.mkdtemp(prefix="brand-s3-")
    proc = subprocess.Popen(
        [binary, "--dir", os.path.join(root, "store"), "--port", "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        if not line.startswith("endpoint "):
            raise RuntimeError(f"{binary} did not start: {line!r}")
        yield S3Server(line.split(" ", 1)[1], root)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    with serve(argv[0]) as s3:
        s3.bucket("bkt")
        return subprocess.run(argv[2:], env={**os.environ, **s3.env}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
