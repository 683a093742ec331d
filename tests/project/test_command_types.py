"""One list of command types (`agent.protocol.COMMAND_TYPES`, grouped by who carries them out), and every
command type complete: its payload dataclass, the API serializer derived from it, its typed result, its member
of `fleet.models.CommandType` — as Zulip's `event_schema` checks every event it sends. No production module
writes the list (or a part of it) again: it derives it from the protocol.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from agent import protocol
from fleet import payloads
from fleet.models import CommandType
from fleet.payload_schema import serializer_for

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("agent", "fleet", "raymgr", "kernel", "cleverthis", "tenancy", "audit")
GROUPS = {
    "workloads": protocol.WORKLOAD_COMMAND_TYPES,
    "ray nodes": protocol.RAY_NODE_COMMAND_TYPES,
    "ray jobs": protocol.RAY_JOB_COMMAND_TYPES,
    "agent": protocol.AGENT_COMMAND_TYPES,
}


def test_the_groups_split_the_list_without_overlap():
    grouped = [command_type for group in GROUPS.values() for command_type in group]
    assert sorted(grouped) == sorted(protocol.COMMAND_TYPES)
    assert len(set(grouped)) == len(grouped), "a command type in two groups"
    assert all(GROUPS.values()), "an empty group"


def test_the_control_plane_command_type_is_the_protocol_list():
    assert list(CommandType.values) == list(protocol.COMMAND_TYPES)
    assert CommandType.ENDPOINT_START == "endpoint.start"
    assert CommandType("ray.job.submit").label == "ray.job.submit"


@pytest.mark.parametrize("command_type", protocol.COMMAND_TYPES)
def test_every_command_type_has_its_payload_serializer_and_result(command_type):
    payload_cls = protocol.PAYLOAD_TYPES.get(command_type)
    assert dataclasses.is_dataclass(payload_cls), f"{command_type}: no payload type"
    result_cls = protocol.RESULT_TYPES.get(command_type)
    assert dataclasses.is_dataclass(result_cls), f"{command_type}: no result type"
    fields = {f.name for f in dataclasses.fields(payload_cls)}
    assert set(serializer_for(payload_cls)().fields) == fields, f"{command_type}: the serializer differs"
    if command_type in protocol.AGENT_COMMAND_TYPES:  # the control plane's own: never accepted from the API
        assert command_type not in payloads.PAYLOAD_SERIALIZERS
    else:  # the API accepts it (the Ray apps register theirs at start)
        assert set(payloads.PAYLOAD_SERIALIZERS[command_type]().fields) == fields
    assert protocol.parse_result(command_type, {}) == result_cls()  # an empty result reads as its type


def test_the_api_accepts_exactly_the_protocol_command_types_but_the_agents_own():
    expected = set(protocol.COMMAND_TYPES) - set(protocol.AGENT_COMMAND_TYPES)
    assert set(payloads.PAYLOAD_SERIALIZERS) == expected


def _restated_lists(source: str) -> list[int]:
    """Lines of set, list and tuple literals in `source` naming two or more command types."""
    known = set(protocol.COMMAND_TYPES)
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Set | ast.List | ast.Tuple):
            named = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in known]
            if len(named) >= 2:
                found.append(node.lineno)
    return found


def test_the_restated_list_finder_finds_one():
    assert _restated_lists('X = frozenset({"ray.job.submit", "ray.job.stop"})\nY = ("ray.status",)\n') == [1]


def test_no_production_module_writes_the_list_again():
    """Only the protocol names the command types; the rest derive theirs from it (or name members of
    `fleet.models.CommandType`, which fail at import when misspelt)."""
    the_list = ROOT / "agent" / "protocol" / "payloads.py"
    offenders = []
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == the_list or "migrations" in path.parts:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}" for line in _restated_lists(path.read_text())]
    assert offenders == [], f"command types listed again (derive them from agent.protocol): {offenders}"


def test_the_agents_ray_job_handler_routes_every_ray_job_command_type():
    from agent.ray.jobs import RayJobsHandler

    assert set(RayJobsHandler.ROUTES) == set(protocol.RAY_JOB_COMMAND_TYPES)
    assert all(RayJobsHandler().handles(command_type) for command_type in protocol.RAY_JOB_COMMAND_TYPES)
