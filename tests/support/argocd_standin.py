"""A loopback stand-in for the ArgoCD API's application sync endpoint, recording every call.

``POST /api/v1/applications/<app>/sync`` answers 200 with a minimal Application when the bearer token
matches and the application is known, 401 / 404 (ArgoCD-style ``{"error", "code", "message"}``)
otherwise; `fail_with` makes the next calls answer a chosen status.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.loopback import LoopbackHTTPServer

_SYNC = re.compile(r"^/api/v1/applications/(?P<app>[^/]+)/sync$")


@dataclass
class SyncCall:
    """One sync request as received."""

    app: str
    authorization: str
    body: dict[str, Any]


class ArgoCDStandin(LoopbackHTTPServer):
    """Threaded HTTP server on 127.0.0.1 serving the sync endpoint for `apps`."""

    methods = ("POST",)

    def __init__(self, token: str = "argocd-token", apps: tuple[str, ...] = ("workloads",)) -> None:
        self.token = token
        self.apps = set(apps)
        self.calls: list[SyncCall] = []
        self.fail_status: int | None = None
        self._lock = threading.Lock()
        super().__init__(0)

    def handle(self, method: str, request: BaseHTTPRequestHandler) -> None:
        self._post(request)

    def fail_with(self, status: int | None) -> None:
        """Answer every following sync with `status` (None: behave normally again)."""
        self.fail_status = status

    def _post(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        try:
            body = json.loads(req.rfile.read(length) or b"{}")
        except ValueError:
            body = {}
        match = _SYNC.match(req.path)
        app = match["app"] if match else ""
        with self._lock:
            self.calls.append(SyncCall(app, req.headers.get("Authorization", ""), body))
        if match is None:
            self._send(req, 404, {"error": "Not Found", "code": 5, "message": "Not Found"})
        elif req.headers.get("Authorization") != f"Bearer {self.token}":
            self._send(req, 401, {"error": "invalid session", "code": 16, "message": "invalid session"})
        elif self.fail_status is not None:
            self._send(req, self.fail_status, {"error": "boom", "code": 13, "message": "sync failed in stand-in"})
        elif app not in self.apps:
            message = f'applications.argoproj.io "{app}" not found'
            self._send(req, 404, {"error": message, "code": 5, "message": message})
        else:
            self._send(req, 200, {"metadata": {"name": app}, "status": {"sync": {"status": "Syncing"}}})

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(raw)))
        req.end_headers()
        req.wfile.write(raw)
