"""The periodic re-check of the revocation list (belt and braces for a missed revoke broadcast).

One pass looks at the list for all the tunnels of the process at once; a tunnel whose certificate was
revoked without a broadcast reaching it gets a Revoked frame and close code 4403, the others stay up.
Driven through the real ASGI application, as in `test_tunnel_bad_input`.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from agent import protocol as p
from fleet import services
from fleet.models import RevokedSerial
from fleet.tunnel import auth as tunnel_auth
from fleet.tunnel.consumer import CLOSE_REVOKED
from fleet.tunnel.revocations import REVOCATIONS, RevocationWatch
from tests.fleet.tunnel.test_tunnel_bad_input import _authenticated, _close_of, _frame, _heartbeat_answered, _register

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster(owner, workspace):  # type: ignore[no-untyped-def]
    return services.cluster_create(actor=owner, workspace=workspace, name="revocation-watch")


@pytest.mark.asyncio
async def test_a_pass_closes_only_the_tunnels_whose_certificate_was_revoked(settings, cluster, owner):
    settings.AGENT_REVOCATION_RECHECK_S = 3600  # no pass of its own during the test: we run one
    kept = await sync_to_async(_register)(cluster, owner, "kept")
    revoked = await sync_to_async(_register)(cluster, owner, "gone")
    kept_comm = await _authenticated(kept)
    revoked_comm = await _authenticated(revoked)
    assert await REVOCATIONS.check_now() == 0  # nothing revoked yet: nothing closed
    serial = tunnel_auth.certificate_serial(revoked.certificate_pem)
    await sync_to_async(RevokedSerial.objects.create)(serial=serial)  # revoked, and no broadcast

    assert await REVOCATIONS.check_now() == 1
    frame = await _frame(revoked_comm)
    assert isinstance(frame, p.Revoked)
    assert (await _close_of(revoked_comm))["code"] == CLOSE_REVOKED
    assert await _heartbeat_answered(kept_comm)  # the other tunnel is untouched
    assert await REVOCATIONS.check_now() == 0  # closed once
    await revoked_comm.disconnect()
    await kept_comm.disconnect()


@pytest.mark.asyncio
async def test_tunnels_are_looked_up_in_chunks(settings, cluster, owner, monkeypatch):
    settings.AGENT_REVOCATION_RECHECK_S = 3600
    monkeypatch.setattr(RevocationWatch, "CHUNK", 2)
    idents = await sync_to_async(lambda: [_register(cluster, owner, f"n{i}") for i in range(3)])()
    comms = [await _authenticated(ident) for ident in idents]
    looked_up: list[list[str]] = []
    original = tunnel_auth.revoked_among

    def counted(serials: list[str]) -> set[str]:
        looked_up.append(list(serials))
        return original(serials)

    monkeypatch.setattr(tunnel_auth, "revoked_among", counted)
    serial = tunnel_auth.certificate_serial(idents[2].certificate_pem)
    await sync_to_async(RevokedSerial.objects.create)(serial=serial)
    assert await REVOCATIONS.check_now() == 1
    assert sorted(len(chunk) for chunk in looked_up) == [1, 2]  # 3 tunnels, one query per 2
    assert isinstance(await _frame(comms[2]), p.Revoked)
    for comm in comms:
        await comm.disconnect()
