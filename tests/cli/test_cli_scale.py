"""`ctfleet get nodes` with 10,000 nodes against a live control plane: every node is printed once, the
first page as soon as it arrives and the rest streamed after it (the table's header and first rows come
before the last page is fetched). Prints the times it saw; asserts no wall-clock figure."""

from __future__ import annotations

import subprocess
import time

import pytest

from fleet.models import Node
from tests.cli.conftest import CTFLEET
from tests.support.processes import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NODES = 10_000


def test_get_nodes_prints_its_first_page_then_streams_ten_thousand(control_plane, cluster, api_key, ctfleet):
    _, raw = api_key
    Node.objects.bulk_create(
        [Node(cluster=cluster, name=f"n{i:05d}", hostname=f"n{i:05d}") for i in range(NODES)], batch_size=2000
    )
    env = {**ctfleet.env, "CTFLEET_URL": control_plane.url, "CTFLEET_API_KEY": raw}
    # a control plane in service is warm: its first request (loading URLs, views, serializers) is not timed
    assert ctfleet("get", "workspaces", env=env).code == 0
    started = time.monotonic()
    proc = subprocess.Popen(
        [CTFLEET, "get", "nodes"], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        header = proc.stdout.readline()
        first_row = proc.stdout.readline()
        first_at = time.monotonic() - started
        rest = proc.stdout.readlines()
        code = proc.wait(120)
        all_at = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert code == 0, proc.stderr.read()
    assert header.split()[:2] == ["NAME", "STATUS"]
    names = [line.split()[0] for line in [first_row, *rest]]
    assert len(names) == NODES
    assert set(names) == {f"n{i:05d}" for i in range(NODES)}
    print(f"\nget nodes, {NODES} nodes: first row after {first_at:.2f} s, all after {all_at:.2f} s")
