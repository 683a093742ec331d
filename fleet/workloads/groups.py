"""The seam through which a distributed endpoint learns the nodes of its group (`services.endpoints.groups`).

The fleet app never imports raymgr (apps point one way); raymgr registers the source that answers for its
managed Ray clusters at start (`raymgr.endpoint_groups`): which fleet nodes host the cluster's Ray nodes (the
head first: the group's leader), the address the followers join the leader at, and whether every Ray node of
a running group is still alive, and what each Ray node already holds against the workspace's quotas (a rank on
it counts only what it holds beyond that: `services.endpoints.groups.group_start`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from fleet.models import Node


@dataclass(frozen=True)
class GroupMember:
    """One Ray node of the cluster as a rank of the group will use it."""

    ray_node: str  # the Ray node's id (raymgr's RayNode)
    node: Node  # the fleet node it runs on, where the rank's agent starts vLLM
    label: str  # in words, for events and pages ("head", "worker 1a2b3c4d")
    container: str  # its container where the rank runs inside it (a docker-runtime cluster serving vLLM), else ""
    # What the Ray node holds and its app already counts against the workspace's quotas (raymgr: `RayNode.req_*`):
    # the rank runs on those GPUs, so it is charged only what it holds beyond them.
    gpus: int = 0
    vram_mb: int = 0


@dataclass(frozen=True)
class GroupPlan:
    """Where a group runs now: its members, the head's first, and the leader's address the followers reach."""

    members: tuple[GroupMember, ...]
    master_addr: str


@dataclass(frozen=True)
class MemberState:
    """A Ray node's state as the pages show it next to its rank."""

    label: str
    status: str


class GroupSource(Protocol):
    def plan(self, *, ray_cluster_id: Any, workspace_id: Any) -> GroupPlan:
        """The cluster's members now; ValidationError on `ray_cluster` saying why it cannot host a group
        (not in the workspace, not running, a Ray node not running)."""

    def lost(self, *, ray_nodes: list[str]) -> str:
        """Why a group on these Ray nodes cannot run on ("" while every one runs)."""

    def states(self, *, ray_nodes: list[str]) -> dict[str, MemberState]:
        """Each Ray node's label and status, by id (missing ones left out)."""

    def held(self, *, ray_nodes: list[str]) -> set[str]:
        """The Ray nodes among these whose GPUs and VRAM their app still counts against the quotas (live ones;
        a failed, stopped or deleted Ray node holds nothing)."""


_sources: list[GroupSource] = []


def register_group_source(source: GroupSource) -> None:
    """Answer for managed Ray clusters (raymgr, at start); the last registered wins (idempotent)."""
    _sources[:] = [source]


def group_source() -> GroupSource:
    """The registered source; RuntimeError when none is (raymgr not installed)."""
    if not _sources:
        raise RuntimeError("no source of endpoint groups is registered (is raymgr installed?)")
    return _sources[0]
