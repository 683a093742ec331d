"""A loopback stand-in for a KubeRay head's Ray state API: ``GET /api/v0/nodes`` in Ray 2.x's shape.

The body is what Ray's dashboard answers (``{"result": true, "msg": "", "data": {"result": {"total",
"result": [NodeState, …]}}}``, fields as in ``ray.util.state.common.NodeState``); `nodes` holds the
rows; ``GET /api/serve/applications/`` (Serve's REST API) answers `serve_applications`. Every other
path answers 404 and is recorded in `paths`, so tests see what the agent asked.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.loopback import LoopbackHTTPServer


def node_row(node_id: str, *, head: bool, cpus: float = 1.0, state: str = "ALIVE") -> dict[str, Any]:
    """One NodeState row."""
    return {
        "node_id": node_id,
        "node_ip": "10.0.0.10" if head else "10.0.0.11",
        "is_head_node": head,
        "state": state,
        "state_message": None,
        "node_name": "10.0.0.10" if head else "10.0.0.11",
        "resources_total": {"CPU": cpus, "memory": 1.0e9},
        "labels": {"ray.io/node_id": node_id},
    }


class RayHeadStandin(LoopbackHTTPServer):
    """Answers the state API's node list from `nodes`."""

    def __init__(self, nodes: list[dict[str, Any]] | None = None) -> None:
        self.nodes = list(nodes or [])
        self.serve_applications: dict[str, Any] = {}
        self.paths: list[str] = []
        super().__init__(0)

    def handle(self, method: str, request: BaseHTTPRequestHandler) -> None:
        self.paths.append(request.path)
        if request.path.split("?", 1)[0] == "/api/v0/nodes":
            status = 200
            body: dict[str, Any] = {
                "result": True,
                "msg": "",
                "data": {
                    "result": {"total": len(self.nodes), "num_after_truncation": len(self.nodes), "result": self.nodes}
                },
            }
        elif request.path.split("?", 1)[0] == "/api/serve/applications/":
            status, body = 200, {"applications": self.serve_applications}
        else:
            status, body = 404, {"result": False, "msg": "not found", "data": {}}
        raw = json.dumps(body).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(raw)))
        request.end_headers()
        request.wfile.write(raw)
