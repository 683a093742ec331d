"""Shared fixtures: users in workspaces with each role, API clients signed in as them.

An event loop whose shutdown cannot cancel a task fails that test with the task and where it waits,
instead of hanging until the pytest timeout (`tests.support.loop_guard`). At the end of the session it
removes what the session's control planes wrote outside the test
database: their keys in the test Redis database and the session's run directory (Prometheus files,
the beat schedule; see cleverthis/settings/test.py).
"""

from __future__ import annotations

import resource
import shutil
from collections.abc import Callable

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from cleverthis.dispatch_health import HEARTBEATS_KEY
from fleet import metrics_history, replica_load
from fleet.proxy import rate_limits
from fleet.usage import meter as usage_meter
from kernel import timeseries
from tenancy import services as tenancy_services
from tenancy.models import Role, Workspace
from tests.support import environment, loop_guard

User = get_user_model()

# Keys the control plane and Celery write in the test Redis database.
_CELERY_QUEUES = ("default", "dispatch", "celery")
TEST_REDIS_PATTERNS = (
    f"{settings.CACHES['default']['KEY_PREFIX']}:*",  # cache: rate-limit counters, tickets
    f"{settings.CHANNEL_LAYERS['default']['CONFIG']['prefix']}*",  # channel layer: groups, channels
    f"{metrics_history.KEY_PREFIX}*",  # nodes' utilization history
    f"{timeseries.KEY_PREFIX}*",  # the home page's per-minute rollups
    f"{rate_limits.PREFIX}*",  # API keys' rate-limit counters
    replica_load.PROCS_KEY,  # the web processes publishing per-replica load (fleet.replica_load)
    f"{replica_load.PROC_PREFIX}*",  # and their snapshots
    "celery-task-meta-*",  # Celery results
    HEARTBEATS_KEY,  # the workers' heartbeats
    "_kombu.*",  # Celery queue bindings
    "unacked*",  # Celery messages taken but not acknowledged, and their index
    *_CELERY_QUEUES,
    *(f"{queue}\x06\x16*" for queue in _CELERY_QUEUES),  # queues of other priorities
)


def pytest_configure(config: pytest.Config) -> None:
    loop_guard.install()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked with `environment.needs(...)`: skipped (or failed on CI) when what they need is absent."""
    environment.check_marks(item)


def pytest_report_header(config: pytest.Config) -> str:
    """The limits the processes and containers this session starts inherit (a container cannot exceed them)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    return f"open files (soft/hard): {nofile[0]}/{nofile[1]}; processes: {nproc[0]}/{nproc[1]}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Delete the session's Redis keys and its run directory (every test's processes have stopped)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        for pattern in TEST_REDIS_PATTERNS:
            keys = list(client.scan_iter(match=pattern, count=1000))
            for start in range(0, len(keys), 1000):
                client.delete(*keys[start : start + 1000])
    except redis.RedisError as exc:  # Redis down: nothing of ours to clean there
        print(f"test Redis clean-up skipped: {exc}")
    finally:
        client.close()
    if getattr(settings, "TEST_RUN_DIR_OWNED", False):
        shutil.rmtree(settings.TEST_RUN_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _usage_noted_in_memory_is_dropped():
    """Usage a test's proxied requests noted in this process and did not flush dies with the test (its
    database rows are gone, and the next test must not find them)."""
    yield
    usage_meter.discard()
    replica_load.discard()


@pytest.fixture
def make_user(db: None) -> Callable[..., object]:
    """Factory for users with a known password."""

    def make(username: str, **extra: object) -> object:
        return User.objects.create_user(username=username, password="pw-" + username, **extra)

    return make


@pytest.fixture
def owner(make_user: Callable[..., object]) -> object:
    return make_user("owner")


@pytest.fixture
def workspace(owner: object) -> Workspace:
    return tenancy_services.workspace_create(name="Acme", owner=owner)


@pytest.fixture
def other_workspace(make_user: Callable[..., object]) -> Workspace:
    """A workspace none of the `workspace` members belong to."""
    return tenancy_services.workspace_create(name="Globex", owner=make_user("globex-owner"))


@pytest.fixture
def member_of(make_user: Callable[..., object]) -> Callable[[Workspace, str], object]:
    """Factory: a new user holding `role` in `workspace`."""

    def make(workspace: Workspace, role: str) -> object:
        user = make_user(f"{role}-{workspace.slug}")
        tenancy_services.membership_set(workspace=workspace, user=user, role=Role(role))
        return user

    return make


@pytest.fixture
def api_client_for() -> Callable[[object], APIClient]:
    """Factory: an APIClient authenticated as `user`."""

    def make(user: object) -> APIClient:
        client = APIClient()
        client.force_authenticate(user=user)
        return client

    return make
