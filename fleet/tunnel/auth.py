"""Tunnel authentication helpers on top of the CA: proving the server to the agent, and revocation checks."""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from fleet import ca
from fleet.models import RevokedSerial


def sign_with_ca(data: bytes) -> bytes:
    """ECDSA-SHA256 signature over `data` with the CA key; agents check it against their pinned CA."""
    return ca._load_ca().key.sign(data, ec.ECDSA(hashes.SHA256()))


def certificate_serial(certificate_pem: str) -> str:
    """The decimal serial of a PEM certificate (how RevokedSerial stores it)."""
    return str(x509.load_pem_x509_certificate(certificate_pem.encode("ascii")).serial_number)


def is_serial_revoked(serial: str) -> bool:
    """True when `serial` is on the revocation list."""
    return RevokedSerial.objects.filter(serial=serial).exists()
