"""Pure functions: Serve health, troubleshooting hints, agent-side marker/traceback parsing, search spaces."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from agent.ray.jobs import MAX_MARKER_NESTING, extract_traceback, parse_markers
from raymgr.workloads import health, render

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def app(status="RUNNING", replicas=("RUNNING",), target=1, dep_status="HEALTHY"):
    return {
        "status": status,
        "message": "msg" if status != "RUNNING" else "",
        "deployments": {
            "model": {
                "status": dep_status,
                "target_num_replicas": target,
                "replicas": [{"state": s} for s in replicas],
                "message": "replica crashed" if dep_status == "UNHEALTHY" else "",
            }
        },
    }


@pytest.mark.parametrize(
    ("report", "deploying", "expected"),
    [
        (app(), False, "running"),
        (app(replicas=("RUNNING", "STARTING"), target=2), False, "degraded"),
        (app(dep_status="UNHEALTHY"), False, "degraded"),
        (app(status="DEPLOY_FAILED"), False, "unhealthy"),
        (app(status="UNHEALTHY"), False, "unhealthy"),
        (app(status="DEPLOYING"), False, "deploying"),
        (None, True, "deploying"),
        (None, False, "unhealthy"),
    ],
)
def test_serve_health(report, deploying, expected):
    assert health.serve_health(report, deploying=deploying)[0] == expected


def test_degraded_reason_names_the_shortfall():
    _, reason = health.serve_health(app(replicas=("RUNNING",), target=3))
    assert reason == "model has 1 of 3 replicas running"


def _job_hints(**kwargs):
    base = {
        "status": "queued",
        "queue_reason": "",
        "submitted_at": NOW - dt.timedelta(minutes=10),
        "created_at": NOW - dt.timedelta(minutes=10),
        "finished_at": None,
        "traceback": "",
        "cluster_status": {},
        "now": NOW,
    }
    base.update(kwargs)
    return health.job_hints(**base)


def test_stuck_pending_names_the_unplaceable_demand():
    (hint,) = _job_hints(cluster_status={"pending": [{"GPU": 4.0, "CPU": 1.0}]})
    assert hint.problem == "Stuck pending"
    assert "1 CPU, 4 GPU" in hint.cause


def test_recently_queued_is_not_stuck_and_queue_reason_is_the_cause():
    assert _job_hints(submitted_at=NOW - dt.timedelta(minutes=1)) == []
    (hint,) = _job_hints(submitted_at=None, queue_reason="Needs 8 GPUs; cluster can have at most 2.")
    assert hint.cause.startswith("Needs 8 GPUs")


@pytest.mark.parametrize(
    ("traceback", "cause"),
    [
        ("Traceback (most recent call last):\nModuleNotFoundError: No module named 'torch'", "A package is missing"),
        ('Traceback (most recent call last):\n  File "t.py"\nSyntaxError: invalid syntax', "does not parse"),
        ("Traceback (most recent call last):\nValueError: bad", "raised at start-up: ValueError: bad"),
    ],
)
def test_failed_immediately(traceback, cause):
    (hint,) = _job_hints(status="failed", finished_at=NOW - dt.timedelta(minutes=9, seconds=50), traceback=traceback)
    assert hint.problem == "Job failed immediately"
    assert cause in hint.cause


def test_failing_late_is_not_immediate():
    assert _job_hints(status="failed", finished_at=NOW, traceback="Traceback\nValueError: x") == []


def test_workers_not_scaling_and_object_store():
    status = {
        "pending": [{"CPU": 8.0}],
        "nodes": [
            {
                "is_head": True,
                "resources": {"object_store_memory": 1000.0},
                "available": {"object_store_memory": 100.0},
            },
            {
                "ray_node_id": "ab" * 8,
                "resources": {"object_store_memory": 1000.0},
                "available": {"object_store_memory": 900.0},
            },
        ],
    }
    hints = health.cluster_hints(cluster_status=status, live_workers=2, max_workers=2)
    assert [h.problem for h in hints] == ["Workers not scaling", "High object store memory"]
    assert "max_workers (2)" in hints[0].cause
    assert "head object store is 90% full" in hints[1].cause
    below = health.cluster_hints(cluster_status=status, live_workers=0, max_workers=2)
    assert "no free compute node is large enough" in below[0].cause
    assert health.cluster_hints(cluster_status={}, live_workers=0, max_workers=0) == []


def test_markers_and_traceback_from_logs():
    logs = "\n".join(
        [
            "starting",
            'CTFLEET {"kind": "checkpoint", "path": "/a"}',
            "(pid=1) CTFLEET not json",
            '(Trainable pid=2) CTFLEET {"kind": "trial", "trial_id": "t"}',
            "Traceback (most recent call last):",
            '  File "x.py", line 1, in <module>',
            "    raise KeyError('k')",
            "KeyError: 'k'",
            "after",
        ]
    )
    assert parse_markers(logs) == [{"kind": "checkpoint", "path": "/a"}, {"kind": "trial", "trial_id": "t"}]
    assert extract_traceback(logs).splitlines()[-1] == "KeyError: 'k'"
    assert extract_traceback(logs).startswith("Traceback")
    assert extract_traceback("all fine") == ""


def test_markers_too_deep_for_a_result_frame_are_skipped():
    """A job printing deeply nested markers must not make its status result a frame the tunnel refuses."""
    from agent import protocol

    def nested(depth: int) -> str:
        return "CTFLEET " + '{"a":' * depth + "1" + "}" * depth

    deepest_kept = nested(MAX_MARKER_NESTING)
    logs = "\n".join(
        [nested(protocol.MAX_NESTING), deepest_kept, nested(5_000), "CTFLEET " + "[" * 500_000, 'CTFLEET {"k": 1}']
    )
    markers = parse_markers(logs)
    assert markers == [json.loads(deepest_kept.removeprefix("CTFLEET ")), {"k": 1}]
    result = protocol.Result(command_id="c", data={"markers": markers})
    assert protocol.decode(protocol.encode(result)) == result


@pytest.mark.parametrize(
    ("space", "ok"),
    [
        ({"x": {"type": "uniform", "lower": 0, "upper": 1}}, True),
        ({"x": {"type": "choice", "values": ["a", "b"]}, "y": {"type": "constant", "value": 3}}, True),
        ({"x": {"type": "randint", "lower": 1, "upper": 1}}, False),
        ({"x": {"type": "choice", "values": []}}, False),
        ({"x": {"type": "normal"}}, False),
        ({"x": {"type": "constant"}}, False),
        ([], False),
    ],
)
def test_search_space_errors(space, ok):
    assert (render.search_space_errors(space) == []) is ok
