"""Join tokens and node registration through the service: single use, expiry, cluster binding."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.utils import timezone

from fleet import ca, services
from fleet.exceptions import JoinTokenRejected
from fleet.models import JoinToken, Node, NodeCertificate, NodeEvent, NodeStatus
from tests.fleet.conftest import facts_dict, make_csr_pem, make_key

pytestmark = pytest.mark.django_db


def test_token_format_hash_and_expiry(cluster, owner):
    token, raw = services.join_token_create(cluster=cluster, actor=owner)
    assert raw.startswith("ct_node_")
    assert len(raw) == len("ct_node_") + 43  # 32 bytes, urlsafe base64 without padding
    assert token.token_hash == services.hash_join_token(raw) != raw
    assert not JoinToken.objects.filter(token_hash=raw).exists()
    assert dt.timedelta(hours=23, minutes=59) < token.expires_at - timezone.now() <= dt.timedelta(hours=24)
    assert services.join_command(raw) == f"curl -fsSL http://127.0.0.1:8000/agent/install.sh | CLUSTER_TOKEN={raw} sh"


def test_only_operators_mint_tokens(cluster, workspace, member_of):
    with pytest.raises(PermissionDenied):
        services.join_token_create(cluster=cluster, actor=member_of(workspace, "member"))


def test_register_creates_node_named_after_host_with_certificate(cluster, owner):
    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    node, cert_pem = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict())
    assert node.cluster == cluster
    assert node.name == node.hostname == "gpu-box-1"
    assert node.status == NodeStatus.OFFLINE
    assert not node.connected
    assert (node.cpu_count, node.memory_total_mb, node.gpu_model, node.gpu_count, node.vram_total_mb) == (
        16,
        64000,
        "NVIDIA H100",
        1,
        80000,
    )
    assert ca.verify_node_certificate(cert_pem) == node.id
    assert NodeCertificate.objects.get(node=node).certificate_pem == cert_pem
    token = JoinToken.objects.get()
    assert token.used_at is not None
    assert token.node_id == node.id
    assert NodeEvent.objects.filter(node=node, kind="registered").exists()


def test_reused_token_is_refused_and_leaves_no_node(cluster, owner):
    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict())
    with pytest.raises(JoinTokenRejected, match="already been used") as info:
        services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict("second"))
    assert info.value.code == "token_used"
    assert list(Node.objects.values_list("hostname", flat=True)) == ["gpu-box-1"]


def test_expired_token_is_refused(cluster, owner):
    token, raw = services.join_token_create(cluster=cluster, actor=owner)
    JoinToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    with pytest.raises(JoinTokenRejected, match="expired"):
        services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict())
    assert not Node.objects.exists()


def test_token_of_another_cluster_is_refused(cluster, other_cluster, owner):
    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    with pytest.raises(JoinTokenRejected, match="another cluster"):
        services.node_register(
            token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict(), cluster_id=other_cluster.pk
        )
    assert not Node.objects.exists()
    assert JoinToken.objects.get().used_at is None


def test_unknown_token_is_refused():
    with pytest.raises(JoinTokenRejected, match="Unknown"):
        services.node_register(token="ct_node_nope", csr_pem=make_csr_pem(make_key()), facts=facts_dict())


def test_bad_csr_rolls_back_the_token(cluster, owner):
    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    with pytest.raises(ValidationError):
        services.node_register(token=raw, csr_pem="garbage", facts=facts_dict())
    assert not Node.objects.exists()
    assert JoinToken.objects.get().used_at is None  # still usable


def test_bad_facts_are_field_errors(cluster, owner):
    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    with pytest.raises(ValidationError) as info:
        services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts={"hostname": 5})
    assert "facts" in info.value.message_dict
    with pytest.raises(ValidationError) as info:
        services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict("h" * 300))
    assert "facts.hostname" in info.value.message_dict
    assert JoinToken.objects.get().used_at is None


@pytest.mark.django_db(transaction=True)
def test_token_is_single_use_under_a_real_race(owner, workspace):
    cluster = services.cluster_create(actor=owner, workspace=workspace, name="race")
    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    csrs = [make_csr_pem(make_key()) for _ in range(4)]
    barrier = threading.Barrier(len(csrs))
    outcomes: list[str] = []

    def register(i: int) -> None:
        try:
            barrier.wait()
            services.node_register(token=raw, csr_pem=csrs[i], facts=facts_dict(f"host-{i}"))
            outcomes.append("ok")
        except JoinTokenRejected as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=register, args=(i,)) for i in range(len(csrs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok", "token_used", "token_used", "token_used"]
    assert Node.objects.filter(cluster=cluster).count() == 1


def test_expire_join_tokens_deletes_only_expired_unused(cluster, owner):
    from fleet.tasks import expire_join_tokens

    fresh, _ = services.join_token_create(cluster=cluster, actor=owner)
    old, _ = services.join_token_create(cluster=cluster, actor=owner)
    used, raw = services.join_token_create(cluster=cluster, actor=owner)
    services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict())
    past = timezone.now() - dt.timedelta(hours=1)
    JoinToken.objects.filter(pk__in=[old.pk, used.pk]).update(expires_at=past)
    assert expire_join_tokens() == 1
    assert set(JoinToken.objects.values_list("pk", flat=True)) == {fresh.pk, used.pk}
