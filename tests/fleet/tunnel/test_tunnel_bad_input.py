"""Bad input on the agent tunnel: malformed and oversized frames, forged and revoked certificates, bad tokens.

The consumer is driven through the real ASGI application (`cleverthis.asgi.application`, path
/agent/tunnel) with channels' WebsocketCommunicator over the real Redis channel layer and PostgreSQL;
two tests do the same against a real server, uvicorn (production) and daphne (development). A bad frame
must close only its own socket, with close code 4400 and a reason (the server's own message limit: 1009);
an authentication failure closes with 4401, a revoked certificate with 4403. The reason reaches the peer
in the close frame (`cleverthis.daphne_fixes`, `cleverthis.uvicorn_fixes`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import uuid
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.utils import timezone
from rest_framework.test import APIClient

from agent import identity
from agent import protocol as p
from cleverthis.asgi import application
from fleet import ca, services
from fleet.models import Command, JoinToken, Node, NodeEvent
from fleet.tunnel.consumer import CLOSE_PROTOCOL_ERROR, CLOSE_REVOKED, CLOSE_UNAUTHORIZED, without_nul
from tests.support.processes import BOTH_SERVERS

pytestmark = pytest.mark.django_db(transaction=True)

FACTS = p.HostFacts(hostname="bad-input", cpu_count=2, memory_total_mb=1024)


@dataclass
class Identity:
    """What an agent holds after `agent join`: node id, key, certificate."""

    node_id: str
    key: ec.EllipticCurvePrivateKey
    certificate_pem: str


def _register(cluster, owner, hostname: str = "bad-input") -> Identity:
    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    key = identity.generate_key()
    node, cert = services.node_register(
        token=raw, csr_pem=identity.build_csr(key, hostname), facts=replace(FACTS, hostname=hostname)
    )
    return Identity(str(node.pk), key, cert)


@pytest.fixture
def cluster(owner, workspace):
    return services.cluster_create(actor=owner, workspace=workspace, name="tunnel-bad-input")


@pytest.fixture
def node_identity(cluster, owner) -> Identity:
    return _register(cluster, owner)


async def _close_of(comm: WebsocketCommunicator, timeout: float = 5) -> dict[str, Any]:
    """Read until the server closes; return the close message."""
    while True:
        message = await comm.receive_output(timeout)
        if message["type"] == "websocket.close":
            return message


async def _frame(comm: WebsocketCommunicator, timeout: float = 5) -> p.Frame:
    message = await comm.receive_output(timeout)
    assert message["type"] == "websocket.send", message
    return p.decode(message["text"])


async def _open(agent_nonce: str = "n0nce-0f-the-agent") -> tuple[WebsocketCommunicator, p.Challenge]:
    comm = WebsocketCommunicator(application, f"/agent/tunnel?{urlencode({'agent_nonce': agent_nonce})}")
    connected, _ = await comm.connect()
    assert connected
    challenge = await _frame(comm)
    assert isinstance(challenge, p.Challenge)
    return comm, challenge


def _hello(ident: Identity, challenge: p.Challenge, **overrides: Any) -> p.Hello:
    fields = {
        "node_id": ident.node_id,
        "certificate_pem": ident.certificate_pem,
        "signature_b64": identity.sign_nonce(ident.key, challenge.nonce),
        "facts": FACTS,
        "v": challenge.v,  # the tunnel's version, chosen by the control plane (no ?protocol=: version 1)
    }
    return p.Hello(**{**fields, **overrides})


async def _authenticated(ident: Identity) -> WebsocketCommunicator:
    comm, challenge = await _open()
    await comm.send_to(text_data=p.encode(_hello(ident, challenge)))
    welcome = await _frame(comm)
    assert isinstance(welcome, p.Welcome), welcome
    return comm


async def _heartbeat_answered(comm: WebsocketCommunicator) -> bool:
    await comm.send_to(text_data=p.encode(p.Heartbeat(cpu_percent=1.0, memory_percent=2.0)))
    while True:
        frame = await _frame(comm)
        if isinstance(frame, p.HeartbeatAck):
            return True


def _raw(frame_type: str, **body: Any) -> str:
    return json.dumps({"v": p.PROTOCOL_VERSION, "type": frame_type, **body})


def _nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = {"a": value}
    return value


MALFORMED = {
    "not json": "{nope",
    "a list": "[1, 2]",
    "wrong version": json.dumps({"v": 999, "type": "heartbeat", "cpu_percent": 1, "memory_percent": 1}),
    "unknown type": _raw("launch_missiles"),
    "missing field": _raw("heartbeat", cpu_percent=1.0),
    "wrong field type": _raw("heartbeat", cpu_percent="hot", memory_percent=1.0),
    "unknown field": _raw("heartbeat", cpu_percent=1.0, memory_percent=1.0, evil=True),
    "oversized": _raw("progress", command_id=str(uuid.uuid4()), message="x" * (p.MAX_FRAME_BYTES + 10)),
    "binary garbage": b"\xff\xfe\x00\x01",
    # protocol 3 stream batches: a chunk header cut short, a chunk longer than the frame, no chunk at all
    "stream batch cut short": bytes([p.BATCH_MAGIC, 3]) + (1).to_bytes(8, "big") + b"\x00",
    "stream batch past its end": bytes([p.BATCH_MAGIC, 3]) + (1).to_bytes(8, "big") + (9).to_bytes(4, "big") + b"x",
    "empty stream batch": bytes([p.BATCH_MAGIC, 3]),
    # past the interpreter's recursion limit (json.loads raised RecursionError: a 1011 and a traceback)
    "deeply nested": "[" * 500_000,
    "nested past the protocol's limit": _raw(
        "progress", command_id=str(uuid.uuid4()), message="m", data=_nested(p.MAX_NESTING)
    ),
}


# --------------------------------------------------------------------------------------------------
# malformed and oversized frames


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_frame_before_hello_closes_with_4400(case):
    comm, _ = await _open()
    raw = MALFORMED[case]
    await (comm.send_to(bytes_data=raw) if isinstance(raw, bytes) else comm.send_to(text_data=raw))
    closed = await _close_of(comm)
    assert closed["code"] == CLOSE_PROTOCOL_ERROR
    assert closed["reason"]
    await comm.disconnect()


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_frame_closes_only_that_socket(case, cluster, owner):
    bad_ident, good_ident = await sync_to_async(lambda: (_register(cluster, owner, "bad"), _register(cluster, owner)))()
    good = await _authenticated(good_ident)
    bad = await _authenticated(bad_ident)
    raw = MALFORMED[case]
    await (bad.send_to(bytes_data=raw) if isinstance(raw, bytes) else bad.send_to(text_data=raw))
    closed = await _close_of(bad)
    assert closed["code"] == CLOSE_PROTOCOL_ERROR, closed
    assert closed["reason"]
    # the other tunnel is untouched and still served
    assert await _heartbeat_answered(good)
    assert await sync_to_async(lambda: Node.objects.get(pk=good_ident.node_id).connected)()
    await bad.disconnect()
    await good.disconnect()
    # the broken socket's node is recorded as disconnected, like any closed tunnel
    assert not await sync_to_async(lambda: Node.objects.get(pk=bad_ident.node_id).connected)()


def _bad_content_frames(node_id: str, foreign_command_id: str) -> dict[str, str]:
    """Frames that parse but carry values the database or the services cannot take."""
    return {
        "ack of a non-uuid command": _raw("ack", command_id="not-a-uuid"),
        "result of a non-uuid command": _raw("result", command_id="../../etc", data={}),
        "progress of a non-uuid command": _raw("progress", command_id="x", message="m"),
        "error of a non-uuid command": _raw("error", command_id="x", code="internal", message="m"),
        "heartbeat beyond bigint": _raw("heartbeat", cpu_percent=1.0, memory_percent=1.0, memory_total_mb=10**30),
        "heartbeat with NaN": _raw("heartbeat", cpu_percent=float("nan"), memory_percent=float("inf")),
        "progress with NaN data": _raw(
            "progress", command_id=foreign_command_id, message="m", data={"x": float("nan")}
        ),
    }


async def _download_queued(owner, cluster, node_id) -> Command:  # type: ignore[no-untyped-def]
    """A `model.download` dispatched to the node `node_id` (the command the frames below speak of)."""

    def dispatch() -> Command:
        (command,) = services.command_dispatch(
            actor=owner,
            cluster=cluster,
            command_type="model.download",
            payload={"model_id": "acme/tiny"},
            node=Node.objects.get(pk=node_id),
        )
        return command

    return await sync_to_async(dispatch)()


@pytest.mark.asyncio
async def test_frames_with_values_the_services_refuse_close_with_4400(cluster, owner, node_identity):
    other = await sync_to_async(_register)(cluster, owner, "other")
    command = await _download_queued(owner, cluster, node_identity.node_id)
    good = await _authenticated(other)
    for name, raw in _bad_content_frames(node_identity.node_id, str(command.pk)).items():
        comm = await _authenticated(node_identity)
        await comm.send_to(text_data=raw)
        closed = await _close_of(comm)
        assert closed["code"] == CLOSE_PROTOCOL_ERROR, (name, closed)
        assert closed["reason"], name
        await comm.disconnect()
        assert await _heartbeat_answered(good), name
    await good.disconnect()
    # nothing half-written: the command is still only queued/dispatched, not failed or succeeded
    assert await sync_to_async(lambda: Command.objects.get(pk=command.pk).status)() in ("queued", "dispatched")


@pytest.mark.asyncio
async def test_reports_about_another_nodes_command_are_ignored_not_applied(cluster, owner, node_identity):
    other = await sync_to_async(_register)(cluster, owner, "other")
    theirs = await _download_queued(owner, cluster, other.node_id)
    comm = await _authenticated(node_identity)
    await comm.send_to(text_data=p.encode(p.Ack(command_id=str(theirs.pk))))
    await comm.send_to(text_data=p.encode(p.Result(command_id=str(theirs.pk), data={"forged": True})))
    assert await _heartbeat_answered(comm)  # still connected: not a protocol error, just ignored
    row = await sync_to_async(Command.objects.get)(pk=theirs.pk)
    assert row.status in ("queued", "dispatched")
    assert row.result == {}
    await comm.disconnect()


@pytest.mark.asyncio
async def test_a_stream_open_from_an_older_replica_is_ignored_not_fatal(node_identity):
    """During a rolling deploy an old replica still sends `stream.open` through the channel layer (streams now
    come over peer links): the tunnel ignores it."""
    from channels.layers import get_channel_layer

    from fleet.groups import node_group

    comm = await _authenticated(node_identity)
    old_style = {"type": "stream.open", "stream_id": 7, "port": 8000, "reply": "specific.x!y", "window": 1024}
    await get_channel_layer().group_send(node_group(node_identity.node_id), old_style)
    assert await _heartbeat_answered(comm)  # the tunnel lives on
    await comm.disconnect()


# --------------------------------------------------------------------------------------------------
# authentication: forged, mismatched, expired and revoked certificates


def _other_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    ours = x509.load_pem_x509_certificate(ca.ca_certificate_pem().encode())
    now = timezone.now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(ours.subject)  # an impostor CA with the very same name as ours
        .issuer_name(ours.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _node_cert(
    *,
    node_id: str,
    public_key: Any,
    issuer: x509.Name,
    signing_key: ec.EllipticCurvePrivateKey,
    not_before: dt.datetime,
    not_after: dt.datetime,
    serial: int | None = None,
) -> str:
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(serial or x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"{ca.NODE_URI_PREFIX}{node_id}")]),
            critical=False,
        )
        .sign(signing_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _forged(ident: Identity, kind: str) -> Identity:
    now = timezone.now()
    if kind == "signed by another CA":
        key, other = _other_ca()
        pem = _node_cert(
            node_id=ident.node_id,
            public_key=ident.key.public_key(),
            issuer=other.subject,
            signing_key=key,
            not_before=now - dt.timedelta(hours=1),
            not_after=now + dt.timedelta(days=1),
            serial=x509.load_pem_x509_certificate(ident.certificate_pem.encode()).serial_number,
        )
        return replace(ident, certificate_pem=pem)
    if kind == "expired (our CA)":
        loaded = ca._load_ca()
        pem = _node_cert(
            node_id=ident.node_id,
            public_key=ident.key.public_key(),
            issuer=loaded.certificate.subject,
            signing_key=loaded.key,
            not_before=now - dt.timedelta(days=10),
            not_after=now - dt.timedelta(days=1),
        )
        return replace(ident, certificate_pem=pem)
    if kind == "our CA but never issued":
        loaded = ca._load_ca()
        pem = _node_cert(
            node_id=ident.node_id,
            public_key=ident.key.public_key(),
            issuer=loaded.certificate.subject,
            signing_key=loaded.key,
            not_before=now - dt.timedelta(hours=1),
            not_after=now + dt.timedelta(days=1),
        )
        return replace(ident, certificate_pem=pem)
    if kind == "mismatched key":  # the real certificate, but the challenge signed with another key
        return replace(ident, key=identity.generate_key())
    if kind == "garbage PEM":
        return replace(ident, certificate_pem="-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    raise AssertionError(kind)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "kind", ["signed by another CA", "expired (our CA)", "our CA but never issued", "mismatched key", "garbage PEM"]
)
async def test_forged_certificates_are_refused_with_4401(kind, node_identity):
    forged = await sync_to_async(_forged)(node_identity, kind)
    comm, challenge = await _open()
    await comm.send_to(text_data=p.encode(_hello(forged, challenge)))
    closed = await _close_of(comm)
    assert closed["code"] == CLOSE_UNAUTHORIZED, (kind, closed)
    assert closed["reason"]
    assert not await sync_to_async(lambda: Node.objects.get(pk=node_identity.node_id).connected)()
    await comm.disconnect()


@pytest.mark.asyncio
async def test_hello_for_another_node_and_bad_signatures_are_refused(cluster, owner, node_identity):
    other = await sync_to_async(_register)(cluster, owner, "victim")
    cases = {
        "someone else's node id": lambda c: _hello(node_identity, c, node_id=other.node_id),
        "signature over another nonce": lambda c: _hello(
            node_identity, c, signature_b64=identity.sign_nonce(node_identity.key, "an-older-challenge-nonce")
        ),
        "signature not base64": lambda c: _hello(node_identity, c, signature_b64="%%%"),
        # a node key's signature over the bare nonce could be anything that key signs (its CSR, say)
        "signature over the bare nonce, without the agent proof context": lambda c: _hello(
            node_identity, c, signature_b64=_bare_signature(node_identity.key, c.nonce)
        ),
        "empty certificate": lambda c: _hello(node_identity, c, certificate_pem=""),
    }
    for name, build in cases.items():
        comm, challenge = await _open()
        await comm.send_to(text_data=p.encode(build(challenge)))
        closed = await _close_of(comm)
        assert closed["code"] == CLOSE_UNAUTHORIZED, (name, closed)
        await comm.disconnect()
    # a frame other than hello first is refused too
    comm, _ = await _open()
    await comm.send_to(text_data=p.encode(p.Heartbeat(cpu_percent=1.0, memory_percent=1.0)))
    assert (await _close_of(comm))["code"] == CLOSE_UNAUTHORIZED
    await comm.disconnect()
    connected = await sync_to_async(lambda: list(Node.objects.filter(connected=True)))()
    assert connected == []


def _bare_signature(key: ec.EllipticCurvePrivateKey, nonce: str) -> str:
    """What agents sent before the proofs had a context: a signature over the nonce alone."""
    return base64.b64encode(key.sign(nonce.encode(), ec.ECDSA(hashes.SHA256()))).decode()


def _ca_verifies(signature: bytes, data: bytes) -> bool:
    public_key = x509.load_pem_x509_certificate(ca.ca_certificate_pem().encode()).public_key()
    try:
        public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


@pytest.mark.asyncio
async def test_server_proof_signs_the_context_and_nonce_never_the_bare_nonce():
    """The CA key must not sign a string the (unauthenticated) peer chose: it signs node certificates."""
    agent_nonce = "0123456789abcdef0123456789abcdef"
    comm, challenge = await _open(agent_nonce)
    signature = base64.b64decode(challenge.server_signature_b64)
    assert not await sync_to_async(_ca_verifies)(signature, agent_nonce.encode())
    assert await sync_to_async(_ca_verifies)(signature, p.SERVER_PROOF_CONTEXT + agent_nonce.encode())
    ca_pem = await sync_to_async(ca.ca_certificate_pem)()
    assert identity.verify_server_proof(ca_pem, agent_nonce, challenge.server_signature_b64)
    await comm.disconnect()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "query",
    [
        "",
        "agent_nonce=",
        "agent_nonce=too-short",
        f"agent_nonce={'a' * 129}",
        "agent_nonce=with+spaces+in+it+and+more",
        "agent_nonce=%30%82%01%0a" + "a" * 16,  # DER-looking bytes (a SEQUENCE header)
        "agent_nonce=" + "%C3%A9" * 16,
    ],
    ids=["absent", "empty", "short", "long", "spaces", "binary", "non-ascii"],
)
async def test_agent_nonce_not_of_the_accepted_form_is_refused_before_anything_is_signed(query):
    comm = WebsocketCommunicator(application, f"/agent/tunnel?{query}")
    connected, _ = await comm.connect()
    assert connected
    message = await comm.receive_output(5)
    assert message["type"] == "websocket.close", message  # no Challenge: nothing signed with the CA key
    assert message["code"] == CLOSE_PROTOCOL_ERROR
    assert "agent_nonce" in message["reason"]
    await comm.disconnect()


@pytest.mark.asyncio
async def test_replayed_hello_from_an_earlier_session_is_refused(node_identity):
    """A captured hello (valid signature over an old nonce) cannot be replayed on a new socket."""
    first, challenge = await _open()
    captured = _hello(node_identity, challenge)
    await first.send_to(text_data=p.encode(captured))
    assert isinstance(await _frame(first), p.Welcome)
    await first.disconnect()
    replay, _ = await _open()
    await replay.send_to(text_data=p.encode(captured))
    assert (await _close_of(replay))["code"] == CLOSE_UNAUTHORIZED
    await replay.disconnect()


@pytest.mark.asyncio
async def test_revoked_certificate_gets_revoked_frame_and_4403(cluster, owner, node_identity):
    node = await sync_to_async(Node.objects.get)(pk=node_identity.node_id)
    await sync_to_async(services.node_delete)(node=node, actor=owner)
    comm, challenge = await _open()
    await comm.send_to(text_data=p.encode(_hello(node_identity, challenge)))
    frame = await _frame(comm)
    assert isinstance(frame, p.Revoked)
    closed = await _close_of(comm)
    assert closed["code"] == CLOSE_REVOKED
    await comm.disconnect()


@pytest.mark.asyncio
async def test_deleting_a_node_closes_its_live_tunnel_with_4403(owner, node_identity):
    comm = await _authenticated(node_identity)
    node = await sync_to_async(Node.objects.get)(pk=node_identity.node_id)
    await sync_to_async(services.node_delete)(node=node, actor=owner)
    frame = await _frame(comm)
    assert isinstance(frame, p.Revoked)
    assert (await _close_of(comm))["code"] == CLOSE_REVOKED
    await comm.disconnect()


# --------------------------------------------------------------------------------------------------
# join tokens: expired, reused, wrong cluster, garbage


def _register_call(token: str, **extra: Any):
    key = identity.generate_key()
    body = {"token": token, "csr_pem": identity.build_csr(key, "tok"), "facts": p.to_dict(FACTS), **extra}
    return APIClient().post("/api/v1/agent/register", body, format="json")


def test_expired_reused_and_foreign_join_tokens_are_refused(cluster, owner, workspace):
    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    assert _register_call(raw).status_code == 201
    reused = _register_call(raw)
    assert reused.status_code == 403  # a token rejection is a refusal, with the reason and a code
    assert "already been used" in reused.content.decode()

    expired, raw_expired = services.join_token_create(cluster=cluster, actor=owner)
    JoinToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    response = _register_call(raw_expired)
    assert response.status_code == 403
    assert response.json()["code"] == "token_expired"

    other_cluster = services.cluster_create(actor=owner, workspace=workspace, name="elsewhere")
    _, raw_other = services.join_token_create(cluster=cluster, actor=owner)
    response = _register_call(raw_other, cluster_id=str(other_cluster.pk))
    assert response.status_code == 403
    assert response.json()["code"] == "token_wrong_cluster"
    for garbage in ("", "ct_node_" + "A" * 300, "not-a-token", "ct_node_unknown"):
        assert _register_call(garbage).status_code in (400, 403), garbage
    # only the first registration made a node
    assert Node.objects.filter(cluster__workspace=workspace).count() == 1
    assert NodeEvent.objects.filter(kind="registered").count() == 1


def test_concurrent_use_of_one_token_registers_one_node(cluster, owner):
    """Two registrations racing on the same token: exactly one wins (the conditional UPDATE)."""
    import threading

    from django.db import connection

    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    codes: list[int] = []
    barrier = threading.Barrier(4)

    def attempt() -> None:
        barrier.wait()
        try:
            codes.append(_register_call(raw).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(codes) == [201, 403, 403, 403]
    assert Node.objects.filter(cluster=cluster).count() == 1


# --------------------------------------------------------------------------------------------------
# the same against a real server: the production one (uvicorn) and daphne (development)


def _closed_by_server(ws: Any, raw: str | bytes | None) -> tuple[int | None, str | None]:
    """Send `raw` (if any) on a real socket, read until the server closes it; the close code and reason."""
    from websockets.exceptions import ConnectionClosed

    try:
        if raw is not None:
            ws.send(raw)
        while True:
            ws.recv(timeout=10)
    except ConnectionClosed:
        pass
    return ws.close_code, ws.close_reason


@pytest.mark.integration
@pytest.mark.parametrize("server", BOTH_SERVERS)
def test_real_server_closes_bad_sockets_with_4400_and_a_reason_and_keeps_serving(tmp_path, cluster, owner, server):
    import websockets.sync.client as ws_client

    from tests.support.live import ControlPlane, subprocess_env
    from tests.support.processes import MAX_WEBSOCKET_MESSAGE_BYTES

    plane = ControlPlane(log_dir=tmp_path, env=subprocess_env(), server=server)
    port = plane.start_replica()
    sockets = contextlib.ExitStack()  # every socket opened below is closed at the end, whatever happens
    try:
        good_ident, bad_ident = _register(cluster, owner, "good"), _register(cluster, owner, "bad")
        url = f"ws://127.0.0.1:{port}/agent/tunnel?agent_nonce=0123456789abcdef"

        def heartbeat_answered(ws) -> bool:
            ws.send(p.encode(p.Heartbeat(cpu_percent=1.0, memory_percent=1.0)))
            while not isinstance(p.decode(ws.recv(timeout=10)), p.HeartbeatAck):
                pass
            return True

        def authenticate(ident: Identity):
            ws = sockets.enter_context(ws_client.connect(url, max_size=None, open_timeout=10))
            challenge = p.decode(ws.recv(timeout=10))
            assert isinstance(challenge, p.Challenge)
            ws.send(p.encode(_hello(ident, challenge)))
            assert isinstance(p.decode(ws.recv(timeout=10)), p.Welcome)
            return ws

        good = authenticate(good_ident)
        cases = {
            MALFORMED["oversized"]: "exceeds the",
            MALFORMED["not json"]: "not valid JSON",
            MALFORMED["deeply nested"]: "nested deeper",
            _raw("ack", command_id="not-a-uuid"): "bad ack frame",
        }
        for raw, why in cases.items():
            code, reason = _closed_by_server(authenticate(bad_ident), raw)
            assert code == CLOSE_PROTOCOL_ERROR, (raw[:40], code, reason)
            assert why in (reason or ""), (raw[:40], reason)  # the reason reaches the peer
            assert heartbeat_answered(good)
        log = plane.replicas[0].log()
        assert log.count(f"closing tunnel of node {bad_ident.node_id}") == len(cases), log[-3000:]
        # beyond the server's own message limit: a 1009 close frame for that socket (not a dropped TCP
        # connection, 1006), and the others stay
        code, reason = _closed_by_server(authenticate(bad_ident), "x" * (MAX_WEBSOCKET_MESSAGE_BYTES + 1))
        assert code == 1009, (code, reason)
        assert "exceeds" in (reason or ""), reason  # daphne: "exceeds payload limit"; uvicorn: "... exceeds limit of"
        assert heartbeat_answered(good)
        good.close()
        assert plane.replicas[0].alive()
        assert "Traceback" not in plane.replicas[0].log()
    finally:
        sockets.close()
        plane.stop()


@pytest.mark.integration
@pytest.mark.parametrize("server", BOTH_SERVERS)
def test_real_server_tells_unauthenticated_peers_why_it_closed_without_a_traceback(tmp_path, server):
    """Before any hello: deep nesting, garbage, a 6 MiB frame and a bad agent_nonce each get a clean close."""
    import websockets.sync.client as ws_client

    from tests.support.live import ControlPlane, subprocess_env

    plane = ControlPlane(log_dir=tmp_path, env=subprocess_env(), server=server)
    port = plane.start_replica()
    try:
        base = f"ws://127.0.0.1:{port}/agent/tunnel"

        def close_of(raw: str | bytes | None, agent_nonce: str = "0123456789abcdef") -> tuple[int | None, str]:
            with ws_client.connect(f"{base}?agent_nonce={agent_nonce}", max_size=None, open_timeout=10) as ws:
                if raw is not None:
                    assert isinstance(p.decode(ws.recv(timeout=10)), p.Challenge)
                code, reason = _closed_by_server(ws, raw)
            return code, reason or ""

        code, reason = close_of("[" * 500_000)  # was: RecursionError, 1011 and a traceback in the log
        assert (code, "nested deeper" in reason) == (CLOSE_PROTOCOL_ERROR, True), (code, reason)
        code, reason = close_of(b"\xff\xfe" * 32)
        assert (code, "magic" in reason) == (CLOSE_PROTOCOL_ERROR, True), (code, reason)
        code, reason = close_of("x" * (6 * 1024 * 1024))  # was: the TCP connection dropped (1006)
        assert code == 1009, (code, reason)
        code, reason = close_of(None, agent_nonce="abc")
        assert (code, "agent_nonce" in reason) == (CLOSE_PROTOCOL_ERROR, True), (code, reason)
        assert plane.replicas[0].alive()
        assert "Traceback" not in plane.replicas[0].log(), plane.replicas[0].log()[-3000:]
    finally:
        plane.stop()


def test_nul_escapes_are_dropped_and_an_escaped_backslash_before_u0000_is_kept():
    assert without_nul(json.dumps({"log": "ti\x01\x00\x00me"})) == '{"log": "ti\\u0001me"}'
    assert json.loads(without_nul(json.dumps({"path": "C:\\u0000"}))) == {"path": "C:\\u0000"}  # not a NUL
    assert json.loads(without_nul(json.dumps({"m": "\\\x00"}))) == {"m": "\\"}


@pytest.mark.asyncio
async def test_a_result_carrying_nul_characters_is_recorded_without_them_and_the_tunnel_stays(
    cluster, owner, node_identity
):
    """A log tail read while Ray writes it may hold NULs, which PostgreSQL's jsonb refuses: recording it failed
    at every resend, and each failure closed the tunnel (its proxied streams too)."""
    command = await _download_queued(owner, cluster, node_identity.node_id)
    comm = await _authenticated(node_identity)
    await comm.send_to(text_data=p.encode(p.Ack(command_id=str(command.pk))))
    await comm.send_to(text_data=p.encode(p.Result(command_id=str(command.pk), data={"logs": {"gcs": "a\x00\x00b"}})))
    for _ in range(100):  # results are recorded in batches, off the socket's loop
        row = await sync_to_async(Command.objects.get)(pk=command.pk)
        if row.status == "succeeded":
            break
        await asyncio.sleep(0.1)
    assert row.status == "succeeded"
    assert await _heartbeat_answered(comm)  # the tunnel stays
    assert row.result["logs"] == {"gcs": "ab"}
    await comm.disconnect()
