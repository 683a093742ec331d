"""A loopback container registry stand-in (Docker Registry HTTP API v2, read-only) for real pulls.

It serves one image (config + layers taken from an image already in the engine, via ``docker save``)
under any repository name and tag, as an OCI manifest: ``GET /v2/``, ``HEAD|GET
/v2/<name>/manifests/<ref>``, ``HEAD|GET /v2/<name>/blobs/<digest>``. With `credentials` set, every
request needs HTTP Basic auth and gets ``401`` + ``WWW-Authenticate`` otherwise, like a private registry.
Podman reaches it over plain HTTP because `.ci/podman-setup` lists its address as insecure.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import tarfile
from http.server import BaseHTTPRequestHandler

from tests.support.loopback import LoopbackHTTPServer

_MANIFEST = re.compile(r"^/v2/(?P<name>.+)/manifests/(?P<ref>[^/]+)$")
_BLOB = re.compile(r"^/v2/(?P<name>.+)/blobs/(?P<digest>sha256:[0-9a-f]{64})$")
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class RegistryStandin(LoopbackHTTPServer):
    """Serves the image from `saved` (a ``docker save`` tarball) on 127.0.0.1:`port`."""

    methods = ("GET", "HEAD")

    def __init__(self, saved: bytes, port: int, *, credentials: tuple[str, str] | None = None) -> None:
        archive = tarfile.open(fileobj=io.BytesIO(saved))
        [entry] = json.loads(archive.extractfile("manifest.json").read())  # type: ignore[union-attr]
        config = archive.extractfile(entry["Config"]).read()  # type: ignore[union-attr]
        layers = [archive.extractfile(name).read() for name in entry["Layers"]]  # type: ignore[union-attr]
        self.blobs = {_digest(blob): blob for blob in [config, *layers]}
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _digest(config),
                "size": len(config),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _digest(layer), "size": len(layer)}
                for layer in layers
            ],
        }
        self.manifest = json.dumps(manifest).encode()
        self.credentials = credentials
        self.requests: list[str] = []
        super().__init__(port)

    def handle(self, method: str, request: BaseHTTPRequestHandler) -> None:
        self._handle(request, head=method == "HEAD")

    def _handle(self, req: BaseHTTPRequestHandler, *, head: bool) -> None:
        self.requests.append(f"{req.command} {req.path}")
        if self.credentials is not None:
            expected = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
            if req.headers.get("Authorization") != expected:
                body = {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}
                self._send(
                    req,
                    401,
                    json.dumps(body).encode(),
                    "application/json",
                    head=head,
                    extra={"WWW-Authenticate": 'Basic realm="standin"'},
                )
                return
        path = req.path.split("?", 1)[0]
        if path in ("/v2/", "/v2"):
            self._send(req, 200, b"{}", "application/json", head=head)
        elif _MANIFEST.match(path):
            self._send(
                req,
                200,
                self.manifest,
                MANIFEST_TYPE,
                head=head,
                extra={"Docker-Content-Digest": _digest(self.manifest)},
            )
        elif (match := _BLOB.match(path)) and match["digest"] in self.blobs:
            blob = self.blobs[match["digest"]]
            self._send(
                req, 200, blob, "application/octet-stream", head=head, extra={"Docker-Content-Digest": match["digest"]}
            )
        else:
            body = {"errors": [{"code": "BLOB_UNKNOWN", "message": "not found"}]}
            self._send(req, 404, json.dumps(body).encode(), "application/json", head=head)

    @staticmethod
    def _send(
        req: BaseHTTPRequestHandler,
        status: int,
        body: bytes,
        content_type: str,
        *,
        head: bool,
        extra: dict[str, str] | None = None,
    ) -> None:
        req.send_response(status)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            req.send_header(key, value)
        req.end_headers()
        if not head:
            req.wfile.write(body)
