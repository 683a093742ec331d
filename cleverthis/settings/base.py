"""Control-plane settings, every value read from the environment with a local default."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from cleverthis.settings.database import database_url
from cleverthis.settings.env import (
    DEV_SECRET_KEY,
    database_from_url,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_map,
    env_rate,
    env_str,
    env_workspace_map,
    oidc_config_errors,
    refuse_weak_secret_key,
)
from kernel.client_address import check_trusted_proxies

BASE_DIR = Path(__file__).resolve().parent.parent.parent

# DEBUG is off unless asked for (DEBUG=1: development; `.ci/up` sets it). With DEBUG off the process refuses
# to start on a SECRET_KEY that is public (the development default below, an example's `change-me`) or weak.
DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", DEV_SECRET_KEY)
refuse_weak_secret_key(SECRET_KEY, debug=DEBUG)
# A stale or forged form: the product's page with the reason and a link back (not a bare "403 Forbidden").
CSRF_FAILURE_VIEW = "cleverthis.errors.csrf_failure"
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", ["http://127.0.0.1:8000", "http://localhost:8000"])

# Public URL of this control plane, used in join commands and install scripts.
CONTROL_PLANE_URL_EXPLICIT = env_str("CONTROL_PLANE_URL", "")
CONTROL_PLANE_URL = CONTROL_PLANE_URL_EXPLICIT or "http://127.0.0.1:8000"
# Where the agent sdist served at /agent/package.tar.gz is built (once per release).
# The tree the agent package is built from (pyproject.toml, README.md, agent/); empty: this checkout.
AGENT_PACKAGE_SOURCE_DIR = env_str("AGENT_PACKAGE_SOURCE_DIR", "")
AGENT_PACKAGE_CACHE_DIR = env_str("AGENT_PACKAGE_CACHE_DIR", "/tmp/cleverthis-agent-package")
# What nodes serve is proxied only on origins of its own, never on the control plane's (fleet.proxy.origins):
# endpoints at endpoint-<id>.<ENDPOINT_DOMAIN>, Serve deployments at serve-<id>.<ENDPOINT_DOMAIN>, Ray
# Dashboards at ray-<id>.<RAY_DASHBOARD_DOMAIN> (wildcard DNS and certificate; *.localhost needs none).
ENDPOINT_DOMAIN = env_str("ENDPOINT_DOMAIN", "endpoints.localhost")
RAY_DASHBOARD_DOMAIN = env_str("RAY_DASHBOARD_DOMAIN", "ray.localhost")
# Hosts Django answers: the control plane's (CONTROL_PLANE_URL), the node-origin domains (their hosts never
# reach Django: the proxy answers them, 404 for a name that is no node origin's), and local addresses.
_CONTROL_PLANE_HOST = (urlsplit(CONTROL_PLANE_URL).hostname or "127.0.0.1").lower()
ALLOWED_HOSTS = env_list(
    "ALLOWED_HOSTS",
    list(
        dict.fromkeys(
            [
                f"[{_CONTROL_PLANE_HOST}]" if ":" in _CONTROL_PLANE_HOST else _CONTROL_PLANE_HOST,
                "." + ENDPOINT_DOMAIN.lower().strip("."),
                "." + RAY_DASHBOARD_DOMAIN.lower().strip("."),
                "localhost",
                "127.0.0.1",
                "[::1]",
            ]
        )
    ),
)
# Ray releases a cluster can be created with (docker runtime); the first is the default. Images are
# RAY_IMAGE_TEMPLATE with {version} filled in (RAY_GPU_IMAGE_TEMPLATE on GPU nodes). The process runtime
# runs the Ray installed next to the agent: only RAY_PROCESS_VERSION (that Ray's version) is offered there.
RAY_VERSIONS = env_list("RAY_VERSIONS", ["2.9.0", "2.60.0"])
RAY_IMAGE_TEMPLATE = env_str("RAY_IMAGE_TEMPLATE", "rayproject/ray:{version}")
RAY_GPU_IMAGE_TEMPLATE = env_str("RAY_GPU_IMAGE_TEMPLATE", "rayproject/ray:{version}-gpu")
RAY_PROCESS_VERSION = env_str("RAY_PROCESS_VERSION", "2.60.0")
# The vLLM release paired with each Ray version whose node image can carry vLLM (`ray=vllm` items): the
# ranks of an endpoint served across a cluster run inside its Ray containers, with the image
# RAY_VLLM_IMAGE_TEMPLATE names ({version}: Ray's, {vllm}: vLLM's; RAY_VLLM_GPU_IMAGE_TEMPLATE on GPU nodes).
# A Ray version without a pair has no such image (Ray 2.9.0: see `.ci/ray-vllm-image`).
RAY_VLLM_VERSIONS = env_map("RAY_VLLM_VERSIONS", {"2.60.0": "0.32.0"})
RAY_VLLM_IMAGE_TEMPLATE = env_str("RAY_VLLM_IMAGE_TEMPLATE", "cleverthis/ray-vllm:{version}-vllm{vllm}")
RAY_VLLM_GPU_IMAGE_TEMPLATE = env_str("RAY_VLLM_GPU_IMAGE_TEMPLATE", "cleverthis/ray-vllm:{version}-vllm{vllm}-gpu")
# Scheme and port of those origins in the URLs the API shows ("" port: the scheme's default); redirects
# from the control plane keep the scheme and port the request came in with unless the scheme is set.
NODE_ORIGIN_SCHEME = env_str("NODE_ORIGIN_SCHEME", "")
NODE_ORIGIN_PORT = env_str("NODE_ORIGIN_PORT", "")
# A signed-in member reaches a node origin with a single-use ticket valid this long, exchanged for a
# host-only cookie on that origin valid this long.
ORIGIN_TICKET_MAX_AGE_S = env_int("ORIGIN_TICKET_MAX_AGE_S", 60)
ORIGIN_SESSION_MAX_AGE_S = env_int("ORIGIN_SESSION_MAX_AGE_S", 8 * 3600)
# Behind HTTPS, HTTPS_COOKIES=1 makes the session and CSRF cookies Secure and gives them the __Host- prefix,
# which browsers never let a subdomain set: a workload's script on a node origin that shares the control
# plane's parent domain then cannot plant ("toss") a session or CSRF cookie for the control plane.
HTTPS_COOKIES = env_bool("HTTPS_COOKIES", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS_COOKIES
SESSION_COOKIE_NAME = "__Host-sessionid" if HTTPS_COOKIES else "sessionid"
CSRF_COOKIE_NAME = "__Host-csrftoken" if HTTPS_COOKIES else "csrftoken"
# HSTS: behind HTTPS (HTTPS_COOKIES=1 says the deployment is served over TLS), every answer that came over
# https tells browsers to use nothing but https for this host for HSTS_SECONDS (a year; 0: no header).
# HSTS_INCLUDE_SUBDOMAINS=1 extends it to the host's subdomains (only when every one of them serves https).
SECURE_HSTS_SECONDS = env_int("HSTS_SECONDS", 365 * 24 * 3600 if HTTPS_COOKIES else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = False
# Key used to encrypt secrets at rest (CA key, ArgoCD tokens); defaults to one derived from SECRET_KEY.
FIELD_ENCRYPTION_KEY = env_str("FIELD_ENCRYPTION_KEY", "")
# A node whose last heartbeat is older than this many seconds is marked offline by the beat task.
NODE_OFFLINE_AFTER_S = env_int("NODE_OFFLINE_AFTER_S", 90)
# A node whose tunnel closed goes offline this many seconds later unless its agent reconnected meanwhile
# (rides through reconnects and deploys without an offline flap; a task scheduled at the close does it).
NODE_OFFLINE_GRACE_S = env_int("NODE_OFFLINE_GRACE_S", 10)
# Partition safety: when one beat pass finds more than this fraction of a cluster's nodes lost (and
# at least FLEET_PARTITION_MIN_NODES of them), the nodes are marked offline but automatic drains and
# rescheduling pause for FLEET_PARTITION_PAUSE_S seconds, with a cluster event. 1.0 disables it.
FLEET_PARTITION_THRESHOLD = env_float("FLEET_PARTITION_THRESHOLD", 0.5)
FLEET_PARTITION_MIN_NODES = env_int("FLEET_PARTITION_MIN_NODES", 3)
FLEET_PARTITION_PAUSE_S = env_int("FLEET_PARTITION_PAUSE_S", 900)
# A dispatch task that finds its command claimed this long ago but unacknowledged (its first run died
# between claim and send, and the broker redelivered it) sends the command again.
COMMAND_RESEND_AFTER_S = env_int("COMMAND_RESEND_AFTER_S", 30)
# The resend beat fails (code `undelivered`) a command its connected node never acknowledged after
# this many sends, instead of sending it again forever.
COMMAND_MAX_ATTEMPTS = env_int("COMMAND_MAX_ATTEMPTS", 5)

# The reverse proxies in front of web whose X-Forwarded-For / X-Forwarded-Proto are believed
# (kernel.client_address): addresses, networks (10.0.0.0/8) or host names (resolved again every
# TRUSTED_PROXIES_RESOLVE_S), comma-separated; empty (the default): none, the socket's peer is the client.
# The proxy must replace a client-sent X-Forwarded-For, never append to it (deploy/compose/haproxy.cfg).
TRUSTED_PROXIES = env_list("TRUSTED_PROXIES", [])
TRUSTED_PROXIES_RESOLVE_S = env_float("TRUSTED_PROXIES_RESOLVE_S", 30.0)
if _trusted_proxy_errors := check_trusted_proxies(TRUSTED_PROXIES):
    raise ImproperlyConfigured("TRUSTED_PROXIES: " + "; ".join(_trusted_proxy_errors))

# Request limits (count/period: s, min, hour, day), counted per client IP (kernel.client_address: the
# socket's peer, or what a TRUSTED_PROXIES proxy forwarded) in the cache. Over the limit: 429 with Retry-After.
AGENT_REGISTER_RATE = env_rate("AGENT_REGISTER_RATE", "30/min")  # POST /api/v1/agent/register
SIGN_IN_RATE = env_rate("SIGN_IN_RATE", "10/min")  # sign-in POSTs, per client IP and per username

# Agent tunnel timing (seconds).
AGENT_HEARTBEAT_INTERVAL_S = env_float("AGENT_HEARTBEAT_INTERVAL_S", 30.0)
AGENT_HELLO_TIMEOUT_S = env_float("AGENT_HELLO_TIMEOUT_S", 15.0)
# At most this many tunnels per process between their connect and their welcome (signatures, several
# queries each). Beyond it a new tunnel is answered at once with a Backoff: a reconnect storm of thousands
# of agents queues in the agents, instead of piling handshakes up in the process until they time out and
# are retried at once. The Backoff is derived from NODE_OFFLINE_GRACE_S (`fleet.tunnel.handshakes`): an
# agent told to wait is back, its jitter included, before its node would read offline.
AGENT_MAX_HANDSHAKES = env_int("AGENT_MAX_HANDSHAKES", 50)
AGENT_REVOCATION_RECHECK_S = env_float("AGENT_REVOCATION_RECHECK_S", 30.0)
# A tunnel renews its channel-layer group memberships (its node's group, the agents' group) on a heartbeat
# at least this long after the last renewal: Redis forgets a membership after channels_redis's
# group_expiry (a day) or when its keys are lost, and a command sent to the node would reach no one.
TUNNEL_GROUP_REFRESH_S = env_float("TUNNEL_GROUP_REFRESH_S", 60.0)
# A web process asked to stop (SIGTERM) drains first (`cleverthis.graceful`): /healthz answers 503 and new
# tunnels are refused at once; after WEB_DRAIN_LB_S (the load balancer's checks have seen it by then) each
# agent whose tunnel it holds is told to open a new one through the load balancer, the old tunnel closes
# once the new one is up and its streams ended; at WEB_DRAIN_DEADLINE_S whatever is left is closed and the
# server stops (its --timeout-graceful-shutdown is the same value: the web command; whole seconds).
WEB_DRAIN_DEADLINE_S = env_float("WEB_DRAIN_DEADLINE_S", 60.0)
WEB_DRAIN_LB_S = env_float("WEB_DRAIN_LB_S", 3.0)
# The peer listener of each web process (fleet.tunnel.peer_listener): a request that lands in another
# process than the one holding the node's tunnel opens its stream there, directly. It binds
# TUNNEL_PEER_BIND, port TUNNEL_PEER_PORT (0: any free one; otherwise the first free one of the
# TUNNEL_PEER_PORT_COUNT ports from there, one per web process of the machine), and is dialed at
# TUNNEL_PEER_ADVERTISE (default: the bind address; this host's address when binding 0.0.0.0). Every
# replica must reach every other one there (Kubernetes: the pod IP; compose: the service network).
TUNNEL_PEER_BIND = env_str("TUNNEL_PEER_BIND", "127.0.0.1")
TUNNEL_PEER_PORT = env_int("TUNNEL_PEER_PORT", 0)
TUNNEL_PEER_PORT_COUNT = env_int("TUNNEL_PEER_PORT_COUNT", 16)
TUNNEL_PEER_ADVERTISE = env_str("TUNNEL_PEER_ADVERTISE", "")
# An accepted peer connection must prove the peer key within this many seconds (the handshake is one round
# trip between replicas), and at most TUNNEL_PEER_MAX_PENDING connections of a process may be waiting to:
# more are closed at once. Before its proof a connection may send only handshake-sized frames.
TUNNEL_PEER_HANDSHAKE_TIMEOUT_S = env_float("TUNNEL_PEER_HANDSHAKE_TIMEOUT_S", 3.0)
TUNNEL_PEER_MAX_PENDING = env_int("TUNNEL_PEER_MAX_PENDING", 64)
# The oldest agent wire protocol accepted (default: one version behind this release, for rolling deploys).
# Older agents are refused with close code 4426 and a node event saying to re-run the install script.
AGENT_PROTOCOL_MIN = env_int("AGENT_PROTOCOL_MIN", 0)
# How long an updated agent has to connect before it rolls back to its previous version.
AGENT_UPDATE_ROLLBACK_S = env_float("AGENT_UPDATE_ROLLBACK_S", 120.0)

# Proxy to endpoints and Ray dashboards through the tunnel.
PROXY_DIAL_GRACE_S = env_float("PROXY_DIAL_GRACE_S", 10.0)  # retry opening a stream while an agent reconnects
PROXY_MAX_BODY_BYTES = env_int("PROXY_MAX_BODY_BYTES", 256 * 1024 * 1024)
PROXY_RESPONSE_TIMEOUT_S = env_float("PROXY_RESPONSE_TIMEOUT_S", 60.0)  # until the response head
PROXY_IDLE_TIMEOUT_S = env_float("PROXY_IDLE_TIMEOUT_S", 300.0)  # between response chunks
API_KEY_CACHE_S = env_float("API_KEY_CACHE_S", 0.5)  # how long a key's rights are cached per process
# Where the Celery workers reach the web processes to benchmark an endpoint (its requests carry the endpoint's
# origin as Host, so they take the path any client's do): CONTROL_PLANE_URL unless set.
BENCHMARK_TARGET_URL = env_str("BENCHMARK_TARGET_URL", "") or CONTROL_PLANE_URL
PROXY_ROUTE_CACHE_S = env_float("PROXY_ROUTE_CACHE_S", 2.0)  # how long an endpoint route is cached per process
# at most how often a process writes an endpoint's forwarded-request count and last-request time
ENDPOINT_REQUESTS_FLUSH_S = env_float("ENDPOINT_REQUESTS_FLUSH_S", 5.0)
# budgets' hard stops: how long each web process keeps its copy of the stopped workspaces and keys
BUDGET_STOPS_CACHE_S = env_float("BUDGET_STOPS_CACHE_S", 5.0)
# keys, routes and budget stops a web process's requests used within this long are re-read in the background
# before they go stale (fleet.proxy.warm_caches), so a request now and then waits for no query; 0: on demand
PROXY_KEEP_WARM_S = env_float("PROXY_KEEP_WARM_S", 60.0)
# A web process freezes what its start-up loaded out of the garbage collector's full passes (`cleverthis.warm`):
# off (0), a full pass walks the whole application (~200,000 objects) and stalls every stream it relays.
WEB_GC_FREEZE = env_bool("WEB_GC_FREEZE", True)
# Hosts a tenant-set URL (a budget's webhook) may name although they are not public (`kernel.outbound_urls`).
OUTBOUND_URL_ALLOWED_HOSTS = env_list("OUTBOUND_URL_ALLOWED_HOSTS", [])
# Per-replica load shared by the web processes (fleet.replica_load): each publishes its requests in flight
# and tokens served per replica every REPLICA_LOAD_PUBLISH_S to a Redis hash expiring REPLICA_LOAD_TTL_S
# later (a dead process's figures vanish then); tokens/s is each process's rate over REPLICA_LOAD_WINDOW_S.
REPLICA_LOAD_PUBLISH_S = env_float("REPLICA_LOAD_PUBLISH_S", 1.0)
REPLICA_LOAD_TTL_S = env_float("REPLICA_LOAD_TTL_S", 5.0)
REPLICA_LOAD_WINDOW_S = env_float("REPLICA_LOAD_WINDOW_S", 10.0)
# Admission (fleet.admission): per replica at most the endpoint's concurrency limit in flight; the rest wait in
# the endpoint's queue, at most ENDPOINT_QUEUE_DEPTH requests for at most ENDPOINT_QUEUE_WAIT_S each unless
# the endpoint sets its own; while any request waits, the shared figures refresh every ENDPOINT_QUEUE_REFRESH_S.
ENDPOINT_QUEUE_DEPTH = env_int("ENDPOINT_QUEUE_DEPTH", 1024)
ENDPOINT_QUEUE_WAIT_S = env_float("ENDPOINT_QUEUE_WAIT_S", 60.0)
ENDPOINT_QUEUE_REFRESH_S = env_float("ENDPOINT_QUEUE_REFRESH_S", 0.1)
# Routing policies (fleet.balancer, fleet.proxy.affinity): `session` and `prefix` send a key to a replica
# allowed up to (1 + ROUTING_EPSILON) x the mean load before it passes on; `prefix` hashes at most
# ROUTING_PREFIX_CHARS characters of the leading prompt text.
ROUTING_EPSILON = env_float("ROUTING_EPSILON", 0.25)
ROUTING_PREFIX_CHARS = env_int("ROUTING_PREFIX_CHARS", 8192)
# Usage metering of endpoint requests (fleet.usage): requests, errors, tokens and latency per workspace,
# endpoint and API key, noted in process memory and written as minute and hour rollups with one upsert at
# most every USAGE_FLUSH_S. USAGE_METERING=0 turns the proxy's part off (the benchmark compares both).
USAGE_METERING = env_bool("USAGE_METERING", True)
USAGE_FLUSH_S = env_float("USAGE_FLUSH_S", 5.0)
# Minute rollups are kept this many days (hour rollups stay); pruned by the minute's sampling task.
USAGE_MINUTE_RETENTION_DAYS = env_int("USAGE_MINUTE_RETENTION_DAYS", 3)
# A replica handed over (a rolling update, a draining node) leaves rotation once its replacement runs, and is
# stopped this many seconds later: the requests it still serves have that long to finish.
ENDPOINT_DRAIN_S = env_float("ENDPOINT_DRAIN_S", 30.0)
# An endpoint that scales to zero (min_replicas 0) is woken by its next request, which waits at most this many
# seconds for a replica to run (a model server may take minutes to load), then gets a 503 with Retry-After.
ENDPOINT_COLD_START_S = env_float("ENDPOINT_COLD_START_S", 300.0)
# The one switch for a distributed endpoint's ranks on a Ray cluster of the docker runtime: on, each rank's
# endpoint.start names its Ray node's container (`EndpointGroup.container`) so the agent runs the rank inside
# it; off (until the agents can), each rank runs as a process of its node's agent beside the Ray container.
ENDPOINT_GROUP_IN_RAY_CONTAINER = env_bool("ENDPOINT_GROUP_IN_RAY_CONTAINER", False)
# The ports a distributed endpoint's leader listens on for its followers (torch.distributed's master port): the
# first one no other live group led from the same node holds.
ENDPOINT_GROUP_PORTS = (29500, 29999)
# How often a waiting process re-reads a waking endpoint's route (one poller per endpoint per process).
ENDPOINT_COLD_START_POLL_S = env_float("ENDPOINT_COLD_START_POLL_S", 0.5)

# Prometheus metrics at /metrics (cleverthis.metrics_scrape): a scrape sends `Authorization: Bearer
# <METRICS_TOKEN>`; with no token set the endpoint refuses everyone (403).
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
# Every process on this machine (the web processes, Celery worker and beat) keeps its counters in files here
# (prometheus_client's multiprocess mode, set up by kernel.metrics); a scrape merges them. Empty it
# before the processes start (.ci/up does); one directory per machine.
PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", str(BASE_DIR / "var" / "metrics"))

INSTALLED_APPS = [
    "daphne",  # `manage.py runserver` serves ASGI with daphne (development); production runs uvicorn
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "guardian",
    "channels",
    "tenancy",
    "audit",
    "fleet",
    "raymgr",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "kernel.api.RejectNulQueryMiddleware",
]

ROOT_URLCONF = "cleverthis.urls"
ASGI_APPLICATION = "cleverthis.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "tenancy.context_processors.workspaces",
                "cleverthis.health.dispatch",
            ],
        },
    },
]

# DATABASE_URL names the database (CLEVERTHIS_DB_NAME only when it is unset; both, disagreeing: refused).
DATABASE_URL = database_url(os.environ)
# 0 = no pool. The ASGI entry point turns a pool on by default (cleverthis/asgi.py): there hundreds of
# tunnels make short ORM calls from a thread pool, and a new PostgreSQL connection per call (a backend
# fork each) costs more than the query. Prefork Celery workers keep plain per-process connections.
DATABASE_POOL_MAX_SIZE = env_int("DATABASE_POOL_MAX_SIZE", 0)
DATABASES = {"default": database_from_url(DATABASE_URL, pool_max_size=DATABASE_POOL_MAX_SIZE)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py 8 defaults socket_timeout to 5 s, the same as channels_redis's blocking BZPOPMIN in
            # receive(): an idle consumer's read then times out and the consumer (a tunnel!) crashes
            # with 1011. Keep the read timeout well above the blocking pop.
            # max_connections: redis-py refuses (does not queue) operations beyond its pool size, and
            # a thousand tunnels closing at once each clean up their groups at the same moment.
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": 30,
                    "socket_connect_timeout": 5,
                    "max_connections": env_int("CHANNELS_REDIS_MAX_CONNECTIONS", 1000),
                }
            ],
            "prefix": env_str("CHANNELS_PREFIX", "cleverthis:channels:"),
            "capacity": 1000,
            "expiry": 60,
        },
    }
}

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "cleverthis",
    }
}

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", REDIS_URL)
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A task whose worker died before acking (acks_late) is handed to another worker after this long;
# workers sweep for such tasks every interval x throttle seconds (kombu's defaults: 10 x 10).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT_S", 3600),
    "unacked_restore_interval": env_int("CELERY_UNACKED_RESTORE_INTERVAL_S", 10),
    "unacked_restore_throttle": env_int("CELERY_UNACKED_RESTORE_THROTTLE", 10),
}
# Losing the broker is never fatal: the worker reconnects, on start-up too, for as long as it takes
# (Celery's default gives up after 100 attempts). A broker lost mid-task lets running tasks finish
# (worker_cancel_long_running_tasks_on_connection_loss stays off): dispatch tasks are idempotent and
# beat re-sends what a lost broker dropped. The crash kombu had on that path: `cleverthis.kombu_fixes`.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
# Between reconnect attempts the worker waits 1, 2, 3 ... s up to this (Celery's own waits grow to 30 s).
CELERY_WORKER_CONSUMER = "cleverthis.celery:ReconnectingConsumer"
BROKER_RECONNECT_INTERVAL_MAX_S = env_float("BROKER_RECONNECT_INTERVAL_MAX_S", 5.0)
# The worker's consumer records a heartbeat this often; pages, /healthz and /metrics call dispatch
# stalled once the freshest one is older than WORKER_HEARTBEAT_STALE_S (`cleverthis.dispatch_health`).
WORKER_HEARTBEAT_INTERVAL_S = env_float("WORKER_HEARTBEAT_INTERVAL_S", 5.0)
WORKER_HEARTBEAT_STALE_S = env_float("WORKER_HEARTBEAT_STALE_S", 30.0)
CELERY_TASK_ROUTES = {
    "fleet.tasks.dispatch_*": {"queue": "dispatch"},
}
# Task modules outside `<app>.tasks` (autodiscovery only finds those).
CELERY_IMPORTS = ["fleet.workloads.tasks", "fleet.usage.tasks"]
CELERY_BEAT_SCHEDULE: dict[str, dict] = {
    "fleet-mark-lost-nodes-offline": {"task": "fleet.tasks.mark_lost_nodes_offline", "schedule": 15.0},
    "fleet-resend-stuck-commands": {"task": "fleet.tasks.resend_stuck_commands", "schedule": 30.0},
    "fleet-expire-join-tokens": {"task": "fleet.tasks.expire_join_tokens", "schedule": 3600.0},
    "fleet-drain-tick": {"task": "fleet.workload_tasks.drain_tick", "schedule": 10.0},
    "fleet-endpoints-heal-tick": {"task": "fleet.workload_tasks.endpoints_heal_tick", "schedule": 10.0},
    "fleet-endpoints-autoscale-tick": {"task": "fleet.workload_tasks.endpoints_autoscale_tick", "schedule": 15.0},
    "fleet-endpoints-idle-tick": {"task": "fleet.workload_tasks.endpoints_idle_tick", "schedule": 15.0},
    "raymgr-autoscale": {"task": "raymgr.tasks.autoscale", "schedule": float(env_int("RAY_AUTOSCALE_EVERY_S", 15))},
    "raymgr-workloads": {"task": "raymgr.tasks.poll_workloads", "schedule": 10.0},
    # the home page's charts: one sample a minute of nodes and Ray clusters by state, and utilization
    "fleet-history-sample": {"task": "cleverthis.tasks.sample_fleet_history", "schedule": 60.0},
    # usage: node-, GPU- and container-seconds of the minute that ended, per cluster (idempotent per minute)
    "fleet-usage-sample": {"task": "fleet.usage.tasks.sample_usage", "schedule": 60.0},
    # budgets: the month's spend per budget at the end of each minute; alerts at 80 % / 100 %; hard stops
    "fleet-usage-budgets": {"task": "fleet.usage.tasks.evaluate_budgets", "schedule": 60.0},
}
# Beat publishes through a broker restart (retries for ~15 s) and logs a failure in one line (`cleverthis.beat`).
CELERY_BEAT_SCHEDULER = "cleverthis.beat:BrokerTolerantScheduler"
# Where beat keeps its schedule state: in this checkout, never a path shared with other checkouts.
CELERY_BEAT_SCHEDULE_FILENAME = env_str("CELERY_BEAT_SCHEDULE_FILENAME", str(BASE_DIR / "var" / "celerybeat-schedule"))
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # django-guardian: no anonymous user row

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

# Single sign-on with OpenID Connect (mozilla-django-oidc, wrapped by tenancy.oidc): on when
# OIDC_CLIENT_ID is set; off, the sign-in page is the local password form alone. The provider's endpoints
# come from its discovery document (OIDC_ISSUER, or OIDC_DISCOVERY_URL for a non-standard location),
# fetched at the first sign-in (never at import), or each explicitly (OIDC_*_ENDPOINT, which also override
# discovered ones). Register <CONTROL_PLANE_URL>/accounts/oidc/callback/ as the client's redirect URI and
# <CONTROL_PLANE_URL>/accounts/login/ as its post-logout redirect URI. An incomplete or malformed
# configuration stops the process at start-up with the reason.
OIDC_RP_CLIENT_ID = env_str("OIDC_CLIENT_ID", "")
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
OIDC_RP_CLIENT_SECRET = env_str("OIDC_CLIENT_SECRET", "")
OIDC_ISSUER = env_str("OIDC_ISSUER", "").rstrip("/")
OIDC_DISCOVERY_URL = env_str(
    "OIDC_DISCOVERY_URL", f"{OIDC_ISSUER}/.well-known/openid-configuration" if OIDC_ISSUER else ""
)
OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("OIDC_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = env_str("OIDC_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = env_str("OIDC_USERINFO_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = env_str("OIDC_JWKS_ENDPOINT", "")
OIDC_OP_END_SESSION_ENDPOINT = env_str("OIDC_END_SESSION_ENDPOINT", "")  # RP-initiated logout, if offered
OIDC_RP_SCOPES = env_str("OIDC_SCOPES", "openid email profile groups")
OIDC_RP_SIGN_ALGO = env_str("OIDC_SIGN_ALGO", "RS256")
OIDC_DISPLAY_NAME = env_str("OIDC_DISPLAY_NAME", "single sign-on")  # the button: "Sign in with <name>"
# The claim that names a user (made unique if a local account has it already) and the claim whose values
# OIDC_WORKSPACE_MAP maps to workspace memberships, applied at every sign-in:
# `<claim value>=<workspace slug>:<role>,...` (e.g. `fleet-admins=acme:admin,fleet-users=acme:member`).
OIDC_USERNAME_CLAIM = env_str("OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
OIDC_WORKSPACE_MAP = env_workspace_map("OIDC_WORKSPACE_MAP")
OIDC_TIMEOUT = env_float("OIDC_TIMEOUT_S", 10.0)  # each request to the provider
OIDC_VERIFY_SSL = env_bool("OIDC_VERIFY_SSL", True)
# how the client authenticates at the token endpoint: HTTP Basic (client_secret_basic, OIDC's default) or,
# with 0, the secret in the form body (client_secret_post)
OIDC_TOKEN_USE_BASIC_AUTH = env_bool("OIDC_TOKEN_AUTH_BASIC", True)
OIDC_USE_PKCE = True
OIDC_STORE_ID_TOKEN = True  # the id_token_hint of RP-initiated logout
OIDC_CREATE_USER = True
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
if OIDC_ENABLED:
    _oidc_errors = oidc_config_errors(
        client_secret=OIDC_RP_CLIENT_SECRET,
        discovery_url=OIDC_DISCOVERY_URL,
        endpoints={
            "OIDC_AUTHORIZATION_ENDPOINT": OIDC_OP_AUTHORIZATION_ENDPOINT,
            "OIDC_TOKEN_ENDPOINT": OIDC_OP_TOKEN_ENDPOINT,
            "OIDC_USERINFO_ENDPOINT": OIDC_OP_USER_ENDPOINT,
            "OIDC_JWKS_ENDPOINT": OIDC_OP_JWKS_ENDPOINT,
            "OIDC_END_SESSION_ENDPOINT": OIDC_OP_END_SESSION_ENDPOINT,
        },
        sign_algo=OIDC_RP_SIGN_ALGO,
    )
    if _oidc_errors:
        raise ValueError("OIDC single sign-on is misconfigured: " + "; ".join(_oidc_errors))
    AUTHENTICATION_BACKENDS.append("tenancy.oidc.OidcBackend")

REST_FRAMEWORK = {
    "DEFAULT_PARSER_CLASSES": [
        "kernel.api.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "tenancy.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "kernel.schema.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "kernel.api.Pagination",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "CleverThis Compute Fleet API",
    "DESCRIPTION": "Compute clusters, nodes, commands and managed Ray clusters.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # one name per set of choices shared by several fields
    "ENUM_NAME_OVERRIDES": {
        "ClusterModeEnum": "fleet.models.Mode",
        "RayRuntimeEnum": "raymgr.models.RayRuntime",
        "JobStatusEnum": "raymgr.workloads.models.JobStatus",
    },
    # the API's documented bodies are JSON (forms are accepted too, for the browsable API)
    "PARSER_WHITELIST": ["kernel.api.JSONParser"],
    # the error bodies every operation refers to (kernel.schema)
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "kernel.schema.add_components"],
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
# The web processes serve /static/ themselves (Django's ASGI static files handler, whatever the server)
# unless a CDN or reverse proxy does it (set SERVE_STATIC=0 then).
SERVE_STATIC = env_bool("SERVE_STATIC", True)

DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 2 * 1024 * 1024)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
