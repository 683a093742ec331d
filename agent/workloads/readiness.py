"""A started endpoint server's wait until it serves: a leader or one-node server until it lists its model on
GET /v1/models, a headless follower until it has lived `FOLLOWER_SETTLE_S`; a server that exits first, or
does not answer in time, fails the start with its log's tail. A stop of the endpoint meanwhile cancels it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import requests

from agent.errors import CommandFailed
from agent.executors.base import ProgressFn
from agent.protocol import EndpointStartPayload
from agent.workloads.server_host import Spawned
from agent.workloads.server_process import log_tail
from agent.workloads.start_phases import PhaseClock

LOG_TAIL_BYTES = 4000
FOLLOWER_SETTLE_S = 5.0  # how long a follower must live to count as started


def raise_if_cancelled(payload: EndpointStartPayload, cancel: threading.Event) -> None:
    """CommandFailed(conflict) when a stop of the endpoint came while its start was in flight."""
    if cancel.is_set():
        raise CommandFailed(
            "conflict",
            f"endpoint {payload.endpoint_id} was stopped while it was starting; its server is not running",
            endpoint_id=payload.endpoint_id,
        )


def wait_ready(
    payload: EndpointStartPayload,
    child: Spawned,
    port: int,
    log_path: Path,
    progress: ProgressFn,
    cancel: threading.Event,
    clock: PhaseClock,
    timeout_s: float,
) -> None:
    """Return once the server on `port` lists the payload's model; `clock` marks the model loaded and healthy."""
    deadline = time.monotonic() + timeout_s
    url = f"http://127.0.0.1:{port}/v1/models"
    last_note = 0.0
    while True:
        raise_if_cancelled(payload, cancel)
        _raise_if_exited(child, log_path, "endpoint server", " before answering")
        clock.poll_log()
        try:
            response = requests.get(url, timeout=2)
            if response.status_code == 200:
                served = [m.get("id") for m in response.json().get("data", [])]
                if payload.model_id in served:
                    clock.poll_log()
                    clock.mark("healthy")
                    return
        except (requests.RequestException, ValueError):
            pass
        now = time.monotonic()
        if now >= deadline:
            raise CommandFailed(
                "internal",
                f"endpoint server did not answer GET /v1/models within {timeout_s:g}s; "
                f"log tail:\n{log_tail(log_path, LOG_TAIL_BYTES)}",
                log_tail=log_tail(log_path, LOG_TAIL_BYTES),
            )
        if now - last_note >= 10:
            last_note = now
            progress(f"waiting for endpoint {payload.endpoint_id} to load {payload.model_id}")
        time.sleep(0.2)


def wait_follower(payload: EndpointStartPayload, child: Spawned, log_path: Path, progress: ProgressFn) -> None:
    """A follower answers nothing: it counts as started once it has lived `FOLLOWER_SETTLE_S` (an argument
    vLLM refuses ends it sooner); whether the group serves is the leader's readiness."""
    deadline = time.monotonic() + FOLLOWER_SETTLE_S
    while time.monotonic() < deadline:
        _raise_if_exited(child, log_path, "follower rank")
        time.sleep(0.2)
    progress(f"follower rank {payload.group.node_rank} of endpoint {payload.endpoint_id} waits for its leader")


def _raise_if_exited(child: Spawned, log_path: Path, what: str, when: str = "") -> None:
    """CommandFailed(internal) with the exit status and the log's tail once `child` has exited."""
    code = child.poll()
    if code is not None:
        tail = log_tail(log_path, LOG_TAIL_BYTES)
        raise CommandFailed(
            "internal", f"{what} exited with status {code}{when}; log tail:\n{tail}", exit_code=code, log_tail=tail
        )
