"""Audit fixtures: the fleet's registered nodes, and a Viewer of the workspace."""

from __future__ import annotations

import pytest

from tests.fleet.conftest import cluster, register_node  # noqa: F401  (fixtures)


@pytest.fixture
def viewer(workspace, member_of):
    return member_of(workspace, "viewer")
