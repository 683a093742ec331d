"""The agent's outbound tunnel: one WebSocket to the control plane, kept open forever.

A session: connect with a fresh nonce, check the control plane's CA signature over it (the CA is
pinned at join time), answer the challenge with a signature made by the node key (both signatures
cover a context string plus the nonce, see `agent.protocol`), send `Hello` with facts and inventory,
then heartbeat every `heartbeat_interval_s`, probe the endpoint servers' health (an inventory report
as soon as one stops answering), and run the commands that arrive.
Commands run in worker threads (`agent.transport.commands`); their progress and results go out through
the session's `FrameSender` (`agent.transport.sender`), which always sends control frames before bulk
stream data; `agent.update` is `agent.transport.self_update`. On any disconnect the client reconnects with exponential
backoff and full jitter (first retry under a second, capped a few seconds out), honours `Backoff`
frames, and stops for good on `Revoked` (or a 4403 close). A `Move` (the control plane's replica is
draining) starts the next session while the current one keeps serving its streams: make-before-break,
the old tunnel closes when the control plane says so. Every disconnect is logged with who closed
the socket, the close code and the reason.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse

import websockets
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from agent import identity, inventory
from agent import protocol as p
from agent.asyncio_fixes import cancel_and_wait
from agent.config import AgentConfig
from agent.transport.commands import CommandHandling, RunnerLike
from agent.transport.proxy import StreamManager
from agent.transport.self_update import SelfUpdate
from agent.transport.sender import FrameSender
from agent.transport.supervision import Supervisor, TaskFailed
from agent.update import updater
from agent.workloads.endpoint_health import EndpointProber

log = logging.getLogger("agent.tunnel")

EXIT_STOPPED = 0
EXIT_REVOKED = 3  # the systemd unit's RestartPreventExitStatus: a deleted node's agent stays down


RunnerFactory = Callable[[str, dict[str, Any]], RunnerLike]


@dataclass
class ReconnectPolicy:
    """Exponential backoff with full jitter: delay = uniform(0, min(cap, base * 2**attempt))."""

    base_s: float = 0.5
    cap_s: float = 5.0
    rng: random.Random = random.Random()  # noqa: RUF009 - shared default RNG is fine

    def delay(self, attempt: int) -> float:
        return self.rng.uniform(0, min(self.cap_s, self.base_s * (2**attempt)))

    def after_backoff(self, retry_after_s: float) -> float:
        """The wait a `Backoff` asks for, stretched by up to `protocol.BACKOFF_JITTER` at random."""
        return retry_after_s * (1 + p.BACKOFF_JITTER * self.rng.random())


class SessionEnded(Exception):
    """A session ended; `retry_after_s` set when the server asked us to back off."""

    def __init__(self, reason: str, *, retry_after_s: float | None = None, revoked: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.revoked = revoked


class TunnelClient(CommandHandling, SelfUpdate):
    """Keeps this node connected to the control plane and executes what it is told (commands:
    `agent.transport.commands`; its own updates: `agent.transport.self_update`; the send queue of a
    session: `agent.transport.sender`)."""

    def __init__(
        self,
        config: AgentConfig,
        runner_factory: RunnerFactory,
        *,
        policy: ReconnectPolicy | None = None,
        heartbeat_interval_s: float | None = None,
        hello_timeout_s: float = 15.0,
        prober: EndpointProber | None = None,
    ) -> None:
        self.config = config
        self.runner_factory = runner_factory
        self.policy = policy or ReconnectPolicy()
        self.heartbeat_override = heartbeat_interval_s
        self.hello_timeout_s = hello_timeout_s
        # Health probes of the endpoint servers (CLEVERTHIS_ENDPOINT_HEALTH_*): their failure counts outlive sessions.
        self.prober = prober or EndpointProber()
        self.key = identity.load_private_key(config.key_path)
        self.certificate_pem = config.cert_path.read_text()
        self.ca_pem = config.ca_path.read_text()
        self.host = urlparse(config.control_plane_url).netloc
        self.runner: RunnerLike | None = None
        self._runner_mode: tuple[str, str] | None = None
        self._running_keys: set[str] = set()
        self._sender: FrameSender | None = None
        self._supervisor: Supervisor | None = None  # the live session's
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gpus: list[p.GpuInfo] = []
        self._reported_inventory: p.Inventory | None = None  # what the control plane last got
        self._proxy_ports: set[int] = set()
        self._proxy_targets: set[tuple[str, int]] = set()
        self._heartbeats_in_flight: dict[str, float] = {}
        # Round-trip times (s) of recent heartbeats: sent → acknowledged by the control plane.
        self.heartbeat_rtts: collections.deque[float] = collections.deque(maxlen=1000)
        self.extra_proxy_ports = {
            int(port) for port in os.environ.get("CLEVERTHIS_PROXY_PORTS", "").split(",") if port.strip().isdigit()
        }
        self.sessions = 0
        self.exit_code = EXIT_STOPPED
        self._stop: asyncio.Event | None = None
        self._updating = False  # an update is switching over: new commands wait for the next version
        self._trial: Any = None  # this version's update marker while it is on trial (not yet connected)
        # Set by a `Move` on the live session (its replica drains): the spread to start the next one within.
        self._move: asyncio.Future[float] | None = None
        # Sessions that were asked to move: still serving their streams until the control plane closes them.
        self._retiring: set[asyncio.Future[None]] = set()
        self.moves = 0  # sessions that ended by a move (make-before-break)

    # ---- lifecycle

    async def run(self, stop: asyncio.Event | None = None) -> int:
        """Connect, and reconnect after every disconnect, until `stop` is set or the node is revoked."""
        stop = stop or asyncio.Event()
        self._stop = stop
        self._trial = await asyncio.to_thread(updater.trial_of_this_version, self.config)
        if self._trial is not None:
            self._spawn(self._trial_deadline(self._trial))
        gpus = await asyncio.to_thread(inventory.detect_gpus)
        for gpu in gpus:
            log.info("GPU detected: %s", gpu.name)
        if not gpus:
            log.info("no GPU detected")
        attempt = 0
        try:
            await self._sessions(stop, attempt)
        finally:
            for retiring in list(self._retiring):
                await cancel_and_wait(retiring)
        return self.exit_code

    async def _sessions(self, stop: asyncio.Event, attempt: int) -> None:
        """One session after another until `stop` (or a revocation: `exit_code`); a session asked to move
        is kept (retiring) beside the next one until the control plane closes it."""
        while not stop.is_set():
            move: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            self._move = move
            welcomed_before = self.sessions
            session = asyncio.ensure_future(self._session())
            stopper = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({session, stopper, move}, return_when=asyncio.FIRST_COMPLETED)
            if stopper in done:
                await cancel_and_wait(session)  # a cancel of `run` itself still propagates
                break
            stopper.cancel()
            if move in done and not session.done():
                # Make-before-break: the old session keeps its streams (and this agent's results go over
                # it) until the next one is welcomed; the control plane closes it once its streams ended.
                self._retire(session)
                delay = self.policy.rng.uniform(0, max(0.0, move.result()))
                log.info("the control plane's replica is draining: opening a new tunnel in %.2fs", delay)
                attempt = 0
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                continue
            move.cancel()
            try:
                session.result()
                delay = self.policy.delay(0)
            except SessionEnded as ended:
                if ended.revoked:
                    await self._end_workloads()
                    log.error(
                        "node revoked by the control plane (%s): not reconnecting; this machine left the cluster, "
                        "remove the agent with: systemctl disable --now cleverthis-agent",
                        ended.reason,
                    )
                    self.exit_code = EXIT_REVOKED
                    return
                if ended.retry_after_s is not None:
                    delay = self.policy.after_backoff(ended.retry_after_s)
                    log.warning("control plane asked to back off %.1fs: %s", ended.retry_after_s, ended.reason)
                else:
                    if self.sessions == welcomed_before:  # never got as far as a live session
                        attempt += 1
                    else:
                        attempt = 0
                    delay = self.policy.delay(attempt)
                    log.warning("disconnected (%s); reconnecting in %.2fs", ended.reason, delay)
            except (OSError, InvalidHandshake, ConnectionClosed, TimeoutError, p.ProtocolError) as exc:
                attempt += 1
                delay = self.policy.delay(attempt - 1)
                log.warning(
                    "cannot connect to %s (%s: %s); retrying in %.2fs", self.host, type(exc).__name__, exc, delay
                )
            except TaskFailed as failed:  # logged with its traceback by the supervisor
                attempt = 0
                delay = self.policy.delay(0)
                log.warning("tunnel session ended (%s); reconnecting in %.2fs", failed, delay)
            except Exception:  # a bug in the session itself (the reader): never a dead or half-alive agent
                attempt += 1
                delay = self.policy.delay(attempt - 1)
                log.exception("tunnel session failed unexpectedly; reconnecting in %.2fs", delay)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    def _retire(self, session: asyncio.Future[None]) -> None:
        """Keep `session` running beside the next one until it ends (the control plane closes it)."""
        self.moves += 1
        self._retiring.add(session)

        def ended(task: asyncio.Future[None]) -> None:
            self._retiring.discard(task)
            if task.cancelled():
                return
            error = task.exception()
            log.info("the tunnel that moved closed: %s", error if error is not None else "ended")

        session.add_done_callback(ended)

    async def _session(self) -> None:
        agent_nonce = secrets.token_hex(16)
        versions = f"{p.MIN_PROTOCOL_VERSION}-{p.PROTOCOL_VERSION}"
        url = f"{self.config.tunnel_url}?node={self.config.node_id}&agent_nonce={agent_nonce}&protocol={versions}"
        try:
            ws = await websockets.connect(url, open_timeout=10, max_size=p.MAX_FRAME_BYTES, ping_interval=20)
        except InvalidStatus as exc:
            raise SessionEnded(f"handshake refused with HTTP {exc.response.status_code}") from exc
        async with ws:
            challenge = await self._expect(ws, p.Challenge)
            if not identity.verify_server_proof(self.ca_pem, agent_nonce, challenge.server_signature_b64):
                raise SessionEnded("control plane failed CA pinning check (wrong or impostor server)")
            gpus = await asyncio.to_thread(inventory.detect_gpus)
            self._gpus = gpus
            # The challenge comes at the version the control plane chose for this tunnel (a control plane
            # one release older speaks only its own): everything of this session goes out at it.
            version = challenge.v
            hello = p.Hello(
                v=version,
                node_id=self.config.node_id,
                certificate_pem=self.certificate_pem,
                signature_b64=identity.sign_nonce(self.key, challenge.nonce),
                facts=replace(await asyncio.to_thread(inventory.host_facts), gpus=gpus),
                inventory=await self._inventory(gpus),
            )
            try:
                await ws.send(p.encode(hello))
            except ConnectionClosed as exc:
                raise self._ended_by_close(exc) from exc
            welcome = await self._expect(ws, p.Welcome)
            self._ensure_runner(welcome.mode, welcome.mode_settings)
            if self._trial is not None:  # connected: the update succeeded, before any command is looked at
                trial, self._trial = self._trial, None
                outcome = await asyncio.to_thread(updater.confirm, self.config, trial)
                assert self.runner is not None
                await asyncio.to_thread(self.runner.record, trial.key, "agent.update", outcome)
            log.info("connected to %s (protocol %d)", self.host, version)
            if welcome.update_required:
                log.warning(
                    "the control plane serves agent %s (this is %s, protocol %d): update this agent",
                    welcome.agent_version_current or "(unknown)",
                    inventory.agent_version(),
                    version,
                )
            self.sessions += 1
            sender = FrameSender(ws, version)
            self._sender = sender  # from now on results and reports go over this session
            move = self._move
            interval = self.heartbeat_override or welcome.heartbeat_interval_s
            supervisor = Supervisor(restart_delay_s=min(1.0, interval), max_restart_delay_s=interval)
            self._supervisor = supervisor
            supervisor.start("frame sender", lambda: self._send_frames(sender))
            supervisor.start("heartbeats", lambda: self._heartbeats(sender, interval), restart=True)
            supervisor.start("endpoint health", lambda: self._endpoint_health(sender), restart=True)
            streams = StreamManager(
                sender.send, allowed_port=self._port_is_proxied, allowed_target=self._target_is_proxied
            )
            try:
                # A blank Hello (no runner yet in this process, or nothing to report) says nothing about
                # problems to the control plane: the first report of the session always follows it.
                self._reported_inventory = None if hello.inventory.blank else hello.inventory
                await self._report_inventory()
                await supervisor.watch(self._receive_loop(ws, streams, move))
            finally:
                streams.close_all()
                if self._supervisor is supervisor:
                    self._supervisor = None
                if self._sender is sender:  # (a session that moved no longer is the current one)
                    self._sender = None
                await supervisor.stop()

    @staticmethod
    async def _send_frames(sender: FrameSender) -> None:
        with contextlib.suppress(ConnectionClosed):  # the socket closed: the reader ends the session
            await sender.run()

    def _fail_session(self, name: str, error: BaseException) -> None:
        """`name` failed unexpectedly: log it with its traceback and end the live session to reconnect."""
        if self._supervisor is not None:
            self._supervisor.fail(name, error)
        else:
            log.error("%s failed (no live session)", name, exc_info=error)

    async def _expect(self, ws: Any, frame_type: type[p.Frame]) -> Any:
        try:
            raw = await asyncio.wait_for(ws.recv(), timeout=self.hello_timeout_s)
        except ConnectionClosed as exc:
            raise self._ended_by_close(exc) from exc
        frame = p.decode(raw)
        self._raise_if_terminal(frame)
        if not isinstance(frame, frame_type):
            raise SessionEnded(f"expected {frame_type.TYPE}, got {frame.TYPE}")
        return frame

    def _raise_if_terminal(self, frame: p.Frame) -> None:
        if isinstance(frame, p.Revoked):
            raise SessionEnded(frame.reason, revoked=True)
        if isinstance(frame, p.Backoff):
            raise SessionEnded(frame.reason or "backoff", retry_after_s=frame.retry_after_s)

    @staticmethod
    def _ended_by_close(exc: ConnectionClosed) -> SessionEnded:
        """Why the socket closed: the control plane's close code and reason, ours, or a dropped connection.

        4403 (revoked) ends the agent; every other close is followed by a reconnect.
        """
        if exc.rcvd is not None and (exc.sent is None or exc.rcvd_then_sent):
            closer, close = "control plane", exc.rcvd
            if close.code == p.CLOSE_REVOKED:
                return SessionEnded(close.reason or "revoked", revoked=True)
            if close.code == p.CLOSE_AGENT_TOO_OLD:  # retrying soon cannot help: only an update can
                reason = f"this agent is too old for the control plane ({close.code}): {close.reason}"
                return SessionEnded(reason, retry_after_s=60.0)
        elif exc.sent is not None:  # e.g. 1009: the control plane sent a frame over MAX_FRAME_BYTES
            closer, close = "this agent", exc.sent
        else:
            return SessionEnded("connection lost without a close frame")
        meaning = p.CLOSE_MEANINGS.get(close.code, "unknown code")
        reason = close.reason or "(no reason given)"
        return SessionEnded(f"{closer} closed the tunnel: {close.code} {meaning}: {reason}")

    async def _refresh_proxy_ports(self) -> None:
        if self.runner is not None:
            self._proxy_ports = await asyncio.to_thread(self.runner.proxy_ports)
            targets = getattr(self.runner, "proxy_targets", None)
            self._proxy_targets = await asyncio.to_thread(targets) if targets is not None else set()

    def _port_is_proxied(self, port: int) -> bool:
        """Only ports of workloads this agent runs (plus CLEVERTHIS_PROXY_PORTS) can be reached by streams."""
        return port in self._proxy_ports or port in self.extra_proxy_ports

    def _target_is_proxied(self, host: str, port: int) -> bool:
        """An in-cluster host:port is reachable only as the Service of a KubeRay head this agent manages."""
        return (host, port) in self._proxy_targets

    async def _receive_loop(self, ws: Any, streams: StreamManager, move: asyncio.Future[float] | None = None) -> None:
        while True:
            try:
                raw = await ws.recv()
            except ConnectionClosed as exc:
                raise self._ended_by_close(exc) from exc
            try:
                frame = p.decode(raw)
            except p.ProtocolError as exc:
                log.warning("ignoring malformed frame from control plane: %s", exc)
                continue
            self._raise_if_terminal(frame)
            if isinstance(frame, p.StreamFrames):
                for entry in frame.frames:  # opens, data, windows and ends of many streams, in order
                    streams.handle(entry)
            elif isinstance(frame, p.StreamBatch):
                for stream_id, data in frame.chunks:
                    streams.handle(p.StreamData(stream_id=stream_id, data=data, v=frame.v))
            elif isinstance(frame, p.StreamOpen | p.StreamData | p.StreamWindow | p.StreamEnd):
                streams.handle(frame)
            elif isinstance(frame, p.Command):
                if self._updating:  # not acknowledged: the control plane re-sends it to the next version
                    log.info("command %s deferred: the agent is switching versions", frame.command_type)
                    continue
                self._spawn(self._on_command(frame))
            elif isinstance(frame, p.HeartbeatAck):
                sent = self._heartbeats_in_flight.pop(frame.heartbeat_id, None)
                if sent is not None:
                    self.heartbeat_rtts.append(time.monotonic() - sent)
            elif isinstance(frame, p.Move):
                if move is not None and not move.done():  # the run loop starts the next session
                    log.info("control plane asked this tunnel to move (%s)", frame.reason or "no reason given")
                    move.set_result(frame.within_s)
            else:
                log.debug("unhandled frame %s", frame.TYPE)

    # ---- heartbeats and inventory

    async def _heartbeats(self, sender: FrameSender, interval: float) -> None:
        while not sender.closed:
            if self._sender is not sender and self._sender is not None:  # moved: the new session beats
                await asyncio.sleep(interval)
                continue
            containers = 0
            if self.runner is not None:
                inv = await asyncio.to_thread(self.runner.inventory, [])
                containers = sum(1 for c in inv.containers if c.status == "running")
                reported = self._reported_inventory
                if reported is not None and _problem_kinds(inv) != _problem_kinds(reported):
                    await self._report_inventory()  # a part became unreadable or readable again: say so now
            beat = await asyncio.to_thread(inventory.heartbeat, containers)
            self._heartbeats_in_flight[beat.id] = time.monotonic()
            if len(self._heartbeats_in_flight) > 100:  # acks lost with an old session
                self._heartbeats_in_flight.clear()
            sender.send(beat)
            if self.heartbeat_rtts:
                log.info("heartbeat sent (last round trip %.1f ms)", self.heartbeat_rtts[-1] * 1000)
            else:
                log.info("heartbeat sent")
            await asyncio.sleep(interval)

    async def _endpoint_health(self, sender: FrameSender) -> None:
        """Probe the endpoint servers every interval (`agent.workloads.endpoint_health`); when one became
        unresponsive (or answers again) report the inventory now: the heartbeat's pace is too slow for it."""
        loop = asyncio.get_running_loop()
        while not sender.closed:
            started = loop.time()
            manager = getattr(self.runner, "endpoints", None)  # the runner's EndpointManager, where it has one
            if manager is not None and await self.prober.check(manager):
                await self._report_inventory()
            await asyncio.sleep(max(0.0, self.prober.settings.interval_s - (loop.time() - started)))

    async def _inventory(self, gpus: list[p.GpuInfo]) -> p.Inventory:
        if self.runner is None:
            return p.Inventory(gpus=gpus)
        return await asyncio.to_thread(self.runner.inventory, gpus)

    async def _end_workloads(self) -> None:
        """The node was deleted: stop the servers and Ray nodes this agent started (nothing may outlive it)."""
        try:
            if self.runner is None:  # revoked before this session's welcome: what earlier ones started
                self._ensure_runner("standalone", {})
            if self.runner is not None:
                await asyncio.to_thread(self.runner.end_workloads)
        except Exception:  # the agent exits either way; say what may still run
            log.exception("node revoked: could not stop every workload this agent started")

    def _ensure_runner(self, mode: str, mode_settings: dict[str, Any]) -> None:
        key = (mode, repr(sorted(mode_settings.items())))
        if self.runner is None or self._runner_mode != key:
            self.runner = self.runner_factory(mode, mode_settings)
            self._runner_mode = key


def _problem_kinds(inv: p.Inventory) -> set[tuple[str, str]]:
    """(part, code) of each of the inventory's problems (their messages may differ from read to read)."""
    return {(problem.part, problem.code) for problem in inv.problems}


def run_agent(config: AgentConfig, runner_factory: RunnerFactory) -> int:
    """Blocking entry point for `python -m agent run`; returns the process exit code."""
    return asyncio.run(TunnelClient(config, runner_factory).run())
