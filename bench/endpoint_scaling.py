"""Endpoints that scale, measured on real agents: a load step, scale to zero and a cold start, a rolling update.

    .venv/bin/python bench/endpoint_scaling.py                       # real vLLM CPU replicas (.ci/vllm-venv)
    .venv/bin/python bench/endpoint_scaling.py --engine standin      # the OpenAI stand-in (quick, no vLLM)
    .venv/bin/python bench/endpoint_scaling.py --phases step zero    # some phases only

Sets up, on this machine: PostgreSQL (running), a private redis-server, one web replica (uvicorn), a Celery
worker and Celery beat (the production schedule: the autoscaler, the idle pass and healing run as they would),
the Hub stand-in serving a tiny Llama (built on the spot with the vLLM virtualenv's python) and two real
agents, each a node with the model downloaded through `model.download`. With vLLM each agent, and so every
server it starts, runs on a CPU core of its own (`--pin-nodes`, as on two machines): unpinned on a 2-core
machine, the first server serving 32 streams takes the CPU a second one needs to load (it did not start
within the agent's 600 s). Every request goes through the
endpoint's URL (web → tunnel → agent → server) with an API key, streamed (`/v1/chat/completions`,
`"stream": true`; TTFT: until the first content).

Phases, each on an endpoint of its own (stopped at the end of the phase):
- step: min 1, max 2 replicas, `target_in_flight` 8, cool-down `--cooldown` s. One stream at a time for
  `--quiet-s`, then 32 concurrent streams. Printed: when the autoscaler decided a second replica (seconds
  after the step; PASS when within the cool-down), when it ran, TTFT p50/p99 before the step, during the
  step with one replica, and once two replicas serve; errors.
- zero: min 0, `idle_timeout_s` `--idle-s`. One warm request, then no requests until the idle pass scales the
  endpoint to zero (its server stopped); then one request: its time to first token (the cold start: placing
  a replica, starting the server, loading the model, then the answer) against the warm request's.
- update: one replica; 8 concurrent streams run all along while the endpoint rolls over to other server
  arguments (`--max-model-len 128`): printed the requests made, the failed ones (goal 0), how long the
  update took and which server arguments answered at the end (vLLM's `/v1/models` reports max_model_len).

Every process is stopped (whole process groups) however the run ends, the agents' endpoint servers too,
and the database is dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("BENCH_DB", "cleverthis_bench_scaling")

from proxy import control_plane_env, drop_database, prepare_database, start_redis  # noqa: E402  (django.setup())

from tests.support.hub_standin import HubStandin  # noqa: E402
from tests.support.live import ControlPlane, agent_join, agent_run, stop_endpoint_servers  # noqa: E402
from tests.support.processes import VENV_BIN, ManagedProcess, wait_until  # noqa: E402

MODEL = "acme/tiny-llama"
VLLM_CACHE = Path(os.environ.get("CLEVERTHIS_VLLM_VENV_DIR", "/var/tmp/cleverthis-vllm"))


def pct(values: list[float], q: float) -> float:
    return sorted(values)[int(q * (len(values) - 1))] if values else float("nan")


def vllm_python() -> str | None:
    """The vLLM CPU engine's python (VLLM_PYTHON, else the build .ci/vllm-venv cached), None if not built."""
    if os.environ.get("VLLM_PYTHON"):
        return os.environ["VLLM_PYTHON"]
    found = sorted(VLLM_CACHE.glob("*/bin/python"), key=lambda p: p.stat().st_mtime)
    return str(found[-1]) if found else None


# -- load ------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One streamed request: when it started, its time to first token (None if none came) and its error."""

    started: float
    ttft: float | None
    error: str = ""


@dataclass
class Load:
    """`clients` threads each streaming completions back to back through the endpoint's URL until stopped."""

    url: str
    headers: dict[str, str]
    max_tokens: int
    outcomes: list[Outcome] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def add(self, clients: int) -> None:
        for _ in range(clients):
            thread = threading.Thread(target=self._client, daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=600)

    def since(self, t: float) -> list[Outcome]:
        return [o for o in list(self.outcomes) if o.started >= t]

    def _client(self) -> None:
        import requests

        with requests.Session() as session:
            while not self.stopping.is_set():
                self.outcomes.append(stream_once(session, self.url, self.headers, self.max_tokens))


def stream_once(session: object, url: str, headers: dict[str, str], max_tokens: int, timeout: float = 900) -> Outcome:
    """One streamed completion: the time to its first token, or the error that ended it."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "the fleet runs"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.monotonic()
    ttft = None
    try:
        with session.post(f"{url}/v1/chat/completions", json=body, headers=headers, stream=True, timeout=timeout) as r:
            if r.status_code != 200:
                return Outcome(started, None, f"HTTP {r.status_code}: {r.text[:200]}")
            done = False
            for line in r.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                if line == b"data: [DONE]":
                    done = True
                    break
                choices = json.loads(line[6:]).get("choices") or [{}]
                if ttft is None and choices[0].get("delta", {}).get("content"):
                    ttft = time.monotonic() - started
            if not done:
                return Outcome(started, ttft, "stream ended without [DONE]")
    except Exception as exc:  # every failure is a failed request here
        return Outcome(started, ttft, f"{type(exc).__name__}: {exc}")
    return Outcome(started, ttft)


def ttft_line(label: str, outcomes: list[Outcome]) -> str:
    ttfts = [o.ttft * 1000 for o in outcomes if o.ttft is not None and not o.error]
    errors = sum(1 for o in outcomes if o.error)
    return (
        f"  {label:<38} requests {len(outcomes):>5}  errors {errors:>3}  "
        f"TTFT p50 {pct(ttfts, 0.5):8.0f} ms  p99 {pct(ttfts, 0.99):8.0f} ms"
    )


# -- set-up ----------------------------------------------------------------------------------------


@dataclass
class Bench:
    """The running set-up: the control plane, the agents, the operator and their cluster, an API key."""

    plane: ControlPlane
    user: object
    cluster: object
    headers_for: Callable[[object], dict[str, str]]


def pin(pid: int, core: int) -> None:
    """Run every thread of process `pid` (and so the processes it starts later) on CPU `core` only."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task.name), {core})


@contextlib.contextmanager
def setup(
    engine: str,
    log_dir: Path,
    *,
    pin_nodes: bool = False,
    model: Callable[[Path, str], dict[str, bytes]] | None = None,
    web_env: dict[str, str] | None = None,
) -> Iterator[Bench]:
    """Everything above, running; `model(folder, vllm python)` makes the model's files (default: the tiny Llama);
    `web_env`: settings of the control plane's processes to change (environment variables)."""
    from fleet import services
    from fleet.models import Command, Node
    from fleet.workloads.services import api_key_create

    procs: list[ManagedProcess] = []
    states: list[Path] = []
    hub = HubStandin().start()
    plane = None
    try:
        procs.append(start_redis(log_dir))
        user, cluster = prepare_database()
        if engine == "vllm":
            from tests.support.tiny_llm import build

            python = vllm_python()
            if python is None:
                raise SystemExit("vLLM's CPU engine is not built here: bash .ci/vllm-venv (or --engine standin)")
            hub.add_repo(MODEL, (model or build)(log_dir / "model", python))
            server_env = {"CLEVERTHIS_VLLM_CPU_PYTHON": python, "PYTHONPATH": str(REPO)}
        else:
            hub.add_repo(MODEL, {"config.json": b'{"layers": 1}', "weights.bin": b"w" * 4096})
            server_env = {"CLEVERTHIS_ENDPOINT_SERVER": f"{sys.executable} -m tests.support.openai_standin"}
        quick = {"AGENT_HEARTBEAT_INTERVAL_S": "1", "ENDPOINT_DRAIN_S": "5", "LOG_LEVEL": "INFO"}
        env = control_plane_env(**quick, **(web_env or {}))
        plane = ControlPlane(log_dir=log_dir, env=env, server="uvicorn")
        plane.start_replica()
        plane.start_worker()
        beat_argv = [str(VENV_BIN / "celery"), "-A", "cleverthis", "beat", "-s", str(log_dir / "beat-schedule")]
        procs.append(ManagedProcess("celery-beat", [*beat_argv, "--loglevel=INFO"], log_dir=log_dir, env=env))
        nodes = []
        for name in ("node-a", "node-b"):
            _, raw = services.join_token_create(cluster=cluster, actor=user)
            state = log_dir / f"state-{name}"
            states.append(state)
            joined = agent_join(plane.url, raw, state)
            assert joined.returncode == 0, joined.stderr
            agent_env = {
                "CLEVERTHIS_MODEL_CACHE": str(log_dir / f"models-{name}"),
                "HF_ENDPOINT": hub.url,
                **server_env,
            }
            agent = agent_run(state, log_dir, name=f"agent-{name}", env=agent_env)
            procs.append(agent)
            node_id = json.loads((state / "node.json").read_text())["node_id"]
            wait_until(lambda n=node_id: Node.objects.get(pk=n).status == "online", timeout=60, what=f"{name} online")
            if pin_nodes:
                pin(agent.popen.pid, len(nodes) % os.cpu_count())
            nodes.append(Node.objects.get(pk=node_id))
        for node in nodes:
            (download,) = services.command_dispatch(
                actor=user, cluster=cluster, command_type="model.download", payload={"model_id": MODEL}, node=node
            )
            wait_until(
                lambda d=download: Command.objects.get(pk=d.pk).status == "succeeded", timeout=300, what="download"
            )
        _, secret = api_key_create(actor=user, workspace=cluster.workspace, name="bench", scopes=["invoke"])

        def headers_for(endpoint: object) -> dict[str, str]:
            return {"Authorization": f"Bearer {secret}", "Host": endpoint.hostname}

        yield Bench(plane, user, cluster, headers_for)
    finally:
        for proc in reversed(procs):
            proc.stop()
        if plane is not None:
            plane.stop()
        for state in states:
            with contextlib.suppress(Exception):
                stop_endpoint_servers(state)
        hub.stop()
        drop_database()


def wait_running(endpoint: object, replicas: int, timeout: float = 1200) -> None:
    from fleet.workloads.models import EndpointReplica

    def up() -> bool:
        return EndpointReplica.objects.filter(endpoint=endpoint, status="running").count() >= replicas

    wait_until(up, timeout=timeout, interval=0.5, what=f"{replicas} running replica(s)")


def stop_endpoint(bench: Bench, endpoint: object) -> None:
    from fleet.workloads.models import Endpoint, EndpointReplica
    from fleet.workloads.services import endpoint_stop

    endpoint = Endpoint.objects.get(pk=endpoint.pk)
    if endpoint.status in ("pending", "starting", "running"):
        endpoint_stop(actor=bench.user, endpoint=endpoint)
    wait_until(
        lambda: (
            not EndpointReplica.objects.filter(
                endpoint=endpoint, status__in=["pending", "starting", "running", "stopping"]
            ).exists()
        ),
        timeout=120,
        what="endpoint stopped",
    )


# -- phases ----------------------------------------------------------------------------------------


def phase_step(bench: Bench, args: argparse.Namespace) -> list[str]:
    from fleet.workloads.models import EndpointReplica
    from fleet.workloads.services import endpoint_create

    endpoint = endpoint_create(
        actor=bench.user,
        cluster=bench.cluster,
        model_id=MODEL,
        min_replicas=1,
        max_replicas=2,
        target_in_flight=8,
        scale_cooldown_s=args.cooldown,
    )
    wait_running(endpoint, 1)
    load = Load(bench.plane.url, bench.headers_for(endpoint), args.max_tokens)
    load.add(1)
    time.sleep(args.quiet_s)
    step = time.monotonic()
    load.add(31)
    replicas = EndpointReplica.objects.filter(endpoint=endpoint)
    decided = running = None
    deadline = step + args.cooldown + 600
    while time.monotonic() < deadline and running is None:
        count = replicas.exclude(status__in=["stopped", "failed"]).count()
        if decided is None and count >= 2:
            decided = time.monotonic()
        if replicas.filter(status="running").count() >= 2:
            running = time.monotonic()
        time.sleep(0.25)
    if running is not None:
        time.sleep(args.after_s)
    load.stop()
    end = time.monotonic()
    quiet = [o for o in load.since(0) if o.started < step]
    one = [o for o in load.since(step) if running is None or o.started < running]
    two = load.since(running) if running is not None else []
    stop_endpoint(bench, endpoint)
    verdict = "PASS" if decided is not None and decided - step <= args.cooldown else "MISS"
    lines = [
        f"step (1 → 32 concurrent streams; min 1, max 2, target 8 in flight per replica, cool-down {args.cooldown} s):",
        ttft_line("1 stream, 1 replica", quiet),
        ttft_line("32 streams, until a 2nd replica runs", one),
        ttft_line("32 streams, 2 replicas", two),
        f"  2nd replica decided {decided - step:.1f} s after the step" if decided else "  2nd replica never decided",
        f"  2nd replica running {running - step:.1f} s after the step" if running else "  2nd replica never ran",
        *(f"  a replica failed: {r.failure_message[:160]}" for r in replicas.filter(status="failed")),
        f"  goal: a replica added within the cool-down ({args.cooldown} s): {verdict}",
        f"  (phase {end - step:.0f} s after the step)",
    ]
    return lines


def phase_zero(bench: Bench, args: argparse.Namespace) -> list[str]:
    import requests

    from fleet.workloads.models import Endpoint, EndpointReplica
    from fleet.workloads.services import endpoint_create

    endpoint = endpoint_create(
        actor=bench.user,
        cluster=bench.cluster,
        model_id=MODEL,
        min_replicas=0,
        max_replicas=1,
        idle_timeout_s=args.idle_s,
    )
    wait_running(endpoint, 1)
    headers = bench.headers_for(endpoint)
    with requests.Session() as session:
        warm = [stream_once(session, bench.plane.url, headers, args.max_tokens) for _ in range(3)]
        quiet_from = time.monotonic()
        wait_until(
            lambda: Endpoint.objects.get(pk=endpoint.pk).status == "idle",
            timeout=args.idle_s + 300,
            interval=0.5,
            what="scaled to zero",
        )
        asleep = time.monotonic() - quiet_from
        # its replica drains (ENDPOINT_DRAIN_S) before it is stopped: a request before that would find it still
        # there (it goes back into rotation); the cold start is measured once no server runs
        wait_until(
            lambda: (
                not EndpointReplica.objects.filter(
                    endpoint=endpoint, status__in=["pending", "starting", "running", "stopping"]
                ).exists()
            ),
            timeout=300,
            interval=0.5,
            what="its server stopped",
        )
        stopped = time.monotonic() - quiet_from
        cold = stream_once(session, bench.plane.url, headers, args.max_tokens)
        after = [stream_once(session, bench.plane.url, headers, args.max_tokens) for _ in range(3)]
    stop_endpoint(bench, endpoint)
    warm_ttft = pct([o.ttft for o in warm if o.ttft], 0.5)
    cold_line = f"{cold.ttft:.2f} s" if cold.ttft is not None else f"none ({cold.error})"
    return [
        f"zero (min 0, idle timeout {args.idle_s} s):",
        f"  scaled to zero {asleep:.1f} s after the last request (idle timeout {args.idle_s} s + the idle pass), "
        f"its server stopped {stopped:.1f} s after (+ the drain)",
        f"  warm TTFT (median of 3): {warm_ttft * 1000:.0f} ms",
        f"  cold start, first token after: {cold_line}  ({cold.ttft / warm_ttft:.0f} x warm)" if cold.ttft else "",
        f"  after the cold start, TTFT (median of 3): {pct([o.ttft for o in after if o.ttft], 0.5) * 1000:.0f} ms",
        f"  errors: {sum(1 for o in [*warm, cold, *after] if o.error)}",
    ]


def phase_update(bench: Bench, args: argparse.Namespace) -> list[str]:
    import requests

    from fleet.workloads.models import EndpointReplica
    from fleet.workloads.services import endpoint_create, endpoint_update

    endpoint = endpoint_create(actor=bench.user, cluster=bench.cluster, model_id=MODEL, min_replicas=1)
    wait_running(endpoint, 1)
    (old,) = EndpointReplica.objects.filter(endpoint=endpoint, status="running")
    load = Load(bench.plane.url, bench.headers_for(endpoint), args.max_tokens)
    load.add(8)
    time.sleep(5)
    began = time.monotonic()
    endpoint_update(actor=bench.user, endpoint=endpoint, server_args=["--max-model-len", "128"])
    wait_until(
        lambda: (
            EndpointReplica.objects.get(pk=old.pk).status == "stopped"
            and EndpointReplica.objects.filter(endpoint=endpoint, status="running").exists()
        ),
        timeout=1200,
        interval=0.5,
        what="rolled over",
    )
    took = time.monotonic() - began
    time.sleep(5)
    load.stop()
    during = load.since(began - 5)
    models = requests.get(f"{bench.plane.url}/v1/models", headers=bench.headers_for(endpoint), timeout=30).json()
    stop_endpoint(bench, endpoint)
    failed = [o for o in load.outcomes if o.error]
    verdict = "PASS" if not failed else "MISS"
    return [
        "update (server arguments → --max-model-len 128, 8 concurrent streams all along):",
        ttft_line("all requests", load.outcomes),
        ttft_line("from 5 s before the update", during),
        f"  rolled over in {took:.1f} s (new replica running and the old one stopped)",
        f"  max_model_len served afterwards: {[m.get('max_model_len') for m in models.get('data', [])]}",
        f"  goal: no failed request during the update: {len(failed)} failed: {verdict}",
        *(f"    {o.error}" for o in failed[:5]),
    ]


PHASES = {"step": phase_step, "zero": phase_zero, "update": phase_update}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("vllm", "standin"), default="vllm")
    parser.add_argument("--phases", nargs="+", choices=list(PHASES), default=list(PHASES))
    parser.add_argument("--cooldown", type=int, default=60, help="the step phase's scale cool-down (s)")
    parser.add_argument("--quiet-s", type=float, default=20, help="one stream this long before the step")
    parser.add_argument("--after-s", type=float, default=20, help="32 streams this long once 2 replicas run")
    parser.add_argument("--idle-s", type=int, default=30, help="the zero phase's idle timeout (s)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--pin-nodes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="each agent and the servers it starts on a CPU core of its own, as on separate machines "
        "(default: on with vllm)",
    )
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    report = [f"engine: {args.engine}; logs in {log_dir}"]
    try:
        pin_nodes = args.engine == "vllm" if args.pin_nodes is None else args.pin_nodes
        report[0] += f"; nodes pinned to a core each: {pin_nodes}"
        with setup(args.engine, log_dir, pin_nodes=pin_nodes) as bench:
            for name in args.phases:
                started = time.monotonic()
                lines = [*PHASES[name](bench, args), f"  ({name}: {time.monotonic() - started:.0f} s in all)"]
                print("\n".join(lines), flush=True)
                report += lines
    finally:
        print("\n== summary\n" + "\n".join(report))
    shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
