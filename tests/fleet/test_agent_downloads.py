"""The control plane serves the install script (with its own URL baked in) and the agent package."""

from __future__ import annotations

import tarfile

import pytest


@pytest.mark.django_db
def test_install_script_carries_the_control_plane_url(client, settings):
    settings.CONTROL_PLANE_URL_EXPLICIT = ""
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "fleet.example.com"]
    response = client.get("/agent/install.sh", HTTP_HOST="fleet.example.com")
    assert response.status_code == 200
    body = response.content.decode()
    assert body.startswith("#!/bin/sh")
    assert "http://fleet.example.com" in body
    assert "__CONTROL_PLANE_URL__" not in body


@pytest.mark.django_db
def test_configured_control_plane_url_wins(client, settings):
    settings.CONTROL_PLANE_URL_EXPLICIT = "https://fleet.internal"
    assert "https://fleet.internal" in client.get("/agent/install.sh").content.decode()


@pytest.mark.django_db
def test_agent_package_is_an_sdist_of_the_agent(client, settings, tmp_path):
    settings.AGENT_PACKAGE_CACHE_DIR = str(tmp_path)
    response = client.get("/agent/package.tar.gz")
    assert response.status_code == 200
    path = tmp_path / "downloaded.tar.gz"
    path.write_bytes(b"".join(response.streaming_content))
    with tarfile.open(path) as archive:
        names = archive.getnames()
    for module in ("agent/transport/tunnel.py", "agent/ray/process_runtime.py", "agent/workloads/models.py"):
        assert any(name.endswith(module) for name in names), module
    for module in ("agent/protocol/__init__.py", "agent/protocol/frames.py", "agent/protocol/codec.py"):
        assert any(name.endswith(module) for name in names), module
    assert not any("/fleet/" in name for name in names)
