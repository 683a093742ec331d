"""End to end with real Ray: tune (2 trials) → train with the best config → serve its checkpoint → HTTP.

The control plane's services dispatch every command; the agent's `RayCommandHandler` (process runtime,
its `RayJobsHandler` for the Job API and Serve) executes each with the payload exactly as the agent
receives it, and its outcome is recorded through fleet's command_record_* services, as over the tunnel.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import CommandFailed
from agent.ray.commands import RayCommandHandler
from agent.ray.ports import free_port
from agent.ray.process_runtime import RayProcessRuntime
from agent.runner import result_data
from fleet.models import Command, CommandStatus
from raymgr.workloads import services
from raymgr.workloads.models import JobStatus, ServeStatus, TrainingJob, TuneExperiment
from tests.raymgr.conftest import finish
from tests.support.processes import VENV_BIN, wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.integration]

TRAIN = """
import json, os
import ctfleet

config = ctfleet.config()
path = ctfleet.checkpoint_dir("final")
with open(os.path.join(path, "model.json"), "w") as f:
    json.dump({"weights": config, "trained": True}, f)
ctfleet.report_checkpoint(path, loss=0.25)
"""

FAILING = "import json\nraise ValueError('bad learning rate')\n"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RayCommandHandler]:
    runtime = RayProcessRuntime(VENV_BIN / "ray", tmp_path / "ray")
    yield RayCommandHandler(process_runtime=runtime, default_num_cpus=2)
    runtime.stop_all()


def run_queued(agent: RayCommandHandler) -> None:
    """Execute every queued command, oldest first, and record each outcome."""
    for command in Command.objects.filter(status=CommandStatus.QUEUED).select_related("node").order_by("created_at"):
        try:
            data = agent.run(command.command_type, command.wire_payload(), lambda *a, **k: None)
        except CommandFailed as exc:
            finish(command, ok=False, code=exc.code, message=exc.message)
        else:
            finish(command, data=result_data(command.command_type, data))  # as the agent sends it


def pump(agent: RayCommandHandler, done, *, timeout: float, what: str) -> None:
    """Beat passes + agent runs until `done()`."""

    def step() -> bool:
        services.workloads_poll()
        run_queued(agent)
        return done()

    wait_until(step, timeout=timeout, interval=1.0, what=what)


@pytest.mark.timeout(600)
def test_tune_train_serve_with_real_ray(agent, compute, add_node, make_ray, owner, workspace, tmp_path):
    add_node(compute, "only-box", memory_mb=16000)
    cluster = make_ray(runtime="process", gcs_port=free_port(), dashboard_port=free_port(), max_workers=0)
    run_queued(agent)
    cluster.refresh_from_db()
    assert cluster.status == "running", cluster.failure_reason

    # Tune: 2 trials of the built-in objective (best where x = 3), ASHA.
    experiment = services.tune_experiment_create(
        actor=owner,
        workspace=workspace,
        ray_cluster=cluster,
        name="sweep",
        search_space={"x": {"type": "grid", "values": [1.0, 2.5]}},
        metric="score",
        mode="max",
        num_samples=1,
        max_concurrent_trials=2,
        max_iterations=3,
        scheduler="asha",
        cpus_per_trial=0.5,
        training_script=TRAIN,
    )
    run_queued(agent)

    def tune_done() -> bool:
        experiment.refresh_from_db()
        return experiment.status not in JobStatus.active()

    pump(agent, tune_done, timeout=240, what="the Tune experiment to finish")
    assert experiment.status == JobStatus.SUCCEEDED, experiment.traceback or experiment.logs[-3000:]
    assert experiment.best_config == {"x": 2.5}
    trials = list(experiment.trials.all())
    assert len(trials) == 2
    assert {t.status for t in trials} == {"TERMINATED"}
    assert all(t.iterations >= 1 for t in trials)

    # Train with the best config: the script writes a checkpoint dir and registers it.
    job = services.tune_train_with_best(
        actor=owner, experiment=experiment, name="best", storage_path=str(tmp_path / "ckpt")
    )
    run_queued(agent)

    def job_done() -> bool:
        job.refresh_from_db()
        return job.status not in JobStatus.active()

    pump(agent, job_done, timeout=120, what="the training job to finish")
    assert job.status == JobStatus.SUCCEEDED, job.traceback or job.logs
    checkpoint = Path(job.latest_checkpoint)
    assert json.loads((checkpoint / "model.json").read_text()) == {"weights": {"x": 2.5}, "trained": True}

    # Serve the checkpoint: a generic Python deployment; HTTP through Serve's port on the node.
    deployment = services.serve_deployment_create(
        actor=owner,
        workspace=workspace,
        ray_cluster=cluster,
        name="best-model",
        checkpoint_job=job,
        http_port=free_port(),
        cpus_per_replica=0.25,
    )
    run_queued(agent)

    def serving() -> bool:
        deployment.refresh_from_db()
        return deployment.status in (ServeStatus.RUNNING, ServeStatus.FAILED, ServeStatus.UNHEALTHY)

    pump(agent, serving, timeout=180, what="the Serve deployment to run")
    assert deployment.status == ServeStatus.RUNNING, deployment.failure_reason
    assert deployment.endpoint_url.endswith("/best-model")
    # The agent lets the control plane's tunnel proxy reach the Serve port (deployment.proxy_path).
    assert deployment.http_port in agent.dashboard_ports()
    request = urllib.request.Request(
        deployment.endpoint_url,
        data=json.dumps({"prompt": "hello there"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    assert answer["checkpoint"] == str(checkpoint)
    assert answer["model"]["model.json"]["weights"] == {"x": 2.5}
    assert answer["input"] == {"prompt": "hello there"}
    sse = urllib.request.Request(
        deployment.endpoint_url,
        data=json.dumps({"prompt": "hello there"}).encode(),
        headers={"Accept": "text/event-stream"},
    )
    with urllib.request.urlopen(sse, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = [line[6:] for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert events[:2] == ['{"token": "hello"}', '{"token": "there"}']
    assert events[-1] == "[DONE]"

    # A failing script: failed, with the Python traceback.
    bad = services.training_job_create(
        actor=owner, workspace=workspace, ray_cluster=cluster, name="bad", script=FAILING
    )
    run_queued(agent)

    def bad_done() -> bool:
        bad.refresh_from_db()
        return bad.status not in JobStatus.active()

    pump(agent, bad_done, timeout=120, what="the failing job to finish")
    assert bad.status == JobStatus.FAILED
    assert bad.traceback.startswith("Traceback (most recent call last):")
    assert bad.traceback.endswith("ValueError: bad learning rate")

    # Stop the deployment: the Serve app is deleted through a job.
    services.serve_deployment_stop(actor=owner, deployment=deployment)
    run_queued(agent)

    def stopped() -> bool:
        deployment.refresh_from_db()
        return deployment.status == ServeStatus.STOPPED

    pump(agent, stopped, timeout=120, what="the Serve deployment to stop")
    assert TrainingJob.objects.filter(status="succeeded").count() == 1
    assert TuneExperiment.objects.get().status == JobStatus.SUCCEEDED
