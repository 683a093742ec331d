"""Helpers shared by the fleet core's services (and the workloads'): model validation and
host facts as agents report them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError

from agent import protocol


def full_clean(obj: Any, *, exclude: Iterable[str] = ()) -> None:
    """Validate a model instance's fields (constraints are left to the database)."""
    obj.full_clean(exclude=list(exclude), validate_constraints=False)


def host_facts_parse(facts: protocol.HostFacts | dict[str, Any]) -> protocol.HostFacts:
    """An agent's host facts, parsed and checked against the columns they fill (ValidationError if not)."""
    if isinstance(facts, protocol.HostFacts):
        parsed = facts
    else:
        try:
            parsed = protocol.from_dict(protocol.HostFacts, facts, where="facts")
        except protocol.ProtocolError as exc:
            raise ValidationError({"facts": str(exc)}) from None
    limits = {"hostname": 253, "os": 200, "arch": 50, "agent_version": 100}
    errors = {f"facts.{k}": f"At most {n} characters." for k, n in limits.items() if len(getattr(parsed, k)) > n}
    if not parsed.hostname.strip():
        errors["facts.hostname"] = "The hostname must not be empty."
    if parsed.cpu_count < 0 or parsed.memory_total_mb < 0:
        errors["facts"] = "cpu_count and memory_total_mb must not be negative."
    if len(parsed.gpus) > 64:
        errors["facts.gpus"] = "At most 64 GPUs."
    if errors:
        raise ValidationError(errors)
    return parsed


def gpu_fields(gpus: list[protocol.GpuInfo]) -> dict[str, Any]:
    """The Node GPU columns for the GPUs an agent reports (totals, usage, the first GPU's model)."""
    return {
        "gpus": [protocol.to_dict(g) for g in gpus],
        "gpu_count": len(gpus),
        "gpu_model": (gpus[0].name[:200] if gpus else ""),
        "vram_total_mb": sum(max(g.memory_total_mb, 0) for g in gpus),
        "vram_used_mb": sum(max(g.memory_used_mb, 0) for g in gpus),
        "gpu_utilization_percent": (sum(g.utilization_percent for g in gpus) / len(gpus)) if gpus else 0.0,
    }


def host_fact_fields(facts: protocol.HostFacts) -> dict[str, Any]:
    """The Node columns host facts fill (GPU columns included)."""
    return {
        "hostname": facts.hostname,
        "cpu_count": max(facts.cpu_count, 0),
        "memory_total_mb": max(facts.memory_total_mb, 0),
        "agent_version": facts.agent_version,
        "os": facts.os,
        "arch": facts.arch,
        **gpu_fields(facts.gpus),
    }
