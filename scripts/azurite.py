#!/usr/bin/env python3
"""Azurite (Microsoft's Azure Blob Storage emulator, scripts/azurite.sh) on a
free port of 127.0.0.1 for brand's Azure tests, with containers created
through the Blob REST API (SharedKey-signed with the emulator's well-known,
public development account key: no secret).

    with azurite.serve(blob_bin) as az:
        os.environ.update(az.env)       # what a user of the emulator sets
        url = az.container("bkt")       # az://bkt

The server's data lives in memory and it is killed on exit.
"""

import base64
import contextlib
import email.utils
import hashlib
import hmac
import http.client
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

ACCOUNT = "devstoreaccount1"
# Azurite's documented development key (the same in every installation).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
API_VERSION = "2021-08-06"


class Azurite:
    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.env = {
            "AZURE_STORAGE_USE_EMULATOR": "true",
            "AZURITE_BLOB_STORAGE_URL": endpoint,
            "AZURE_ALLOW_HTTP": "true",
        }

    def container(self, name: str) -> str:
        """Creates container `name` (Create Container, SharedKey) and returns its URL."""
        date = email.utils.formatdate(usegmt=True)
        # Fields of the string to sign (Blob service, version >= 2015-02-21):
        # VERB, then eleven standard headers (all empty here), then the x-ms-
        # headers and the resource (the emulator's path repeats the account).
        to_sign = ("PUT\n" + "\n" * 11 + f"x-ms-date:{date}\nx-ms-version:{API_VERSION}\n"
                   f"/{ACCOUNT}/{ACCOUNT}/{name}\nrestype:container")
        mac = hmac.new(base64.b64decode(ACCOUNT_KEY), to_sign.encode(), hashlib.sha256).digest()
        # http.client, not urllib: urllib adds a Content-Type that would
        # have to be signed too.
        host, port = self.endpoint.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("PUT", f"/{ACCOUNT}/{name}?restype=container", body=b"", headers={
                "x-ms-date": date, "x-ms-version": API_VERSION,
                "Authorization": f"SharedKey {ACCOUNT}:{base64.b64encode(mac).decode()}"})
            r = conn.getresponse()
            body = r.read()
        finally:
            conn.close()
        if r.status != 201:
            raise RuntimeError(f"creating container {name}: {r.status} {body[:500]!r}")
        return f"az://{name}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(blob_bin: str):
    """Azurite's blob server on a free port of 127.0.0.1, stopped on exit."""
    port = free_port()
    proc = subprocess.Popen(
        [blob_bin, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
         "--silent", "--skipApiVersionCheck"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{blob_bin} ended at start: {proc.stdout.read()[-2000:]}")
            try:
                urllib.request.urlopen(f"{endpoint}/{ACCOUNT}?comp=list", timeout=2)
                break
            except urllib.error.HTTPError:
                break  # it answers (403 without a signature): it is up
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{blob_bin} did not listen on {endpoint} within 30 s")
                time.sleep(0.2)
        yield Azurite(endpoint)
    finally:
        proc.kill()
        proc.wait()
