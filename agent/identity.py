"""The node's key pair, certificate signing request and tunnel proofs (EC P-256, ECDSA-SHA256)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

from agent import protocol


def generate_key() -> ec.EllipticCurvePrivateKey:
    """A fresh P-256 private key for this node."""
    return ec.generate_private_key(ec.SECP256R1())


def write_private_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    """Write `key` as unencrypted PKCS#8 PEM readable only by the owner."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def load_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """Read the node's private key."""
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path} does not hold an EC private key")
    return key


def build_csr(key: ec.EllipticCurvePrivateKey, hostname: str) -> str:
    """A PEM CSR for `hostname`; the control plane puts the node UUID into the issued certificate."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname[:64] or "node")]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode("ascii")


def sign_nonce(key: ec.EllipticCurvePrivateKey, nonce: str) -> str:
    """Base64 ECDSA-SHA256 signature over `protocol.agent_proof_message(nonce)` (the challenge nonce).

    Never over the bare nonce: the node key's signatures stay apart from its CSR's (see `agent.protocol`).
    Raises `ProtocolError` for a nonce that is not of the protocol's form.
    """
    message = protocol.agent_proof_message(nonce)
    return base64.b64encode(key.sign(message, ec.ECDSA(hashes.SHA256()))).decode("ascii")


def verify_server_proof(ca_certificate_pem: str, agent_nonce: str, signature_b64: str) -> bool:
    """True when `signature_b64` is the pinned CA's signature over `protocol.server_proof_message(agent_nonce)`."""
    try:
        message = protocol.server_proof_message(agent_nonce)
    except ValueError:
        return False
    return verify_ca_signature(ca_certificate_pem, message, signature_b64)


def verify_package_signature(ca_certificate_pem: str, version: str, sha256: str, signature_b64: str) -> bool:
    """True when the pinned CA signed `protocol.agent_package_message(version, sha256)` (an agent package)."""
    try:
        message = protocol.agent_package_message(version, sha256)
    except ValueError:
        return False
    return verify_ca_signature(ca_certificate_pem, message, signature_b64)


def verify_ca_signature(ca_certificate_pem: str, message: bytes, signature_b64: str) -> bool:
    """True when `signature_b64` is the pinned CA's signature over `message`."""
    try:
        public_key = x509.load_pem_x509_certificate(ca_certificate_pem.encode("ascii")).public_key()
        signature = base64.b64decode(signature_b64, validate=True)
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        elif isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
        else:
            return False
    except (InvalidSignature, ValueError):  # ProtocolError is a ValueError
        return False
    return True
