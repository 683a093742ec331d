"""A web process asked to stop leaves the load balancer before it stops accepting (`kernel.draining`,
`cleverthis.graceful`): /healthz answers 503 while it still serves, and it exits by itself once drained.
The tunnels' part of the drain (moving agents to another replica) is in tests/e2e/test_tunnel_moves.py."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
import requests

from kernel import draining
from tests.support.live import subprocess_env
from tests.support.processes import free_port, port_open, wait_until, web_server


@pytest.fixture
def drained():
    """This process drains during the test, and forgets it after."""
    yield
    draining.reset()


@pytest.mark.django_db
def test_healthz_answers_503_from_the_moment_the_process_drains(client, drained):
    assert client.get("/healthz").status_code == 200
    assert draining.begin(30.0)
    assert not draining.begin(30.0)  # once
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "draining"}


def test_drain_runs_every_hook_and_cancels_those_still_running_at_the_deadline(drained):
    seen: list[str] = []

    async def quick(deadline: float) -> None:
        seen.append("quick")

    async def stuck(deadline: float) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("stuck cancelled")
            raise

    draining.on_drain(quick)
    draining.on_drain(stuck)
    try:
        asyncio.run(draining.drain(0.3))
    finally:
        draining._hooks.remove(quick)
        draining._hooks.remove(stuck)
    assert seen == ["quick", "stuck cancelled"]
    assert draining.is_draining()


@pytest.mark.django_db(transaction=True)
def test_sigterm_fails_health_while_uvicorn_still_serves_then_it_exits_by_itself(tmp_path):
    port = free_port()
    env = subprocess_env(WEB_DRAIN_LB_S="2", WEB_DRAIN_DEADLINE_S="5")
    web = web_server(tmp_path, port, server="uvicorn", env=env, name="web")
    try:
        wait_until(lambda: port_open(port) or not web.alive(), timeout=30, what="uvicorn listening")
        url = f"http://127.0.0.1:{port}/healthz"
        assert requests.get(url, timeout=5).status_code == 200
        web.popen.send_signal(signal.SIGTERM)
        answers = []
        deadline = time.monotonic() + 10
        while web.alive() and time.monotonic() < deadline:
            try:
                answers.append(requests.get(url, timeout=2).status_code)
            except requests.ConnectionError:
                break
            time.sleep(0.1)
        # still accepting, but out of the load balancer: 503 for a while (WEB_DRAIN_LB_S), never 200 again
        assert answers.count(503) >= 5, (answers, web.log()[-3000:])
        assert 200 not in answers[answers.index(503) :]
        web.popen.wait(timeout=15)  # no hard stop needed: it exits once drained
        assert "drained; stopping" in web.log()
    finally:
        web.stop()
