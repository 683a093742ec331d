"""The hand-written layer over the generated models: one HTTP client with a base URL and an API key,
paging, retries with backoff on 429/503 honouring `Retry-After`, typed errors, and waits for a state.

    from ctfleet import Client
    with Client("https://fleet.example.com", "ctk_…") as fleet:
        for node in fleet.nodes(status="online"):
            print(node.name, node.cpu_percent)
        commands = fleet.run_command(cluster_id, "container.create", {"image": "busybox", "name": "x"})
        fleet.wait_command(commands[0].id, timeout=120)
"""

from __future__ import annotations

import email.utils
import json as jsonlib
import random
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

from ctfleet import errors
from ctfleet._httpx import httpx

if TYPE_CHECKING:
    from ctfleet import models

RETRY_STATUSES = frozenset({429, 503})
TERMINAL_COMMAND = frozenset({"succeeded", "failed", "cancelled", "expired"})
TERMINAL_WORKLOAD = frozenset({"succeeded", "failed", "cancelled", "stopped"})


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds a `Retry-After` header asks for (a number of seconds or an HTTP date), None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class Client:
    """A client of one control plane: `base_url` (e.g. http://127.0.0.1:8000) and an API key (`ctk_…`).

    `retries` 429/503 answers (and connection failures of reads) up to that many times, waiting what the
    server's `Retry-After` says, else `backoff` * 2^attempt seconds with jitter, at most `max_backoff`.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        verify: bool | str = True,
    ) -> None:
        self.base_url = base_url.rstrip("/") + "/"
        self.api_key = api_key
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.sleep = sleep
        headers = {"Accept": "application/json", "User-Agent": "ctfleet"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if self.base_url.startswith("http://"):
            verify = False  # no TLS to verify: spares loading the CA bundle (~50 ms) for a plain-HTTP URL
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, verify=verify)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- raw requests -------------------------------------------------------------------------------

    def url(self, path: str) -> str:
        return urljoin(self.base_url, path.lstrip("/"))

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        asked = retry_after_seconds(response.headers.get("Retry-After")) if response is not None else None
        if asked is not None:
            return min(asked, self.max_backoff)
        return min(self.max_backoff, self.backoff * (2**attempt)) * (0.5 + random.random() / 2)

    def send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
    ) -> httpx.Response:
        """One request, retried on 429/503 (and, for reads, on connection failures); errors raise typed."""
        method = method.upper()
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        url = path if path.startswith("http") else self.url(path)
        attempt = 0
        while True:
            try:
                response = self.http.request(method, url, params=clean or None, json=json)
            except httpx.TransportError as exc:
                if method == "GET" and attempt < self.retries:
                    self.sleep(self._delay(attempt, None))
                    attempt += 1
                    continue
                raise errors.Unreachable(f"Cannot reach {self.base_url}: {exc}") from exc
            if response.status_code in RETRY_STATUSES and attempt < self.retries:
                self.sleep(self._delay(attempt, response))
                attempt += 1
                continue
            if response.status_code >= 400:
                raise errors.error_for(response.status_code, _body(response), method=method, url=str(response.url))
            return response

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """`send`, answering the decoded JSON (None for an empty answer)."""
        response = self.send(method, path, **kwargs)
        return _body(response) if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body if body is not None else {})

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def call(
        self, operation_id: str, *, id: str | None = None, params: dict[str, Any] | None = None, body: Any = None
    ) -> Any:
        """Call an operation of the schema by its operationId (`v1_nodes_drain_create`, id=…)."""
        from ctfleet import models

        method, template = models.OPERATIONS[operation_id]
        path = template.replace("{id}", str(id)) if "{id}" in template else template
        return self.request(method, path, params=params, json=body if method != "GET" else None)

    def paginate(
        self, path: str, params: dict[str, Any] | None = None, *, page_size: int = 100, then: int = 1000
    ) -> Iterator[dict]:
        """Every row of a paged list, page by page: a first page of `page_size` rows (shown at once), then
        pages of `then` rows (the API's largest) following `next`; a list that is not paged is yielded whole."""
        query = {"limit": page_size, **(params or {})}
        page = self.request("GET", path, params=query)
        while True:
            if isinstance(page, list):
                yield from page
                return
            yield from page.get("results", [])
            following = page.get("next")
            if not following:
                return
            page = self.request("GET", str(httpx.URL(following).copy_set_param("limit", max(page_size, then))))

    # ---- waits --------------------------------------------------------------------------------------

    def wait_for(
        self,
        fetch: Callable[[], dict[str, Any]],
        done: Callable[[dict[str, Any]], bool],
        *,
        failed: Callable[[dict[str, Any]], bool] = lambda obj: False,
        timeout: float = 300.0,
        interval: float = 1.0,
        what: str = "the state",
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll `fetch` until `done` (returns the object) or `failed` (raises `Failed`); `WaitTimeout` after
        `timeout` seconds. `on_change` sees each new state."""
        deadline = time.monotonic() + timeout
        last: Any = object()
        while True:
            obj = fetch()
            state = obj.get("status")
            if on_change is not None and state != last:
                on_change(obj)
            last = state
            if done(obj):
                return obj
            if failed(obj):
                raise errors.Failed(f"{what}: {state}", obj)
            if time.monotonic() >= deadline:
                raise errors.WaitTimeout(f"Timed out after {timeout:g} s waiting for {what} (now {state}).")
            time.sleep(interval)

    def follow_events(
        self,
        path: str,
        *,
        follow: bool = False,
        tail: int = 50,
        interval: float = 2.0,
        timeout: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """An event log (a node's, an endpoint's, a Ray cluster's `…/events/`, which the API lists newest
        first): its last `tail` events oldest first, then, with `follow`, each new one as it appears (polled
        every `interval` s; until `timeout` s if given)."""
        seen: set[Any] = set()
        deadline = None if timeout is None else time.monotonic() + timeout
        limit = tail
        while True:
            page = self.get(path, limit=limit)
            rows = page.get("results", []) if isinstance(page, dict) else page
            for row in reversed(rows):
                if row["id"] not in seen:
                    seen.add(row["id"])
                    yield row
            limit = 100
            if not follow or (deadline is not None and time.monotonic() >= deadline):
                return
            time.sleep(interval)

    def follow_logs(
        self, path: str, *, follow: bool = False, interval: float = 2.0, timeout: float | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """The logs of a training job, Tune experiment (`logs`) or Serve deployment (`replica_logs`) at `path`:
        (new text, the object) per poll; with `follow`, until it has ended (or `timeout` s)."""
        printed = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            obj = self.get(path)
            text = obj.get("logs") or obj.get("replica_logs") or ""
            if isinstance(text, dict | list):
                text = jsonlib.dumps(text, indent=2)
            if len(text) < printed:  # the server keeps a tail of the logs: it moved on
                printed = 0
            yield text[printed:], obj
            printed = len(text)
            ended = obj.get("status") in TERMINAL_WORKLOAD
            if not follow or ended or (deadline is not None and time.monotonic() >= deadline):
                return
            time.sleep(interval)

    def wait_command(self, command_id: str, *, timeout: float = 300.0, interval: float = 0.5) -> models.Command:
        """Wait until a node command finishes; a failed one raises `Failed` carrying its error."""
        from ctfleet import models

        obj = self.wait_for(
            lambda: self.call("v1_commands_retrieve", id=command_id),
            lambda c: c["status"] == "succeeded",
            failed=lambda c: c["status"] in TERMINAL_COMMAND,
            timeout=timeout,
            interval=interval,
            what=f"command {command_id}",
        )
        return models.Command.from_dict(obj)

    # ---- typed helpers ------------------------------------------------------------------------------

    def workspaces(self) -> Iterator[models.Workspace]:
        from ctfleet import models

        return (models.Workspace.from_dict(row) for row in self.paginate("api/v1/workspaces/"))

    def clusters(self, **filters: Any) -> Iterator[models.Cluster]:
        from ctfleet import models

        return (models.Cluster.from_dict(row) for row in self.paginate("api/v1/clusters/", filters))

    def nodes(self, **filters: Any) -> Iterator[models.Node]:
        from ctfleet import models

        return (models.Node.from_dict(row) for row in self.paginate("api/v1/nodes/", filters))

    def node(self, node_id: str) -> models.Node:
        from ctfleet import models

        return models.Node.from_dict(self.call("v1_nodes_retrieve", id=node_id))

    def endpoints(self, **filters: Any) -> Iterator[models.Endpoint]:
        from ctfleet import models

        return (models.Endpoint.from_dict(row) for row in self.paginate("api/v1/endpoints/", filters))

    def quotas(self, workspace_id: str) -> models.Quotas:
        from ctfleet import models

        return models.Quotas.from_dict(self.call("v1_workspaces_quotas_retrieve", id=workspace_id))

    def run_command(
        self, cluster_id: str, command_type: str, payload: dict[str, Any] | None = None, *, node_id: str | None = None
    ) -> list[models.Command]:
        """Dispatch a command to one node (`node_id`) or to every online node of the cluster."""
        from ctfleet import models

        body = {"command_type": command_type, "payload": payload or {}, "node_id": node_id}
        answer = self.call("v1_clusters_commands_create", id=cluster_id, body=body)
        return [models.Command.from_dict(row) for row in answer["commands"]]


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (ValueError, jsonlib.JSONDecodeError):
        return {"detail": response.text.strip()[:2000] or f"HTTP {response.status_code}"}
