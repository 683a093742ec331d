"""The endpoint API restates no rule: what it hands to every replica's endpoint.start (model, revision, GPUs,
VRAM) is bounded exactly as the protocol bounds that payload, so nothing the API accepts is refused by the
agent (finding: `min_vram_mb` was capped at 16 TiB by the API and not at all by the protocol). One revision
pattern serves the protocol, the services and the agent; the quota API takes one field per quota of `QUOTAS`.
"""

from __future__ import annotations

import uuid

import pytest
from rest_framework import serializers

from agent import protocol
from agent.protocol.rules import field_rules
from agent.workloads import models as agent_models
from fleet.workloads import services as workload_services
from fleet.workloads.forms import EndpointCreateForm
from fleet.workloads.serializers import EndpointCreateSerializer, EndpointRevisionSerializer
from tenancy.api.serializers import QuotaLimitsSerializer
from tenancy.quotas import LIMIT_MAX, QUOTAS

RULES = field_rules(protocol.EndpointStartPayload)
SHARED = ("model_id", "revision", "gpus", "min_vram_mb")


def _create(**fields):
    serializer = EndpointCreateSerializer(data={"cluster": str(uuid.uuid4()), "model_id": "acme/tiny", **fields})
    return serializer.is_valid(), serializer.errors


def _start(**fields) -> None:
    protocol.parse_payload("endpoint.start", {"endpoint_id": "a" * 12, "model_id": "acme/tiny", **fields})


@pytest.mark.parametrize("name", SHARED)
def test_the_api_field_is_bounded_as_the_payload_field(name):
    field = EndpointCreateSerializer().fields[name]
    rule = RULES[name]
    if isinstance(field, serializers.IntegerField):
        assert (field.min_value, field.max_value) == (rule.min, rule.max)
        assert rule.max is not None, f"endpoint.start's {name} has no upper bound"
    else:
        assert field.max_length == rule.max_length


@pytest.mark.parametrize(
    ("name", "too_much"), [("gpus", RULES["gpus"].max + 1), ("min_vram_mb", RULES["min_vram_mb"].max + 1)]
)
def test_what_the_api_refuses_the_agent_refuses_and_what_it_takes_the_agent_takes(name, too_much):
    ok, errors = _create(**{name: too_much})
    assert not ok
    assert name in errors
    with pytest.raises(protocol.ProtocolError):
        _start(**{name: too_much})
    ok, errors = _create(**{name: too_much - 1})
    assert ok, errors
    _start(**{name: too_much - 1})


def test_the_page_form_takes_the_same_bounds():
    form = EndpointCreateForm()
    assert form.fields["gpus"].max_value == RULES["gpus"].max
    assert form.fields["min_vram_mb"].max_value == RULES["min_vram_mb"].max
    assert form.fields["revision"].max_length == RULES["revision"].max_length


def test_one_revision_pattern():
    assert workload_services.REVISION_RE.pattern == protocol.REVISION_RE
    assert agent_models.REVISION_RE.pattern == protocol.REVISION_RE
    assert workload_services.MAX_REVISION == RULES["revision"].max_length
    assert workload_services.MAX_MODEL_ID == RULES["model_id"].max_length


@pytest.mark.parametrize("revision", ["../x", "-x", "x" * 201, ""])
def test_a_bad_revision_is_refused_by_each_serializer_and_the_protocol(revision):
    ok, errors = _create(revision=revision)
    assert not ok
    assert "revision" in errors
    assert not EndpointRevisionSerializer(data={"revision": revision}).is_valid()
    with pytest.raises(protocol.ProtocolError):
        _start(revision=revision)


def test_the_quota_api_takes_one_field_per_quota():
    fields = QuotaLimitsSerializer().fields
    assert list(fields) == [quota.name for quota in QUOTAS]
    for quota in QUOTAS:
        field = fields[quota.name]
        assert isinstance(field, serializers.IntegerField if quota.whole else serializers.FloatField)
        assert (field.min_value, field.max_value, field.required, field.allow_null) == (0, LIMIT_MAX, False, True)
