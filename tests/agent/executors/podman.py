"""Where the Podman Docker-compatible socket started by `.ci/podman-setup` lives (tests skip without it)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.environment import missing

STATE_DIR = Path(os.environ.get("CLEVERTHIS_PODMAN_DIR", "/var/tmp/cleverthis-podman"))
TEST_IMAGE = "localhost/busybox:test"
VOLUME_IMAGE = "localhost/busybox-vol:test"  # declares VOLUME /data


def podman_url() -> str | None:
    """``unix://<socket>`` when the Podman service socket exists, else None."""
    marker = STATE_DIR / "socket-path"
    sock = Path(marker.read_text().strip()) if marker.exists() else STATE_DIR / "podman.sock"
    return f"unix://{sock}" if sock.is_socket() else None


def registry_address() -> str:
    """The loopback registry address Podman treats as insecure (plain HTTP), from .ci/podman-setup."""
    marker = STATE_DIR / "test-registry"
    return marker.read_text().strip() if marker.exists() else "127.0.0.1:5790"


def require_podman() -> str:
    """The socket URL, or skip the test with the reason."""
    url = podman_url()
    if url is None:
        missing(f"no Podman socket under {STATE_DIR}", "run .ci/podman-setup (as root) to run these tests")
    return url
