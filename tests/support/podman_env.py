"""The podman CLI's environment for tests: the storage and configuration `.ci/podman-setup` made.

That containers.conf gives every container the open-file and process limits `.ci/podman-setup`'s shell
could grant. runc cannot set a container's limit above the hard limit of the process that starts it (the
podman CLI, or a Podman service a test starts), so a test process whose own hard limit is lower first
raises it where it may (root) and otherwise gets a copy of the file with its own limits.
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
from pathlib import Path

from tests.agent.executors.podman import STATE_DIR as PODMAN_DIR

LIMITS = {"nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC}


def podman_env() -> dict[str, str]:
    """This process's environment with the podman configuration `.ci/podman-setup` made, fitted to it."""
    return {
        **os.environ,
        "CONTAINERS_CONF": str(containers_conf()),
        "CONTAINERS_STORAGE_CONF": str(PODMAN_DIR / "storage.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(PODMAN_DIR / "registries.conf"),
    }


def containers_conf() -> Path:
    """`.ci/podman-setup`'s containers.conf, or a copy whose limits this process's hard limits allow."""
    conf = PODMAN_DIR / "containers.conf"
    if not conf.exists():
        return conf
    text = conf.read_text()
    fitted = text
    for name, limit in LIMITS.items():
        found = re.search(rf'"{name}=(\d+):(\d+)"', text)
        if found is None:
            continue
        allowed = hard_limit_up_to(limit, int(found[2]))
        if allowed < int(found[2]):
            fitted = fitted.replace(found[0], f'"{name}={min(int(found[1]), allowed)}:{allowed}"')
    if fitted == text:
        return conf
    copy = PODMAN_DIR / f"containers-{hashlib.sha256(fitted.encode()).hexdigest()[:12]}.conf"
    if not copy.exists():
        partial = copy.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(fitted)
        partial.replace(copy)
    return copy


def hard_limit_up_to(limit: int, wanted: int) -> int:
    """This process's hard `limit`, raised to `wanted` where it is lower and may be raised; the result."""
    soft, hard = resource.getrlimit(limit)
    if hard == resource.RLIM_INFINITY or hard >= wanted:
        return wanted
    try:
        resource.setrlimit(limit, (soft, wanted))
    except (ValueError, OSError):
        return hard
    return wanted
