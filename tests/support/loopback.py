"""A threaded HTTP server on loopback, the common base of the test stand-ins (Hub, Kubernetes, ArgoCD, registry)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class LoopbackHTTPServer:
    """Serves on 127.0.0.1 and hands every request to `handle(method, request)` of the subclass."""

    methods: tuple[str, ...] = ("GET",)

    def __init__(self, port: int = 0) -> None:
        owner = self

        def route(method: str) -> Any:
            return lambda request: owner.handle(method, request)

        attrs: dict[str, Any] = {
            "protocol_version": "HTTP/1.1",
            "log_message": lambda request, *args: None,
            **{f"do_{method}": route(method) for method in self.methods},
        }
        handler = type(f"{type(self).__name__}Handler", (BaseHTTPRequestHandler,), attrs)
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def handle(self, method: str, request: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
