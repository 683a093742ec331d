"""Prometheus instruments that the processes update as things happen (tunnels, commands, proxy, autoscaler).

Every control-plane process (web processes, Celery workers and beat) writes its values to files in
`PROMETHEUS_MULTIPROC_DIR` (prometheus_client's multiprocess mode); a scrape of `/metrics` on any web
process merges the files of all of them (`cleverthis.metrics_scrape`). The directory comes from the
settings, which put it in the environment before prometheus_client is imported (it picks its mode then).
What the database already knows (nodes by status, commands by type and status, Ray clusters by state,
node utilization) is read at scrape time instead, so it is right whatever the number of processes.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def multiprocess_directory(path: str) -> str:
    """`path`, made if missing, once it is a directory this process can write its metric files to;
    otherwise ImproperlyConfigured saying so (rather than a failure deep inside prometheus_client)."""
    if not path:
        raise ImproperlyConfigured("PROMETHEUS_MULTIPROC_DIR is empty: name a writable directory for metric files.")
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"PROMETHEUS_MULTIPROC_DIR={path!r} cannot be made a directory for metric files: {exc.strerror or exc}."
        ) from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ImproperlyConfigured(
            f"PROMETHEUS_MULTIPROC_DIR={path!r} is not writable by this process: {exc.strerror or exc}."
        ) from None
    return path


os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiprocess_directory(settings.PROMETHEUS_MULTIPROC_DIR)

from prometheus_client import Counter, Gauge, Histogram  # noqa: E402
from prometheus_client import values as _values  # noqa: E402

# prometheus_client picks single- or multi-process mode when first imported: if some library imported it
# before the settings named the directory, pick again (no instrument of ours exists yet).
if not getattr(_values.ValueClass, "_multiprocess", False):
    _values.ValueClass = _values.get_value_class()

# Seconds: sub-millisecond in-process hops up to minutes behind a stalled broker or database.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

TUNNELS_CONNECTED = Gauge(
    "cleverthis_tunnels_connected",
    "Authenticated agent tunnels held by this web process (one series per live process, label pid).",
    multiprocess_mode="liveall",
)
COMMAND_ACK_SECONDS = Histogram(
    "cleverthis_command_ack_seconds",
    "From a command's dispatch (claimed and sent to the node) to the agent's ack being recorded.",
    ["type"],
    buckets=LATENCY_BUCKETS,
)
HEARTBEAT_LAG_SECONDS = Histogram(
    "cleverthis_heartbeat_lag_seconds",
    "From the agent sending a heartbeat (its clock) to the control plane having stored it.",
    buckets=LATENCY_BUCKETS,
)
# Seconds: a replica's start phases, from a placement's fraction of a second to a large model's download.
START_PHASE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
ENDPOINT_START_PHASE_SECONDS = Histogram(
    "cleverthis_endpoint_start_phase_seconds",
    "How long each phase of an endpoint replica's start took (phase: placed = queued until the agent took it, "
    "weights, server_started, model_loaded, healthy = until the first health check passed, adapters, total; "
    "weights: present = cached on the node, downloaded = a cold start).",
    ["phase", "weights"],
    buckets=START_PHASE_BUCKETS,
)
PROXY_STREAMS = Counter(
    "cleverthis_proxy_streams",
    "Byte streams opened to ports on nodes (via: local = the tunnel is in this process, peer = another process).",
    ["via"],
)
PROXY_STREAMS_ACTIVE = Gauge(
    "cleverthis_proxy_streams_active",
    "Proxied byte streams open right now, all live processes together.",
    multiprocess_mode="livesum",
)
PROXY_BYTES = Counter(
    "cleverthis_proxy_bytes",
    "Bytes carried by proxied streams (direction: to_node = request bytes, from_node = response bytes).",
    ["direction"],
)
PEER_CONNECTIONS_REFUSED = Counter(
    "cleverthis_peer_connections_refused",
    "Peer-link connections dropped before proving the peer key (reason: pending_cap = over "
    "TUNNEL_PEER_MAX_PENDING, handshake_timeout, handshake_failed = a wrong proof, junk or an oversized frame).",
    ["reason"],
)
API_KEY_RATE_LIMITED = Counter(
    "cleverthis_api_key_rate_limited",
    "Endpoint requests refused 429 by an API key's rate limit (limit: requests or tokens per minute).",
    ["limit"],
)
RATE_LIMIT_UNAVAILABLE = Counter(
    "cleverthis_rate_limit_unavailable",
    "Rate-limit checks (step: admit) and token charges (step: charge) skipped because Redis could not be "
    "reached: the request went through (the limiter fails open).",
    ["step"],
)
AUTOSCALER_DECISIONS = Counter(
    "cleverthis_ray_autoscaler_decisions",
    "Ray autoscaler decisions (action: scale_up, scale_down, both, none).",
    ["action"],
)
AUTOSCALER_WORKERS = Counter(
    "cleverthis_ray_autoscaler_workers",
    "Ray workers the autoscaler decided to start (change: added) or drain and stop (change: removed).",
    ["change"],
)
ENDPOINT_REQUESTS = Counter(
    "cleverthis_endpoint_requests",
    "Requests to inference endpoints through the proxy, by workspace and endpoint (outcome: ok, error).",
    ["workspace_id", "endpoint_id", "outcome"],
)
ENDPOINT_TOKENS = Counter(
    "cleverthis_endpoint_tokens",
    "Tokens of endpoint requests as their responses reported them (kind: prompt, completion), by workspace "
    "and endpoint.",
    ["workspace_id", "endpoint_id", "kind"],
)

USAGE_FLUSH_FAILURES = Counter(
    "cleverthis_usage_flush_failures",
    "Flushes of the proxy's metered usage that the database refused (the counts stay in memory for the next).",
)


def count_endpoint_usage(
    workspace: str, endpoint: str, requests: float, errors: float, prompt: float, completion: float
) -> None:
    """Add a batch of one endpoint's metered requests (written by `fleet.usage.meter` at each flush, not per
    request). One series per endpoint: the label values are bounded by the endpoints that exist."""
    if requests - errors:
        ENDPOINT_REQUESTS.labels(workspace, endpoint, "ok").inc(requests - errors)
    if errors:
        ENDPOINT_REQUESTS.labels(workspace, endpoint, "error").inc(errors)
    if prompt:
        ENDPOINT_TOKENS.labels(workspace, endpoint, "prompt").inc(prompt)
    if completion:
        ENDPOINT_TOKENS.labels(workspace, endpoint, "completion").inc(completion)


def observe_heartbeat_lag(sent_at: float) -> None:
    """Record the lag of a heartbeat the agent sent at `sent_at` (epoch s); 0 (not sent) is skipped."""
    if sent_at > 0:
        HEARTBEAT_LAG_SECONDS.observe(max(0.0, time.time() - sent_at))


def autoscaler_action(add: int, remove: int) -> str:
    """The `action` label of a decision that starts `add` and stops `remove` workers."""
    if add and remove:
        return "both"
    if add:
        return "scale_up"
    return "scale_down" if remove else "none"
