"""A loopback stand-in for the Hugging Face Hub's file API, enough for `huggingface_hub.snapshot_download`.

It serves, for repositories added with `add_repo`:
- ``GET /api/models/<repo>/revision/<rev>``: repo info (``sha``, ``siblings``), 404 with
  ``X-Error-Code: RepoNotFound`` / ``RevisionNotFound`` otherwise;
- ``GET /api/models/<repo>/tree/<rev>``: the file listing (``type``, ``path``, ``size``, ``oid``);
- ``HEAD|GET /<repo>/resolve/<rev>/<file>``: the bytes with ``ETag``, ``X-Repo-Commit``,
  ``Content-Length``, ``Accept-Ranges`` and ``Range`` support (206 + ``Content-Range``).
`drop_after(repo, file, nbytes, times)` makes the next `times` GETs of a file close the connection after
`nbytes` bytes, to exercise resumable downloads. Every request is recorded in `requests`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlsplit

from tests.support.loopback import LoopbackHTTPServer

_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?P<sub>/.*)?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class HubRepo:
    """One repository at one commit."""

    sha: str
    files: dict[str, bytes]
    branches: set[str] = field(default_factory=lambda: {"main"})


@dataclass
class RecordedRequest:
    """A request the stand-in received."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names


class HubStandin(LoopbackHTTPServer):
    """Threaded HTTP server on 127.0.0.1 that behaves like the Hub for the endpoints above."""

    methods = ("GET", "HEAD")

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[RecordedRequest] = []
        self._drops: dict[tuple[str, str], list[int]] = {}
        self._lock = threading.Lock()
        super().__init__(0)

    def handle(self, method: str, request: BaseHTTPRequestHandler) -> None:
        self._handle(request, head=method == "HEAD")

    def add_repo(self, repo_id: str, files: dict[str, bytes]) -> str:
        """Publish `files` as the `main` branch of `repo_id`; returns the commit sha."""
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + files[name])
        sha = digest.hexdigest()
        self.repos[repo_id] = HubRepo(sha=sha, files=dict(files))
        return sha

    def drop_after(self, repo_id: str, filename: str, nbytes: int, times: int = 1) -> None:
        """The next `times` GETs of the file send `nbytes` bytes and then drop the connection."""
        with self._lock:
            self._drops[(repo_id, filename)] = [nbytes] * times

    def gets_of(self, filename: str) -> list[RecordedRequest]:
        """GET requests for one file's bytes (in order)."""
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + filename)]

    # ---- request handling

    def _handle(self, req: BaseHTTPRequestHandler, *, head: bool) -> None:
        path = unquote(urlsplit(req.path).path)
        with self._lock:
            self.requests.append(RecordedRequest(req.command, path, {k.lower(): v for k, v in req.headers.items()}))
        if match := _INFO.match(path):
            repo = self._repo(req, match["repo"], match["rev"])
            if repo is not None:
                body = {
                    "id": match["repo"],
                    "modelId": match["repo"],
                    "sha": repo.sha,
                    "private": False,
                    "siblings": [{"rfilename": name} for name in sorted(repo.files)],
                }
                self._json(req, 200, body, head=head)
            return
        if match := _TREE.match(path):
            repo = self._repo(req, match["repo"], match["rev"])
            if repo is not None:
                listing = [
                    {"type": "file", "path": name, "size": len(data), "oid": _git_blob_sha(data)}
                    for name, data in sorted(repo.files.items())
                ]
                self._json(req, 200, listing, head=head)
            return
        if match := _RESOLVE.match(path):
            repo = self._repo(req, match["repo"], match["rev"])
            if repo is None:
                return
            data = repo.files.get(match["file"])
            if data is None:
                self._json(req, 404, {"error": "Entry not found"}, head=head, error_code="EntryNotFound")
                return
            self._file(req, match["repo"], match["file"], repo, data, head=head)
            return
        self._json(req, 404, {"error": "not found"}, head=head)

    def _repo(self, req: BaseHTTPRequestHandler, repo_id: str, rev: str) -> HubRepo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._json(
                req, 404, {"error": "Repository not found"}, head=req.command == "HEAD", error_code="RepoNotFound"
            )
            return None
        if rev != repo.sha and rev not in repo.branches:
            self._json(
                req, 404, {"error": f"Invalid rev id: {rev}"}, head=req.command == "HEAD", error_code="RevisionNotFound"
            )
            return None
        return repo

    def _json(
        self, req: BaseHTTPRequestHandler, status: int, body: object, *, head: bool, error_code: str = ""
    ) -> None:
        raw = json.dumps(body).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(raw)))
        if error_code:
            req.send_header("X-Error-Code", error_code)
            req.send_header("X-Error-Message", str(body))
        req.end_headers()
        if not head:
            req.wfile.write(raw)

    def _file(
        self, req: BaseHTTPRequestHandler, repo_id: str, name: str, repo: HubRepo, data: bytes, *, head: bool
    ) -> None:
        start, status = 0, 200
        range_header = req.headers.get("Range")
        if range_header and (match := _RANGE.match(range_header.strip())):
            start, status = int(match[1]), 206
            if start >= len(data):
                req.send_response(416)
                req.send_header("Content-Range", f"bytes */{len(data)}")
                req.send_header("Content-Length", "0")
                req.end_headers()
                return
        body = data[start:]
        req.send_response(status)
        req.send_header("Content-Type", "application/octet-stream")
        req.send_header("Content-Length", str(len(body)))
        req.send_header("Accept-Ranges", "bytes")
        req.send_header("ETag", f'"{_git_blob_sha(data)}"')
        req.send_header("X-Repo-Commit", repo.sha)
        if status == 206:
            req.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        req.end_headers()
        if head:
            return
        drop: int | None = None
        with self._lock:
            plan = self._drops.get((repo_id, name))
            if plan:
                drop = plan.pop(0)
        if drop is not None and drop < len(body):
            req.wfile.write(body[:drop])
            req.wfile.flush()
            req.close_connection = True
            req.connection.shutdown(2)
            return
        req.wfile.write(body)


def _git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
