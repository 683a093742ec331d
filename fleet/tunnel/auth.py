"""Tunnel authentication helpers on top of the CA: proving the server to the agent, and revocation checks."""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from agent import protocol
from fleet import ca
from fleet.models import RevokedSerial


def server_proof(agent_nonce: str) -> bytes:
    """The CA's ECDSA-SHA256 signature over `protocol.server_proof_message(agent_nonce)`.

    Agents check it against their pinned CA. Only ever over that context-prefixed message, never over
    bytes a peer chose, so this key's tunnel signatures can never stand for a certificate's (see
    `agent.protocol`). Raises `ProtocolError` for a nonce that is not of the protocol's form.
    """
    return ca._load_ca().key.sign(protocol.server_proof_message(agent_nonce), ec.ECDSA(hashes.SHA256()))


def certificate_serial(certificate_pem: str) -> str:
    """The decimal serial of a PEM certificate (how RevokedSerial stores it)."""
    return str(x509.load_pem_x509_certificate(certificate_pem.encode("ascii")).serial_number)


def is_serial_revoked(serial: str) -> bool:
    """True when `serial` is on the revocation list."""
    return RevokedSerial.objects.filter(serial=serial).exists()


def revoked_among(serials: list[str]) -> set[str]:
    """Those of `serials` on the revocation list (one query)."""
    return set(RevokedSerial.objects.filter(serial__in=serials).values_list("serial", flat=True))
