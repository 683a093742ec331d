"""Fleet fixtures: clusters, real key pairs and CSRs, registered nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from agent import protocol
from fleet import services
from fleet.models import ComputeCluster, Node, NodeStatus


def make_key(kind: str = "ec") -> Any:
    """A fresh private key as an agent would generate it."""
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def make_csr_pem(key: Any, cn: str = "agent") -> str:
    """A CSR signed by `key`."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode("ascii")


def facts_dict(hostname: str = "gpu-box-1", **extra: Any) -> dict[str, Any]:
    base = {
        "hostname": hostname,
        "os": "Linux 6.8",
        "arch": "x86_64",
        "cpu_count": 16,
        "memory_total_mb": 64000,
        "agent_version": "0.1.0",
        "gpus": [{"index": 0, "name": "NVIDIA H100", "uuid": "GPU-1", "memory_total_mb": 80000, "memory_used_mb": 100}],
    }
    base.update(extra)
    return base


@pytest.fixture
def cluster(owner, workspace) -> ComputeCluster:
    return services.cluster_create(actor=owner, workspace=workspace, name="prod", mode="standalone")


@pytest.fixture
def other_cluster(other_workspace) -> ComputeCluster:
    owner = other_workspace.memberships.get().user
    return services.cluster_create(actor=owner, workspace=other_workspace, name="theirs")


@pytest.fixture
def register_node(db) -> Callable[..., Node]:
    """Factory: a node registered through the real join-token + CSR flow, optionally set online."""

    def make(cluster: ComputeCluster, hostname: str = "gpu-box-1", *, online: bool = True) -> Node:
        owner = cluster.workspace.memberships.filter(role="owner").first().user
        _, raw = services.join_token_create(cluster=cluster, actor=owner)
        node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict(hostname))
        if online:
            services.node_connected(
                node=node,
                facts=protocol.from_dict(protocol.HostFacts, facts_dict(hostname), where="facts"),
                inventory=protocol.Inventory(),
            )
            node.refresh_from_db()
            assert node.status == NodeStatus.ONLINE
        return node

    return make


@pytest.fixture
def node(cluster, register_node) -> Node:
    return register_node(cluster)
