"""What `bench/web_roll.py` measures, phase by phase (a roll of the web processes, a Redis restart): the
load it keeps up meanwhile and what each phase did to it.

The load: every agent's tunnel sampled every 0.1 s, one command a second to a random node and a fan-out
to every node each `fanout_every_s`, the API (/healthz and the Nodes list) polled through the load
balancer twice a second, and the stream slots (`bench/roll_streams.py`, a process of its own).

Per phase: tunnel reconnects per agent (sessions welcomed during the phase), the longest time each agent
was without a live tunnel, node-offline events and the fewest nodes online, streams completed / cut /
HTTP error (by the phase they started in), API requests answered 2xx, commands sent in the phase that
never succeeded (lost) or ran more than once on their node (duplicated).
"""

from __future__ import annotations

import collections
import json
import random
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from agent.transport.tunnel import TunnelClient


def live(client: TunnelClient) -> bool:
    """Whether the client has a live session (its sender open) right now."""
    sender = client._sender
    return sender is not None and not sender.closed


@dataclass
class Phase:
    """One phase's window and what was counted in it."""

    name: str
    started: float  # epoch seconds
    sessions_before: list[int]
    ended: float = 0.0
    sessions_after: list[int] = field(default_factory=list)
    longest_gap: list[float] = field(default_factory=list)
    api: collections.Counter[str] = field(default_factory=collections.Counter)
    commands: list[tuple[Any, str]] = field(default_factory=list)  # (command pk, idempotency key)
    online: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # command sends that raised


class PhasedLoad:
    """The load during the bench and its accounting per phase; `begin`/`end` mark the phases."""

    def __init__(self, clients: list[TunnelClient], runs: list[collections.Counter[str]], base_url: str) -> None:
        self.clients = clients
        self.runs = runs  # per agent: how often each idempotency key ran there
        self.base_url = base_url
        self.phases: list[Phase] = []
        self.current: Phase | None = None
        self.finished = threading.Event()
        self.streams: list[dict[str, Any]] = []
        self._threads: list[threading.Thread] = []
        self._streamer: subprocess.Popen[bytes] | None = None

    # ---- phases

    def begin(self, name: str) -> None:
        phase = Phase(name, time.time(), [c.sessions for c in self.clients])
        phase.longest_gap = [0.0] * len(self.clients)
        self.phases.append(phase)
        self.current = phase
        print(f"  phase: {name}", flush=True)

    def end(self) -> None:
        assert self.current is not None
        self.current.ended = time.time()
        self.current.sessions_after = [c.sessions for c in self.clients]
        self.current = None

    # ---- the load

    async def sample_tunnels(self) -> None:
        """Each agent's current gap without a live tunnel, every 0.1 s; the longest per phase."""
        import asyncio

        gaps = [0.0] * len(self.clients)
        last = time.monotonic()
        while not self.finished.is_set():
            await asyncio.sleep(0.1)
            now = time.monotonic()
            phase = self.current
            for i, client in enumerate(self.clients):
                if live(client):
                    gaps[i] = 0.0
                    continue
                gaps[i] += now - last
                if phase is not None:
                    phase.longest_gap[i] = max(phase.longest_gap[i], gaps[i])
            last = now

    def start_threads(self, token: str, send_commands: Any) -> None:
        """The API poller and the command sender (`send_commands(phased_load)`, Django in its thread)."""
        self._threads = [
            threading.Thread(target=self._poll_api, args=(token,), daemon=True),
            threading.Thread(target=send_commands, args=(self,), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _poll_api(self, token: str) -> None:
        session = requests.Session()
        headers = {"Authorization": f"Token {token}", "Host": "localhost"}
        while not self.finished.is_set():
            for name, path in (("healthz", "/healthz"), ("nodes", "/api/v1/nodes/?limit=20")):
                try:
                    status = session.get(self.base_url + path, headers=headers, timeout=10).status_code
                except requests.RequestException:
                    status = 0
                phase = self.current
                if phase is not None:
                    phase.api[f"{name} total"] += 1
                    phase.api[f"{name} 2xx"] += 200 <= status < 300
            time.sleep(0.5)

    def start_streams(self, argv: list[str]) -> None:
        """The stream slots' process (`bench/roll_streams.py`), read line by line until it ends."""
        if not argv:
            return
        self._streamer = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        reader = threading.Thread(target=self._read_streams, daemon=True)
        reader.start()
        self._threads.append(reader)

    def _read_streams(self) -> None:
        assert self._streamer is not None
        assert self._streamer.stdout is not None
        for line in self._streamer.stdout:
            self.streams.append(json.loads(line))

    def stop(self) -> None:
        """End the load: the slots finish the streams they run, the threads end."""
        self.finished.set()
        if self._streamer is not None:
            assert self._streamer.stdin is not None
            self._streamer.stdin.close()
            try:
                self._streamer.wait(timeout=150)
            except subprocess.TimeoutExpired:
                self._streamer.kill()
                self._streamer.wait()
        for thread in self._threads:
            thread.join(timeout=30)

    # ---- results

    def report(self, phase: Phase, succeeded: set[Any], offline_events: int) -> dict[str, Any]:
        """What `phase` came to; `succeeded`: the pks of the commands that succeeded by the end."""
        reconnects = collections.Counter(
            after - before for after, before in zip(phase.sessions_after, phase.sessions_before, strict=True)
        )
        streams = collections.Counter(
            s["outcome"] for s in self.streams if phase.started <= s["started"] < (phase.ended or time.time())
        )
        errors = collections.Counter(
            s.get("error", "")[:60]
            for s in self.streams
            if phase.started <= s["started"] < phase.ended and s["outcome"] != "completed"
        )
        keys = {key for _, key in phase.commands}
        duplicated = sum(1 for runs in self.runs for key, count in runs.items() if key in keys and count > 1)
        return {
            "phase": phase.name,
            "seconds": phase.ended - phase.started,
            "reconnects": dict(sorted(reconnects.items())),
            "gap_p50": statistics.median(phase.longest_gap) if phase.longest_gap else 0.0,
            "gap_max": max(phase.longest_gap, default=0.0),
            "offline_events": offline_events,
            "fewest_online": min(phase.online, default=0),
            "streams": {k: streams.get(k, 0) for k in ("completed", "cut", "error")},
            "stream_errors": dict(errors.most_common(3)),
            "api": {n: (phase.api[f"{n} 2xx"], phase.api[f"{n} total"]) for n in ("healthz", "nodes")},
            "commands": len(phase.commands),
            "refused": len(phase.refused),
            "lost": sum(1 for pk, _ in phase.commands if pk not in succeeded),
            "duplicated": duplicated,
        }


def send_commands_forever(load: PhasedLoad, user: Any, cluster: Any, fanout_every_s: float) -> None:
    """One command a second to a random node, a fan-out to every online node each `fanout_every_s` (0: none),
    each command noted in the phase it was sent in; the nodes online counted each second."""
    from django.db import connection

    from fleet import services
    from fleet.models import Node

    nodes = list(Node.objects.filter(cluster=cluster))
    rng = random.Random(7)
    next_fanout = time.monotonic() + fanout_every_s
    try:
        while not load.finished.is_set():
            targets: list[Any] = [rng.choice(nodes)]
            if fanout_every_s and time.monotonic() >= next_fanout:
                targets.append(None)  # every online node
                next_fanout += fanout_every_s
            for node in targets:
                phase = load.current
                try:
                    sent = services.command_dispatch(
                        actor=user, cluster=cluster, command_type="model.download",
                        payload={"model_id": "acme/tiny"}, node=node,
                    )  # fmt: skip
                except Exception as exc:  # the call failed: an API client would have seen an error
                    if phase is not None:
                        phase.refused.append(repr(exc)[:120])
                    continue
                if phase is not None:
                    phase.commands.extend((c.pk, c.idempotency_key) for c in sent)
            phase = load.current
            if phase is not None:
                phase.online.append(Node.objects.filter(cluster=cluster, status="online").count())
            time.sleep(1.0)
    finally:
        connection.close()
