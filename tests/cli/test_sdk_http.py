"""The SDK's HTTP behaviour against a real HTTP server (a scripted stand-in: the control plane never
answers 503 on demand): retries on 429/503 honour Retry-After, other errors raise typed with the server's
JSON, and paging follows `next`. The same behaviours against the real control plane are in test_cli_e2e.py.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ctfleet import errors
from ctfleet.client import Client, retry_after_seconds


class Scripted:
    """An HTTP server answering each request with the next scripted (status, headers, body)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.seen: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                outer.seen.append(f"{self.command} {self.path} {self.headers.get('Authorization')}")
                status, headers, body = outer.answers.pop(0)
                data = json.dumps(body).encode() if not isinstance(body, bytes) else body
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def scripted():
    made = []

    def start(answers):
        server = Scripted(answers)
        made.append(server)
        return server

    yield start
    for server in made:
        server.stop()


def test_503_and_429_are_retried_waiting_what_retry_after_says(scripted):
    server = scripted(
        [
            (503, {"Retry-After": "3"}, {"detail": "busy"}),
            (429, {"Retry-After": "7"}, {"detail": "slow down"}),
            (200, {}, {"id": "n1", "name": "gpu-1"}),
        ]
    )
    slept: list[float] = []
    with Client(server.url, "ctk_test", sleep=slept.append) as client:
        assert client.get("api/v1/nodes/n1/") == {"id": "n1", "name": "gpu-1"}
    assert slept == [3.0, 7.0]
    assert server.seen == ["GET /api/v1/nodes/n1/ Bearer ctk_test"] * 3


def test_without_retry_after_the_backoff_grows_and_gives_up_with_the_server_error(scripted):
    server = scripted([(503, {}, {"detail": "down for maintenance"})] * 4)
    slept: list[float] = []
    with Client(server.url, "k", retries=3, backoff=1.0, sleep=slept.append) as client:
        with pytest.raises(errors.ServerError) as caught:
            client.get("api/v1/nodes/")
    assert caught.value.status == 503
    assert caught.value.message == "down for maintenance"
    assert caught.value.exit_code == errors.EXIT_SERVER
    assert len(slept) == 3
    assert 0.5 <= slept[0] <= 1.0
    assert 1.0 <= slept[1] <= 2.0
    assert 2.0 <= slept[2] <= 4.0


@pytest.mark.parametrize(
    ("status", "body", "kind", "exit_code", "message"),
    [
        (400, {"name": ["This field is required."]}, errors.BadRequest, 2, "name: This field is required."),
        (401, {"detail": "Invalid, expired or revoked API key."}, errors.Unauthorized, 7, None),
        (403, {"detail": "This API key lacks the operate scope."}, errors.Forbidden, 4, None),
        (403, {"detail": "Invalid, expired or revoked API key."}, errors.Unauthorized, 7, None),
        (404, {"detail": "Not found."}, errors.NotFound, 3, None),
        (
            409,
            {"detail": "Quota exceeded: Ray clusters.", "quota": "ray_clusters", "limit": 0, "in_use": 0},
            errors.Conflict,
            4,
            None,
        ),
        (500, b"<h1>Server Error</h1>", errors.ServerError, 6, "<h1>Server Error</h1>"),
    ],
)
def test_errors_are_typed_and_carry_the_servers_json(scripted, status, body, kind, exit_code, message):
    server = scripted([(status, {}, body)])
    with Client(server.url, "k", retries=0) as client, pytest.raises(kind) as caught:
        client.post("api/v1/clusters/", {"name": ""})
    error = caught.value
    assert (error.status, error.exit_code) == (status, exit_code)
    assert error.message == (message or body["detail"])
    if isinstance(body, dict):
        assert error.body == body
    if status == 409:
        assert (error["quota"], error["limit"]) == ("ray_clusters", 0)


def test_paging_follows_next_until_the_last_page(scripted):
    server = scripted([])
    server.answers = [
        (
            200,
            {},
            {"count": 3, "next": f"{server.url}/api/v1/nodes/?limit=2&offset=2", "results": [{"n": 1}, {"n": 2}]},
        ),
        (200, {}, {"count": 3, "next": None, "results": [{"n": 3}]}),
    ]
    with Client(server.url, "k") as client:
        rows = client.paginate("api/v1/nodes/", {"status": "online"}, page_size=2, then=5)
        assert [row["n"] for row in rows] == [1, 2, 3]
    assert server.seen[0].startswith("GET /api/v1/nodes/?limit=2&status=online ")
    assert server.seen[1].startswith("GET /api/v1/nodes/?limit=5&offset=2 ")  # later pages are larger


def test_an_unreachable_control_plane_is_a_server_error_naming_the_url():
    with Client("http://127.0.0.1:9", "k", retries=1, sleep=lambda s: None) as client:
        with pytest.raises(errors.Unreachable) as caught:
            client.get("api/v1/nodes/")
    assert "http://127.0.0.1:9/" in caught.value.message
    assert caught.value.exit_code == errors.EXIT_SERVER


def test_retry_after_takes_seconds_or_an_http_date():
    assert retry_after_seconds("12") == 12.0
    assert retry_after_seconds("Sun, 06 Dec 2026 08:00:30 GMT", now=1796544000.0) == 30.0
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds(None) is None
