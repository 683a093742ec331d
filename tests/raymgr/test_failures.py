"""Failure reasons of Ray clusters in the product's words, on the cluster page, never a stack trace."""

from __future__ import annotations

import pytest
from django.test import Client

from raymgr.failures import failure_text, one_line
from raymgr.models import RayCluster
from tests.raymgr.conftest import finish, last_command

pytestmark = pytest.mark.django_db

TRACEBACK = """ray start exited with 1: Traceback (most recent call last):
  File "/opt/ray/lib/python3.11/site-packages/ray/scripts/scripts.py", line 790, in start
    node = ray._private.node.Node(
  File "/opt/ray/lib/python3.11/site-packages/ray/_private/node.py", line 313, in __init__
    self.start_ray_processes()
OSError: [Errno 98] Address already in use
"""


@pytest.mark.parametrize(
    ("code", "message", "title"),
    [
        ("image_pull_failed", "pulling 127.0.0.1:5790/ray:2.9.0 failed: connection refused", "Image pull failure"),
        ("registry_auth_failed", "pulling x failed: unauthorized", "Image pull failure"),
        ("conflict", "port 8265 is already in use on cpu-1", "Port conflict"),
        ("insufficient_memory", "the Ray head container ran out of memory (limit 256m)", "Insufficient memory"),
        ("docker_unavailable", "the container engine is not answering: connection refused", "Container engine"),
    ],
)
def test_a_failed_head_start_shows_the_documented_reason_on_the_cluster_page(
    owner, compute, add_node, make_ray, code, message, title
):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    finish(last_command("ray.head.start", cluster_id=str(cluster.pk)), ok=False, code=code, message=message)
    cluster = RayCluster.objects.get(pk=cluster.pk)
    assert cluster.status == "failed"
    assert cluster.failure_reason.startswith(f"The head failed to start on cpu-1: {title}")
    browser = Client()
    browser.force_login(owner)
    page = browser.get(f"/ray/clusters/{cluster.pk}/").content.decode()
    summary = browser.get(f"/ray/clusters/{cluster.pk}/?tab=summary", HTTP_HX_REQUEST="true").content.decode()
    assert title in page + summary


def test_a_traceback_never_reaches_the_page(owner, compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    finish(last_command("ray.head.start", cluster_id=str(cluster.pk)), ok=False, code="internal", message=TRACEBACK)
    cluster = RayCluster.objects.get(pk=cluster.pk)
    assert "Traceback" not in cluster.failure_reason
    assert 'File "' not in cluster.failure_reason
    assert cluster.failure_reason.endswith("OSError: [Errno 98] Address already in use")


def test_failure_text_words():
    # The advice names the real cause (something listens on the port), not draining the node.
    text = failure_text("conflict", "port 6379 is already in use on a")
    assert text.startswith("Port conflict: port 6379 is already in use on a. Another program on the node listens")
    assert "still stopping" in text
    assert "Drain the node" not in text
    assert failure_text("conflict", "Ray refused the drain: busy") == "conflict: Ray refused the drain: busy"
    assert failure_text("insufficient_memory", "needs 4096 MB").startswith("Insufficient memory: needs 4096 MB.")
    assert one_line("x" * 500).endswith("…")
    assert len(one_line("x" * 500)) == 300
