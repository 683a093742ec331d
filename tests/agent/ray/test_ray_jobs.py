"""`RayJobsHandler.ray.job.submit` against a head whose Job API is not ready yet (a fake Job client)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent import protocol
from agent.errors import CommandFailed
from agent.ray.jobs import RayJobsHandler

NOT_READY = "Request failed with status code 500: No available agent to submit job, please try again later.."
PAYLOAD = {"cluster_id": "c1", "member_id": "m1", "submission_id": "train-1", "entrypoint": "python train.py"}


class FakeJobClient:
    """Refuses the first `refusals` submissions with `message`, then accepts."""

    def __init__(self, refusals: int, message: str = NOT_READY) -> None:
        self.refusals = refusals
        self.message = message
        self.calls = 0

    def get_job_info(self, submission_id: str) -> Any:
        raise RuntimeError(f"Job {submission_id} does not exist")

    def submit_job(self, **kwargs: Any) -> str:
        self.calls += 1
        if self.calls <= self.refusals:
            raise RuntimeError(self.message)
        return kwargs["submission_id"]


def handler(tmp_path: Path, client: FakeJobClient, monkeypatch, *, retry_s: float) -> RayJobsHandler:
    jobs = RayJobsHandler(work_dir=tmp_path, not_ready_retry_s=retry_s, retry_interval_s=0.01)
    monkeypatch.setattr(jobs, "_client", lambda port, host="": client)
    return jobs


def test_submit_waits_for_the_heads_job_agent(tmp_path, monkeypatch):
    """A head that just started answers 'try again later' until its dashboard agent registered."""
    client = FakeJobClient(refusals=2)
    said: list[str] = []

    result = handler(tmp_path, client, monkeypatch, retry_s=30).run(
        "ray.job.submit", PAYLOAD, lambda message, *a, **k: said.append(message)
    )

    assert result == protocol.RayJobSubmitResult(submission_id="train-1", status="PENDING", already_submitted=False)
    assert client.calls == 3
    assert said.count("the Ray head's job agent is not ready yet; retrying") == 2


def test_submit_gives_up_once_the_wait_is_over(tmp_path, monkeypatch):
    client = FakeJobClient(refusals=1000)

    with pytest.raises(CommandFailed) as failed:
        handler(tmp_path, client, monkeypatch, retry_s=0.05).run("ray.job.submit", PAYLOAD, lambda *a, **k: None)

    assert failed.value.code == "internal"
    assert "No available agent to submit job" in failed.value.message


def test_other_refusals_are_not_retried(tmp_path, monkeypatch):
    client = FakeJobClient(refusals=1, message="Request failed with status code 400: bad runtime_env")

    with pytest.raises(CommandFailed) as failed:
        handler(tmp_path, client, monkeypatch, retry_s=30).run("ray.job.submit", PAYLOAD, lambda *a, **k: None)

    assert client.calls == 1
    assert "bad runtime_env" in failed.value.message
