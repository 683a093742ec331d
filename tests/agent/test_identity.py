"""The node's tunnel proofs: signatures over a context string plus the nonce, never over the bare nonce."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent import identity
from agent import protocol as p

NONCE = "0123456789abcdef0123456789abcdef"


def _verifies(key: ec.EllipticCurvePublicKey, signature_b64: str, data: bytes) -> bool:
    try:
        key.verify(base64.b64decode(signature_b64), data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


def _ca() -> tuple[ec.EllipticCurvePrivateKey, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return key, cert.public_bytes(serialization.Encoding.PEM).decode()


def _sign(key: ec.EllipticCurvePrivateKey, data: bytes) -> str:
    return base64.b64encode(key.sign(data, ec.ECDSA(hashes.SHA256()))).decode()


def test_the_agent_signs_the_challenge_under_its_context_not_the_bare_nonce():
    key = identity.generate_key()
    signature = identity.sign_nonce(key, NONCE)
    assert _verifies(key.public_key(), signature, p.AGENT_PROOF_CONTEXT + NONCE.encode())
    assert not _verifies(key.public_key(), signature, NONCE.encode())


@pytest.mark.parametrize("nonce", ["", "short", "0\x82\x01\x0a" + "a" * 16, "a" * 129, "spaces in the nonce"])
def test_the_agent_signs_no_challenge_nonce_of_another_form(nonce):
    with pytest.raises(p.ProtocolError):
        identity.sign_nonce(identity.generate_key(), nonce)


def test_the_server_proof_must_cover_the_server_context_and_this_nonce():
    ca_key, ca_pem = _ca()
    assert identity.verify_server_proof(ca_pem, NONCE, _sign(ca_key, p.SERVER_PROOF_CONTEXT + NONCE.encode()))
    # what a control plane signed before the proofs had a context: refused
    assert not identity.verify_server_proof(ca_pem, NONCE, _sign(ca_key, NONCE.encode()))
    # the agent's own context, another nonce, another key: refused
    assert not identity.verify_server_proof(ca_pem, NONCE, _sign(ca_key, p.AGENT_PROOF_CONTEXT + NONCE.encode()))
    other = NONCE[::-1]
    assert not identity.verify_server_proof(ca_pem, NONCE, _sign(ca_key, p.SERVER_PROOF_CONTEXT + other.encode()))
    impostor = ec.generate_private_key(ec.SECP256R1())
    assert not identity.verify_server_proof(ca_pem, NONCE, _sign(impostor, p.SERVER_PROOF_CONTEXT + NONCE.encode()))


def test_proof_contexts_can_never_be_the_start_of_a_der_structure():
    """Certificates, CSRs and CRLs sign a DER SEQUENCE (first byte 0x30); a proof starts elsewhere."""
    for context in (p.SERVER_PROOF_CONTEXT, p.AGENT_PROOF_CONTEXT):
        assert context[0] != 0x30
        assert context.endswith(b"\x00")
    assert p.SERVER_PROOF_CONTEXT != p.AGENT_PROOF_CONTEXT
    _, ca_pem = _ca()
    tbs = x509.load_pem_x509_certificate(ca_pem.encode()).tbs_certificate_bytes
    assert tbs[0] == 0x30
