#!/usr/bin/env python3
"""A GCS emulator for brand's gs:// tests: gcp-storage-emulator (pure Python,
installed by scripts/gcs-emulator.sh) with the parts of GCS's XML API that
Apache object_store's GCS client uses and that emulator lacks, served over
the emulator's own storage.

    python scripts/gcs_emulator.py --host 127.0.0.1 --port PORT

object_store speaks the XML API (https://cloud.google.com/storage/docs/xml-api):
path-style objects at /BUCKET/OBJECT, ListObjectsV2-style listings at
/BUCKET?list-type=2, XML multipart uploads. The emulator serves the JSON API
(/storage/v1, /upload/storage/v1) and of the XML API only GET (no ETag,
Last-Modified nor If-Match) and a plain PUT; HEAD, DELETE, listings and
multipart uploads answer 501. This shim adds, for path-style requests only:

* GET/HEAD with ETag (the MD5, as GCS gives it for a simple upload),
  Last-Modified, x-goog-generation, Range, and If-Match/If-None-Match (412/304);
* PUT with x-goog-if-generation-match (412), answering ETag and generation;
* DELETE; GET /BUCKET?list-type=2 with prefix, delimiter, start-after,
  max-keys and continuation-token;
* multipart: POST ?uploads, PUT ?partNumber&uploadId, POST ?uploadId, DELETE ?uploadId;
* errors as GCS's XML body (<Error><Code>NoSuchBucket</Code>…): 404 for a
  missing bucket or object.

Everything else (the JSON API the tests upload and create buckets through)
goes to the emulator unchanged. Objects are stored with the emulator's own
object resources, so either API reads what the other wrote. Single-threaded,
HTTP/1.0, data in memory: a test fixture, not a server.
"""

import argparse
import base64
import contextlib
import email.utils
import hashlib
import logging
import secrets
import signal
import sys
import tempfile
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from functools import partial
from http import server as http_server
from urllib.parse import parse_qs, unquote, urlparse
from xml.sax.saxutils import escape

from gcp_storage_emulator import server as emu
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects as emu_objects
from gcp_storage_emulator.storage import Storage

# Paths of the emulator's JSON API (and its internals): never path-style objects.
JSON_PREFIXES = ("/storage/", "/upload/", "/download/", "/batch/", "/b/", "/wipe")


def etag_of(obj):
    """GCS's XML ETag of a non-composite object: its MD5 in hex, quoted."""
    md5 = obj.get("md5Hash")
    if not md5:
        return '"%s"' % obj["generation"]
    return '"%s"' % base64.b64decode(md5).hex()


def http_date(obj):
    updated = datetime.strptime(obj["updated"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    return email.utils.format_datetime(updated, usegmt=True)


class Handler(emu.RequestHandler):
    """The emulator's handler, path-style XML requests answered here first."""

    uploads = {}  # upload id -> (bucket, object, {part number: bytes})

    # -- plumbing ---------------------------------------------------------

    def _target(self):
        """(bucket, object or None, query) of a path-style request, or None."""
        url = urlparse(self.path)
        if url.path == "/" or url.path.startswith(JSON_PREFIXES):
            return None
        bucket, _, obj = url.path.lstrip("/").partition("/")
        return unquote(bucket), unquote(obj) or None, parse_qs(url.query, keep_blank_values=True)

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status, headers=(), body=b"", length=None):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status, code, message):
        body = ("<?xml version='1.0' encoding='UTF-8'?><Error><Code>%s</Code><Message>%s</Message></Error>"
                % (code, escape(message))).encode()
        self._send(status, [("Content-Type", "application/xml; charset=UTF-8")], body)

    def _xml(self, body):
        self._send(200, [("Content-Type", "application/xml; charset=UTF-8")],
                   ("<?xml version='1.0' encoding='UTF-8'?>" + body).encode())

    def _bucket_exists(self, bucket):
        if self.storage.get_bucket(bucket) is None:
            self._error(404, "NoSuchBucket", "The specified bucket does not exist.")
            return False
        return True

    def _object(self, bucket, name):
        try:
            return self.storage.get_file_obj(bucket, name)
        except NotFound:
            return None

    def _dispatch(self, fallback):
        target = self._target()
        if target is None:
            return fallback(self)
        bucket, name, query = target
        try:
            getattr(self, "xml_" + self.command.lower())(bucket, name, query)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left (a GET it no longer needs): nobody to answer
        except Exception as e:  # a shim bug shows as a 500 naming it, never a hang
            logging.exception("shim")
            self._error(500, "InternalError", repr(e))

    def do_GET(self):
        self._dispatch(emu.RequestHandler.do_GET)

    def do_HEAD(self):
        self._dispatch(lambda h: h._error(501, "NotImplemented", "HEAD"))

    def do_PUT(self):
        self._dispatch(emu.RequestHandler.do_PUT)

    def do_POST(self):
        self._dispatch(emu.RequestHandler.do_POST)

    def do_DELETE(self):
        self._dispatch(emu.RequestHandler.do_DELETE)

    # -- the XML API --------------------------------------------------------

    def xml_get(self, bucket, name, query):
        if name is None:
            return self.list_objects(bucket, query)
        if not self._bucket_exists(bucket):
            return
        obj = self._object(bucket, name)
        if obj is None:
            return self._error(404, "NoSuchKey", "The specified key does not exist.")
        etag = etag_of(obj)
        if_match = self.headers.get("If-Match")
        if if_match is not None and if_match not in (etag, "*"):
            return self._error(412, "PreconditionFailed", "If-Match: %s, the object's is %s" % (if_match, etag))
        if self.headers.get("If-None-Match") in (etag, "*"):
            return self._send(304)
        data = self.storage.get_file(bucket, name)
        headers = [("ETag", etag), ("Last-Modified", http_date(obj)),
                   ("x-goog-generation", obj["generation"]), ("x-goog-metageneration", "1"),
                   ("Content-Type", obj.get("contentType") or "application/octet-stream"),
                   ("Accept-Ranges", "bytes")]
        status = 200
        wanted = self.headers.get("Range")
        if wanted:
            first, _, last = wanted.removeprefix("bytes=").partition("-")
            size = len(data)
            if first == "":  # a suffix: the last N bytes
                start, end = max(0, size - int(last)), size
            else:
                start = int(first)
                end = min(size, int(last) + 1) if last else size
            if start >= size:
                return self._error(416, "InvalidRange", "The requested range cannot be satisfied.")
            headers.append(("Content-Range", "bytes %d-%d/%d" % (start, end - 1, size)))
            data, status = data[start:end], 206
        self._send(status, headers, data)

    xml_head = xml_get

    def xml_put(self, bucket, name, query):
        if name is None or not self._bucket_exists(bucket):
            return name is None and self._error(400, "InvalidArgument", "PUT of a bucket")
        data = self._body()
        if "uploadId" in query:
            upload = self.uploads.get(query["uploadId"][0])
            if upload is None:
                return self._error(404, "NoSuchUpload", "The specified upload does not exist.")
            upload[2][int(query["partNumber"][0])] = data
            return self._send(200, [("ETag", '"%s"' % hashlib.md5(data).hexdigest())])
        must = self.headers.get("x-goog-if-generation-match")
        if must is not None:
            obj = self._object(bucket, name)
            have = obj["generation"] if obj else "0"
            if must != have:
                return self._error(412, "PreconditionFailed", "generation %s, not %s" % (have, must))
        self.store(bucket, name, data)

    def store(self, bucket, name, data):
        """`data` as object `name`, through the emulator's storage, as its JSON API stores it."""
        obj = emu_objects._make_object_resource(
            "http://%s:%d" % self.server.server_address, bucket, name,
            self.headers.get("Content-Type") or "application/octet-stream", str(len(data)))
        obj = emu_objects._checksums(data, obj)
        self.storage.create_file(bucket, name, data, obj)
        self._send(200, [("ETag", etag_of(obj)), ("x-goog-generation", obj["generation"])])
        return obj

    def xml_post(self, bucket, name, query):
        if name is None or not self._bucket_exists(bucket):
            return name is None and self._error(400, "InvalidArgument", "POST to a bucket")
        if "uploads" in query:
            upload_id = secrets.token_hex(16)
            self.uploads[upload_id] = (bucket, name, {})
            self._body()
            return self._xml("<InitiateMultipartUploadResult><Bucket>%s</Bucket><Key>%s</Key>"
                             "<UploadId>%s</UploadId></InitiateMultipartUploadResult>"
                             % (escape(bucket), escape(name), upload_id))
        if "uploadId" in query:
            upload = self.uploads.pop(query["uploadId"][0], None)
            if upload is None:
                return self._error(404, "NoSuchUpload", "The specified upload does not exist.")
            parts = upload[2]
            listed = [(int(p.findtext("PartNumber")), p.findtext("ETag"))
                      for p in ET.fromstring(self._body()).iter("Part")]
            numbers = [n for n, _ in listed]
            if not listed or numbers != sorted(numbers) or any(
                    n not in parts or tag != '"%s"' % hashlib.md5(parts[n]).hexdigest() for n, tag in listed):
                return self._error(400, "InvalidPart", "parts %s, uploaded %s" % (listed, sorted(parts)))
            listed = numbers
            data = b"".join(parts[n] for n in listed)
            obj = emu_objects._make_object_resource(
                "http://%s:%d" % self.server.server_address, bucket, name, "application/octet-stream", str(len(data)))
            obj = emu_objects._checksums(data, obj)
            self.storage.create_file(bucket, name, data, obj)
            self._send(200, [("Content-Type", "application/xml; charset=UTF-8"),
                             ("x-goog-generation", obj["generation"])],
                       ("<?xml version='1.0' encoding='UTF-8'?><CompleteMultipartUploadResult>"
                        "<Bucket>%s</Bucket><Key>%s</Key><ETag>%s</ETag></CompleteMultipartUploadResult>"
                        % (escape(bucket), escape(name), escape(etag_of(obj)))).encode())
            return
        self._error(400, "InvalidArgument", "POST without uploads or uploadId")

    def xml_delete(self, bucket, name, query):
        if name is None or not self._bucket_exists(bucket):
            return name is None and self._error(400, "InvalidArgument", "DELETE of a bucket")
        if "uploadId" in query:
            self.uploads.pop(query["uploadId"][0], None)
            return self._send(204)
        if self._object(bucket, name) is None:
            return self._error(404, "NoSuchKey", "The specified key does not exist.")
        self.storage.delete_file(bucket, name)
        self._send(204)

    def list_objects(self, bucket, query):
        if not self._bucket_exists(bucket):
            return
        one = lambda k: query.get(k, [None])[0] or None  # noqa: E731
        prefix, delimiter = one("prefix"), one("delimiter")
        after = one("continuation-token") or one("start-after") or ""
        limit = int(one("max-keys") or 1000)
        objs, prefixes = self.storage.get_file_list(bucket, prefix, delimiter)
        entries = sorted([(o["name"], o) for o in objs] + [(p, None) for p in prefixes], key=lambda e: e[0])
        entries = [e for e in entries if e[0] > after]
        page, more = entries[:limit], len(entries) > limit
        body = ["<ListBucketResult><Name>%s</Name><KeyCount>%d</KeyCount>" % (escape(bucket), len(page))]
        for key, obj in page:
            if obj is None:
                body.append("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>" % escape(key))
            else:
                body.append("<Contents><Key>%s</Key><Size>%s</Size><LastModified>%s</LastModified>"
                            "<ETag>%s</ETag></Contents>" % (escape(key), obj["size"], obj["updated"],
                                                             escape(etag_of(obj))))
        if more:
            body.append("<IsTruncated>true</IsTruncated><NextContinuationToken>%s</NextContinuationToken>"
                        % escape(page[-1][0]))
        body.append("</ListBucketResult>")
        self._xml("".join(body))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--settings-dir", help="where the emulator keeps its settings (default: a temporary "
                    "directory, removed when it ends by SIGTERM or SIGINT; a caller that kills it passes its own)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.ExitStack() as stack:
        settings = args.settings_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="brand-gcs-"))
        # In memory; the emulator still wants a directory for its settings.
        storage = Storage(use_memory_fs=True, data_dir=settings)
        httpd = http_server.HTTPServer((args.host, args.port), partial(Handler, storage))
        stack.callback(httpd.server_close)
        print("listening on http://%s:%d" % httpd.server_address, flush=True)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
