"""Ray workload steps shared by the end-to-end tests: the beat's workload pass on a loop, Serve answering
through the control plane's proxy on the deployment's own origin."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import requests

from fleet import origin_names
from fleet import services as fleet_services
from raymgr.workloads import services
from tests.support.live import ControlPlane
from tests.support.processes import wait_until


def poll_workloads_until(done: Callable[[], bool], what: str, timeout: float = 180) -> None:
    """Run the beat's passes until `done()`: `workloads_poll` (submit, ask the head for status) and, as the
    beat does, `commands_resend_stuck` (a status command whose send was lost stays in flight, and the
    workload pass asks nothing more of that job until it is resent)."""

    def step() -> bool:
        services.workloads_poll()
        fleet_services.commands_resend_stuck()
        return done()

    wait_until(step, timeout=timeout, interval=1.5, what=what)


def serve_origin(deployment: Any) -> dict[str, str]:
    """The Host header of a Serve deployment's own origin (its control-plane path only redirects there)."""
    return {"Host": origin_names.SERVE.host(deployment.pk)}


def serve_answer(
    control_plane: ControlPlane, deployment: Any, token_key: str, body: dict[str, Any], *, timeout: float = 60
) -> requests.Response:
    """POST `body` to the deployment through the proxy until it answers 200 (the agent learns the Serve port
    with its next inventory report); the 200 response."""
    answers: list[requests.Response] = []

    def answered() -> bool:
        answers.append(
            requests.post(
                control_plane.url + "/",
                json=body,
                headers={"Authorization": f"Token {token_key}", **serve_origin(deployment)},
                timeout=60,
            )
        )
        return answers[-1].status_code == 200

    wait_until(answered, timeout=timeout, interval=1, what="Serve answering through the proxy")
    return answers[-1]
