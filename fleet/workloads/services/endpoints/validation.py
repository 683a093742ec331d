"""What an endpoint may ask for: its model id, revision, server arguments and counts (replicas, autoscaling
targets, idle timeout), each refused with a ValidationError on its field; and the bounds the API states."""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError

from agent import protocol
from agent.protocol import MODEL_ID_RE
from agent.protocol.rules import field_rules
from fleet.workloads.models import RoutingPolicy
from fleet.workloads.services.common import MAX_MODEL_ID, MAX_REVISION

REVISION_RE = re.compile(protocol.REVISION_RE)
# What each replica's endpoint.start carries is bounded as the protocol bounds it (`EndpointStartPayload`).
_START_RULES = field_rules(protocol.EndpointStartPayload)
MAX_GPUS = int(_START_RULES["gpus"].max or 0)
MAX_VRAM_MB = int(_START_RULES["min_vram_mb"].max or 0)
# An endpoint's server arguments travel as endpoint.start's `extra_args`: the payload's bounds.
MAX_SERVER_ARGS = protocol.MAX_SERVER_ARGS
MAX_SERVER_ARG_LENGTH = protocol.MAX_SERVER_ARG_LENGTH
# The endpoint's own settings (no payload carries them): replicas, autoscaling targets per replica (0 = off).
MAX_REPLICAS = 32
MAX_TARGET_REQUESTS_PER_MIN = 10_000_000
MAX_TARGET_IN_FLIGHT = 100_000
MAX_TARGET_TOKENS_PER_S = 10_000_000
MAX_SCALE_COOLDOWN_S = 86_400
MAX_IDLE_TIMEOUT_S = 30 * 86_400


def validate_model_id(model_id: Any, field: str = "model_id") -> str:
    """A Hugging Face model id: `owner/name` (or a legacy bare `name`), letters, digits, `-_.`."""
    if not isinstance(model_id, str):
        raise ValidationError({field: "Must be a string."})
    if len(model_id) > MAX_MODEL_ID:
        raise ValidationError({field: f"At most {MAX_MODEL_ID} characters."})
    if not re.match(MODEL_ID_RE, model_id) or ".." in model_id or "--" in model_id:
        raise ValidationError(
            {field: "Not a valid model id: expected owner/name with letters, digits, '-', '_' and '.'."}
        )
    return model_id


def validate_revision(revision: Any) -> str:
    """A model revision: a branch, tag or commit hash (`protocol.REVISION_RE`, no `..`), at most `MAX_REVISION`."""
    if not isinstance(revision, str) or not revision:
        raise ValidationError({"revision": "Must be a non-empty string."})
    if len(revision) > MAX_REVISION or not REVISION_RE.match(revision) or ".." in revision:
        raise ValidationError({"revision": "Not a valid revision (a branch, tag or commit hash)."})
    return revision


def validate_server_args(value: Any, field: str = "server_args") -> list[str]:
    """The server arguments every replica of an endpoint starts with, as vLLM takes them: a list of strings
    (an option and its value given as one item, `"--max-model-len 2048"`, become two items), at most
    `MAX_SERVER_ARGS` of at most `MAX_SERVER_ARG_LENGTH` characters, each an allowed vLLM flag with a value of
    its kind (`agent.protocol.check_server_args`, the allow-list the agent applies too); a flag the agent sets
    itself, one naming a local path or an import, or any other is refused by name. ValidationError on `field`."""
    args, problems = protocol.check_server_args(value)
    if problems:
        raise ValidationError({field: problems})
    return args


def validate_count(value: Any, field: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ValidationError({field: f"Must be an integer between 0 and {maximum}."})
    return value


def valid_port(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535 else 0


def validate_routing_policy(value: object) -> str:
    """`value` if it names a routing policy (`RoutingPolicy`), else a ValidationError on `routing_policy`."""
    if not isinstance(value, str) or value not in RoutingPolicy.values:
        choices = ", ".join(RoutingPolicy.values)
        raise ValidationError({"routing_policy": f"Must be one of: {choices}."})
    return value
