"""A replica's start explained: its phases (`protocol.StartPhases`, timed by the agent) with the time it waited
to be taken (placed: queued until the agent acknowledged it), on the endpoint's event log and page and in the
`cleverthis_endpoint_start_phase_seconds` histograms of /metrics. A start that downloaded its weights (a cold
start) leaves them in the node's cache: its NodeModel row is written at once, so placement counts them."""

from __future__ import annotations

from typing import Any

from agent import protocol
from fleet.models import Command
from fleet.workloads.models import Endpoint, EndpointReplica, NodeModel
from fleet.workloads.services.endpoints.events import endpoint_event_record
from kernel import metrics

MIB = 1024 * 1024


def start_phase_durations(placed_s: float, phases: protocol.StartPhases) -> dict[str, float]:
    """Each phase's own length in seconds, in order (the agent reports when each ended), and the total."""
    ends = [
        ("weights", phases.weights_s),
        ("server_started", phases.server_started_s),
        ("model_loaded", phases.model_loaded_s),
        ("healthy", phases.healthy_s),
    ]
    if phases.adapters_s is not None:
        ends.append(("adapters", phases.adapters_s))
    durations = {"placed": max(0.0, placed_s)}
    previous = 0.0
    for name, end in ends:
        durations[name] = round(max(0.0, float(end) - previous), 3)
        previous = max(previous, float(end))
    durations["total"] = round(durations["placed"] + previous, 3)
    return durations


def _placed_s(command: Command) -> float:
    """Seconds from the start being queued (the replica placed) until the agent took it."""
    if command.acked_at is None or command.created_at is None:
        return 0.0
    return round(max(0.0, (command.acked_at - command.created_at).total_seconds()), 3)


def replica_record_start_phases(
    *, endpoint: Endpoint, replica: EndpointReplica, command: Command, phases: protocol.StartPhases
) -> dict[str, Any]:
    """Put one replica's start phases on the endpoint's log and in the histograms; returns the event's data."""
    durations = start_phase_durations(_placed_s(command), phases)
    weights = phases.weights or "present"
    for phase, seconds in durations.items():
        metrics.ENDPOINT_START_PHASE_SECONDS.labels(phase=phase, weights=weights).observe(seconds)
    size = f"{phases.weights_bytes / MIB:,.1f} MiB"
    parts = [
        f"placed {durations['placed']:.1f} s",
        f"weights {weights} ({size}) {durations['weights']:.1f} s",
        f"server started {durations['server_started']:.1f} s",
        f"model loaded {durations['model_loaded']:.1f} s",
        f"first health check {durations['healthy']:.1f} s",
    ]
    if "adapters" in durations:
        parts.append(f"adapters loaded {durations['adapters']:.1f} s")
    if weights == "downloaded":  # the node holds the weights now (its next inventory adds their path)
        payload: protocol.EndpointStartPayload | None = command.parsed_payload
        if payload is not None:
            NodeModel.objects.get_or_create(
                node_id=command.node_id,
                model_id=payload.model_id,
                revision=payload.revision,
                defaults={"size_bytes": phases.weights_bytes},
            )
    data = {
        "replica": replica.server_id,
        "phases": durations,
        "weights": weights,
        "weights_bytes": phases.weights_bytes,
    }
    endpoint_event_record(
        endpoint=endpoint,
        node_id=command.node_id,
        kind="endpoint.start_phases",
        message=f"Replica {replica.server_id} {'cold' if weights == 'downloaded' else 'warm'} start in "
        f"{durations['total']:.1f} s: " + ", ".join(parts),
        data=data,
        command=command,
    )
    return data
