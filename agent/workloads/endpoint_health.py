"""Health probes of the inference endpoint servers this agent runs: a server that hangs is reported.

A server can hang with its process alive and its port accepting connections (the kernel accepts them)
while it never answers: nothing else on the node notices. `EndpointProber.check` sends each running
server ``GET /health`` (vLLM's liveness route) with a short timeout, all at once; after `failures`
consecutive failed probes the server is marked ``unresponsive`` (`EndpointManager.mark_health`), and it
is marked ``running`` again if it answers later (the control plane has taken it out of rotation by then
and stops it: its verdict stands). `check` returns whether a status changed, so the caller (the tunnel's
supervised ``endpoint health`` task) sends an inventory report at once rather than with the next heartbeat.

The leader of a multi-node group (`agent.workloads.distributed`) is probed with a one-token completion
instead (`EndpointManager.generation_probes`): vLLM's /health keeps answering 200 after a follower rank
died, while every request hangs (measured with vLLM 0.32's CPU build; its engine only notices on the next
step, whose error leaves the request unanswered), so only a generation through the pipeline tells.

Settings come from the environment: ``CLEVERTHIS_ENDPOINT_HEALTH_INTERVAL_S`` (default 5: seconds
between the starts of two probe rounds), ``CLEVERTHIS_ENDPOINT_HEALTH_TIMEOUT_S`` (default 5: how long a
probe waits for the answer's status line) and ``CLEVERTHIS_ENDPOINT_HEALTH_FAILURES`` (default 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("agent.endpoint_health")

DEFAULT_INTERVAL_S = 5.0
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_FAILURES = 3
HEALTH_PATH = "/health"
GENERATION_PATH = "/v1/completions"


class HealthTarget(Protocol):
    """What the prober needs of the endpoint manager."""

    def health_targets(self) -> list[tuple[str, int]]: ...

    def mark_health(self, endpoint_id: str, healthy: bool) -> bool: ...


@dataclass(frozen=True)
class HealthSettings:
    """How often servers are probed, how long a probe may take, how many failures in a row make one unresponsive."""

    interval_s: float = DEFAULT_INTERVAL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    failures: int = DEFAULT_FAILURES

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HealthSettings:
        """The settings from CLEVERTHIS_ENDPOINT_HEALTH_*; a missing or invalid value takes its default (logged)."""
        env = os.environ if environ is None else environ
        return cls(
            interval_s=_positive(env, "CLEVERTHIS_ENDPOINT_HEALTH_INTERVAL_S", DEFAULT_INTERVAL_S, float),
            timeout_s=_positive(env, "CLEVERTHIS_ENDPOINT_HEALTH_TIMEOUT_S", DEFAULT_TIMEOUT_S, float),
            failures=int(_positive(env, "CLEVERTHIS_ENDPOINT_HEALTH_FAILURES", DEFAULT_FAILURES, int)),
        )


def _positive(env: Mapping[str, str], name: str, default: float, kind: type) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    if value <= 0:
        log.warning("%s=%r is not a positive number; using %s", name, raw, default)
        return default
    return value


def _request(host: str, port: int, model: str) -> bytes:
    """GET /health, or (`model` given) a one-token completion of it."""
    if not model:
        return f"GET {HEALTH_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
    body = json.dumps({"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}).encode()
    head = (
        f"POST {GENERATION_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def probe(port: int, timeout_s: float, host: str = "127.0.0.1", model: str = "") -> bool:
    """Whether the server on `port` answers ``GET /health`` (or, with `model`, a one-token completion of
    it: the probe of a multi-node group's leader) with a 2xx status within `timeout_s` seconds."""

    async def ask() -> bool:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(_request(host, port, model))
            await writer.drain()
            status_line = await reader.readline()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        parts = status_line.split()
        return len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1][:1] == b"2"

    try:
        return await asyncio.wait_for(ask(), timeout=timeout_s)
    except (OSError, TimeoutError):
        return False


class EndpointProber:
    """Counts each server's failed probes in a row and marks it unresponsive (or running again) in the manager."""

    def __init__(self, settings: HealthSettings | None = None) -> None:
        self.settings = settings or HealthSettings.from_env()
        self._failed: dict[str, int] = {}  # endpoint id -> failed probes in a row

    async def check(self, manager: HealthTarget) -> bool:
        """One round: probe every running (or unresponsive) server at once; True when a status changed."""
        targets = await asyncio.to_thread(manager.health_targets)
        generating = await asyncio.to_thread(getattr(manager, "generation_probes", dict))
        answers = await asyncio.gather(
            *(probe(port, self.settings.timeout_s, model=generating.get(ep, "")) for ep, port in targets)
        )
        changed = False
        for (endpoint_id, port), healthy in zip(targets, answers, strict=True):
            failed = 0 if healthy else self._failed.get(endpoint_id, 0) + 1
            self._failed[endpoint_id] = failed
            if healthy or failed >= self.settings.failures:
                if await asyncio.to_thread(manager.mark_health, endpoint_id, healthy):
                    changed = True
                    if healthy:
                        log.warning("endpoint %s answers again on port %d: running", endpoint_id, port)
                    else:
                        log.error(
                            "endpoint %s on port %d failed %s %d times in a row (timeout %gs): unresponsive",
                            endpoint_id,
                            port,
                            f"a one-token POST {GENERATION_PATH}"
                            if generating.get(endpoint_id)
                            else f"GET {HEALTH_PATH}",
                            failed,
                            self.settings.timeout_s,
                        )
        probed = {endpoint_id for endpoint_id, _ in targets}
        for gone in set(self._failed) - probed:  # stopped or exited: forget its count
            del self._failed[gone]
        return changed
