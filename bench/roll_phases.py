"""What `bench/web_roll.py` measures, phase by phase (a roll of the web processes, a Redis restart): the
load it keeps up meanwhile, what each phase did to it, and where the machine's CPU went.

The load, each part in a process of its own so that none starves another: the agents
(`bench/roll_agents.py`, several processes, each sampling its own tunnels every 0.1 s), the commands
(`bench/roll_commands.py`: one a second to a random node, a fan-out to every node each `fanout_every_s`),
the stream slots (`bench/roll_streams.py`); the API (/healthz and the Nodes list) is polled through the
load balancer twice a second from this process.

Per phase: tunnel reconnects per agent (sessions welcomed during the phase), the longest time each agent
was without a live tunnel, node-offline events (and why: a tunnel closed and not back within the grace,
or no heartbeat) and the fewest nodes online, streams completed / cut / HTTP error (by the phase they
started in), API requests answered 2xx, commands created in the phase that never succeeded (lost: by
status) or ran more than once on their node (duplicated), the time from a command's creation to its
success (p50 / p99 / max), the dispatch queue's longest length, the agents processes' event-loop lag,
and CPU seconds per process (with the rest of the machine, other users included, as "others").
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests


@dataclass
class Phase:
    """One phase's window and what was counted in it."""

    name: str
    started: float  # epoch seconds
    ended: float = 0.0
    agents: dict[str, Any] = field(default_factory=dict)  # the agents processes' reports, merged
    api: collections.Counter[str] = field(default_factory=collections.Counter)
    queue_max: int = 0  # the Celery queues' longest total length seen
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per process (and "others")
    # the database's active sessions, sampled each second, by what they waited on ("cpu": nothing)
    db_waits: collections.Counter[str] = field(default_factory=collections.Counter)
    db_samples: int = 0


class AgentProcesses:
    """The agents, split over `count` processes (`bench/roll_agents.py`), driven line by line."""

    def __init__(self, listing: list[dict[str, Any]], count: int, workdir: Path, connect_rate: float) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.sizes: list[int] = []
        script = Path(__file__).resolve().parent / "roll_agents.py"
        for i in range(count):
            share = listing[i::count]
            path = workdir / f"agents-{i}.json"
            path.write_text(json.dumps(share))
            rate = str(connect_rate / count)
            log = (workdir / f"agents-{i}.log").open("wb")
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(script), str(path), "--connect-rate", rate],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                )
            )
            self.sizes.append(len(share))
        self.count = count

    def ask(self, line: str) -> list[dict[str, Any]]:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{line}\n".encode())
            proc.stdin.flush()
        answers = []
        for proc in self.procs:
            assert proc.stdout is not None
            answers.append(json.loads(proc.stdout.readline()))
        return answers

    def live(self) -> int:
        return sum(a["live"] for a in self.ask("live"))

    def report(self) -> dict[str, Any]:
        """The processes' reports as one, per agent lists in round-robin order per process."""
        answers = self.ask("report")
        merged: dict[str, Any] = {"sessions": [], "longest_gap": [], "twice": set()}
        for a in answers:
            merged["sessions"] += a["sessions"]
            merged["longest_gap"] += a["longest_gap"]
            merged["twice"] |= set(a["twice"])
        merged["lag_max"] = max(a["lag_max"] for a in answers)
        merged["lag_p99"] = max(a["lag_p99"] for a in answers)
        return merged

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None and proc.stdin is not None:
                try:
                    proc.stdin.write(b"stop\n")
                    proc.stdin.flush()
                except OSError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()

    @property
    def pids(self) -> dict[str, int]:
        return {f"agents-{i}": proc.pid for i, proc in enumerate(self.procs)}


class CpuMeter:
    """CPU seconds per named process (children included) between snapshots, the PostgreSQL backends of one
    database counted as "postgres", and the machine's busy time beyond all of them as "others"."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.pids: dict[str, int] = {}
        self.alone: set[str] = set()  # names counted without their children (the bench: it started the rest)
        self.last: dict[tuple[str, int], float] = {}  # the last CPU seconds read of each (name, pid)

    def add(self, name: str, pid: int, *, children: bool = True) -> None:
        self.pids[name] = pid
        if not children:
            self.alone.add(name)

    def refresh(self) -> None:
        """Read the named processes now (every second: a process that exits keeps its last reading)."""
        for name, pid in list(self.pids.items()):
            try:
                proc = psutil.Process(pid)
                total = _cpu(proc)
                if name not in self.alone:
                    total += sum(_cpu(child) for child in proc.children(recursive=True))
            except psutil.Error:
                continue
            self.last[(name, pid)] = total

    def snapshot(self) -> dict[str, float]:
        """CPU seconds so far per name (a name's processes summed, exited ones at their last reading)."""
        self.refresh()
        seen: dict[str, float] = collections.defaultdict(float)
        for (name, _), total in self.last.items():
            seen[name] += total
        backends = 0.0
        for proc in psutil.process_iter(["name", "cmdline"]):
            try:
                if proc.info["name"] == "postgres" and self.database in " ".join(proc.info["cmdline"] or []):
                    backends += _cpu(proc)
            except psutil.Error:
                continue
        seen["postgres"] = backends
        times = psutil.cpu_times()
        seen["machine"] = sum(times) - times.idle - getattr(times, "iowait", 0.0)
        return dict(seen)

    @staticmethod
    def difference(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        spent = {name: max(0.0, after[name] - before.get(name, 0.0)) for name in after}
        ours = sum(v for k, v in spent.items() if k != "machine")
        spent["others"] = max(0.0, spent.pop("machine") - ours)
        return spent


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


class PhasedLoad:
    """The load during the bench and its accounting per phase; `begin`/`end` mark the phases."""

    def __init__(self, agents: AgentProcesses, base_url: str, cpu: CpuMeter, redis_url: str) -> None:
        self.agents = agents
        self.base_url = base_url
        self.cpu = cpu
        self.redis_url = redis_url
        self.phases: list[Phase] = []
        self.current: Phase | None = None
        self.finished = threading.Event()
        self.streams: list[dict[str, Any]] = []
        self.sends: list[dict[str, Any]] = []  # `roll_commands.py`'s lines
        self._threads: list[threading.Thread] = []
        self._children: list[subprocess.Popen[bytes]] = []
        self._cpu_at: dict[str, float] = {}

    # ---- phases

    def begin(self, name: str) -> None:
        self.agents.ask("phase")
        self._cpu_at = self.cpu.snapshot()
        phase = Phase(name, time.time())
        self.phases.append(phase)
        self.current = phase
        print(f"  phase: {name}", flush=True)

    def end(self) -> None:
        assert self.current is not None
        self.current.ended = time.time()
        self.current.agents = self.agents.report()
        self.current.cpu = CpuMeter.difference(self._cpu_at, self.cpu.snapshot())
        self.current = None

    # ---- the load

    def start(self, token: str) -> None:
        """The API poller and the queue sampler (threads of this process)."""
        self._threads = [
            threading.Thread(target=self._poll_api, args=(token,), daemon=True),
            threading.Thread(target=self._sample_queues, daemon=True),
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

    def _sample_queues(self) -> None:
        import psycopg
        import redis

        client = redis.Redis.from_url(self.redis_url, socket_timeout=2)
        database = psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{self.cpu.database}", autocommit=True)
        while not self.finished.is_set():
            try:
                waits = database.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'cpu') FROM pg_stat_activity"
                    " WHERE datname = %s AND state = 'active' AND pid <> pg_backend_pid()",
                    [self.cpu.database],
                ).fetchall()
            except psycopg.Error:
                waits = []
            phase = self.current
            if phase is not None:
                phase.db_samples += 1
                phase.db_waits.update(row[0] for row in waits)
            try:
                length = sum(int(client.llen(queue)) for queue in ("dispatch", "default", "celery"))
            except redis.RedisError:
                length = 0
            phase = self.current
            if phase is not None:
                phase.queue_max = max(phase.queue_max, length)
            self.cpu.refresh()
            time.sleep(1.0)

    def start_child(self, name: str, argv: list[str], into: list[dict[str, Any]], log: Path) -> int:
        """A load process (`roll_streams.py`, `roll_commands.py`) whose JSON lines go to `into`; its pid."""
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("wb"), start_new_session=True
        )
        self._children.append(proc)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                into.append(json.loads(line))

        reader = threading.Thread(target=read, name=name, daemon=True)
        reader.start()
        self._threads.append(reader)
        return proc.pid

    def stop(self) -> None:
        """End the load: the slots finish the streams they run, the threads end."""
        self.finished.set()
        for proc in self._children:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in self._children:
            try:
                proc.wait(timeout=150)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        for thread in self._threads:
            thread.join(timeout=30)

    # ---- results

    def report(self, phase: Phase, commands: dict[str, Any], offline: dict[str, int], agents: int) -> dict[str, Any]:
        """What `phase` came to. `commands`: the phase's commands as `command_outcomes` counts them;
        `offline`: its node-offline events by reason."""
        a = phase.agents
        reconnects = collections.Counter(a["sessions"])
        streams = collections.Counter(s["outcome"] for s in self.streams if phase.started <= s["started"] < phase.ended)
        errors = collections.Counter(
            s.get("error", "")[:60]
            for s in self.streams
            if phase.started <= s["started"] < phase.ended and s["outcome"] != "completed"
        )
        sends = [s for s in self.sends if phase.started <= s["t"] < phase.ended]
        return {
            "phase": phase.name,
            "seconds": phase.ended - phase.started,
            "reconnects": dict(sorted(reconnects.items())),
            "gap_p50": statistics.median(a["longest_gap"]) if a["longest_gap"] else 0.0,
            "gap_max": max(a["longest_gap"], default=0.0),
            "offline_events": sum(offline.values()),
            "offline_reasons": offline,
            "fewest_online": min((s["online"] for s in sends), default=0),
            "streams": {k: streams.get(k, 0) for k in ("completed", "cut", "error")},
            "stream_errors": dict(errors.most_common(3)),
            "api": {n: (phase.api[f"{n} 2xx"], phase.api[f"{n} total"]) for n in ("healthz", "nodes")},
            "commands": commands["count"],
            "refused": sum(len(s["refused"]) for s in sends),
            "lost": commands["count"] - commands["succeeded"],
            "lost_by_status": commands["not_succeeded"],
            "latency": commands["latency"],
            "duplicated": len(a["twice"] & commands["keys"]),
            "send_took_max": max((s["took_s"] for s in sends), default=0.0),
            "queue_max": phase.queue_max,
            "lag": (a["lag_p99"], a["lag_max"]),
            "cpu": phase.cpu,
            "db_waits": {k: round(v / max(1, phase.db_samples), 2) for k, v in phase.db_waits.most_common(5)},
            "agents": agents,
        }


def command_outcomes(started: float, ended: float) -> dict[str, Any]:
    """The commands created in [started, ended) (epoch s): how many, how many succeeded, the others by
    status, creation → success p50/p99/max (s), and their idempotency keys. (Django, the bench's database.)"""
    from datetime import UTC, datetime

    from fleet.models import Command

    rows = list(
        Command.objects.filter(
            created_at__gte=datetime.fromtimestamp(started, tz=UTC),
            created_at__lt=datetime.fromtimestamp(ended, tz=UTC),
        ).values_list("status", "created_at", "finished_at", "idempotency_key")
    )
    took = sorted((f - c).total_seconds() for s, c, f, _ in rows if s == "succeeded" and f is not None)
    not_succeeded = collections.Counter(s for s, _, _, _ in rows if s != "succeeded")

    def pct(q: float) -> float:
        return took[min(len(took) - 1, int(q * len(took)))] if took else 0.0

    return {
        "count": len(rows),
        "succeeded": len(rows) - sum(not_succeeded.values()),
        "not_succeeded": dict(not_succeeded),
        "latency": (pct(0.5), pct(0.99), took[-1] if took else 0.0),
        "keys": {k for _, _, _, k in rows},
    }


def offline_events(started: float, ended: float) -> dict[str, int]:
    """Node-offline events in [started, ended) by reason (their message's first words)."""
    from datetime import UTC, datetime

    from fleet.models import NodeEvent

    messages = NodeEvent.objects.filter(
        kind="offline",
        created_at__gte=datetime.fromtimestamp(started, tz=UTC),
        created_at__lt=datetime.fromtimestamp(ended, tz=UTC),
    ).values_list("message", flat=True)
    return dict(collections.Counter(" ".join(m.split()[:2]) for m in messages))
