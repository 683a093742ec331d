"""The control plane's certificate authority: signs node CSRs and verifies node certificates.

The CA is an EC P-256 key pair created on first use (race-safe through a unique row) with its key
encrypted at rest. Node certificates carry the node UUID as subject CN and as a SAN URI
``urn:cleverthis:node:<uuid>``; revocation is the `RevokedSerial` table, checked on every verify.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from fleet.models import CertificateAuthority, NodeCertificate, RevokedSerial

NODE_URI_PREFIX = "urn:cleverthis:node:"
CA_VALIDITY = dt.timedelta(days=3650)
NODE_CERT_VALIDITY = dt.timedelta(days=365)
MAX_CSR_BYTES = 16 * 1024


class CertificateRejected(Exception):
    """A node certificate or signature that must not be trusted; `str(err)` says why."""


@dataclass(frozen=True)
class _LoadedCA:
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    certificate_pem: str


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_ca() -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "CleverThis"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"CleverThis Compute Fleet CA {uuid.uuid4().hex[:8]}"),
        ]
    )
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode("ascii")
    return cert.public_bytes(serialization.Encoding.PEM).decode("ascii"), key_pem


def _ca_row() -> CertificateAuthority:
    row = CertificateAuthority.objects.filter(name="default").first()
    if row is not None:
        return row
    cert_pem, key_pem = _new_ca()
    try:
        with transaction.atomic():
            return CertificateAuthority.objects.create(name="default", certificate_pem=cert_pem, private_key=key_pem)
    except IntegrityError:
        # Another process created it first: use theirs.
        return CertificateAuthority.objects.get(name="default")


_loaded: dict[tuple[Any, str], _LoadedCA] = {}


def _load_ca() -> _LoadedCA:
    """The CA, parsed and with its key decrypted once per process (one cheap query checks it is current)."""
    current = CertificateAuthority.objects.filter(name="default").values_list("pk", "certificate_pem").first()
    if current is not None and current in _loaded:
        return _loaded[current]
    row = _ca_row()
    key = serialization.load_pem_private_key(row.private_key.encode("ascii"), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    cert = x509.load_pem_x509_certificate(row.certificate_pem.encode("ascii"))
    loaded = _LoadedCA(certificate=cert, key=key, certificate_pem=row.certificate_pem)
    _loaded.clear()
    _loaded[(row.pk, row.certificate_pem)] = loaded
    return loaded


def ca_certificate_pem() -> str:
    """The CA certificate (PEM) that agents pin; creates the CA on first use."""
    return _ca_row().certificate_pem


def _check_public_key(key: object) -> None:
    if isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.key_size < 256:
            raise ValidationError({"csr_pem": "EC keys must be at least 256 bits (P-256)."})
        return
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < 2048:
            raise ValidationError({"csr_pem": "RSA keys must be at least 2048 bits."})
        return
    raise ValidationError({"csr_pem": "Unsupported key type: use EC P-256 (or RSA 2048+)."})


def sign_node_csr(*, csr_pem: str, node_id: uuid.UUID) -> tuple[str, str, str]:
    """Sign a node's CSR; return (certificate PEM, serial as decimal string, SHA-256 fingerprint hex).

    Refuses unparsable CSRs, CSRs whose self-signature does not verify and weak keys with a
    `ValidationError` on `csr_pem`.
    """
    if not isinstance(csr_pem, str) or not csr_pem.strip():
        raise ValidationError({"csr_pem": "A PEM-encoded certificate signing request is required."})
    if len(csr_pem) > MAX_CSR_BYTES:
        raise ValidationError({"csr_pem": f"The CSR is larger than {MAX_CSR_BYTES} bytes."})
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode("utf-8"))
    except (ValueError, UnicodeEncodeError):
        raise ValidationError({"csr_pem": "Not a valid PEM-encoded certificate signing request."}) from None
    if not csr.is_signature_valid:
        raise ValidationError({"csr_pem": "The CSR signature does not verify."})
    public_key = csr.public_key()
    _check_public_key(public_key)

    ca = _load_ca()
    now = _now()
    serial = x509.random_serial_number()
    node_uri = f"{NODE_URI_PREFIX}{node_id}"
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(node_id))]))
        .issuer_name(ca.certificate.subject)
        .public_key(public_key)
        .serial_number(serial)
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + NODE_CERT_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(node_uri)]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)  # type: ignore[arg-type]
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
    return pem, str(serial), cert.fingerprint(hashes.SHA256()).hex()


def _load_certificate(certificate_pem: str) -> x509.Certificate:
    if not isinstance(certificate_pem, str) or not certificate_pem.strip():
        raise CertificateRejected("no certificate presented")
    try:
        return x509.load_pem_x509_certificate(certificate_pem.encode("utf-8"))
    except (ValueError, UnicodeEncodeError):
        raise CertificateRejected("certificate is not valid PEM") from None


def node_id_from_certificate(cert: x509.Certificate) -> uuid.UUID:
    """The node UUID carried by a node certificate (SAN URI, which must agree with the CN)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CertificateRejected("certificate has no node URI") from None
    uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(NODE_URI_PREFIX)]
    if len(uris) != 1:
        raise CertificateRejected("certificate must carry exactly one node URI")
    try:
        node_id = uuid.UUID(uris[0][len(NODE_URI_PREFIX) :])
    except ValueError:
        raise CertificateRejected("certificate node URI is not a UUID") from None
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cns) != 1 or cns[0].value != str(node_id):
        raise CertificateRejected("certificate subject does not match its node URI")
    return node_id


def verify_node_certificate(certificate_pem: str) -> uuid.UUID:
    """Check a node certificate (our CA, in its validity period, not revoked) and return the node UUID.

    Raises `CertificateRejected` with the reason otherwise.
    """
    cert = _load_certificate(certificate_pem)
    ca = _load_ca()
    if cert.issuer != ca.certificate.subject:
        raise CertificateRejected("certificate was not issued by this control plane's CA")
    try:
        cert.verify_directly_issued_by(ca.certificate)
    except (ValueError, TypeError, InvalidSignature):
        raise CertificateRejected("certificate signature does not verify against this control plane's CA") from None
    now = _now()
    if now < cert.not_valid_before_utc:
        raise CertificateRejected("certificate is not valid yet")
    if now >= cert.not_valid_after_utc:
        raise CertificateRejected("certificate has expired")
    serial = str(cert.serial_number)
    if RevokedSerial.objects.filter(serial=serial).exists():
        raise CertificateRejected("certificate has been revoked")
    node_id = node_id_from_certificate(cert)
    # Defence in depth: a node removed without the service (e.g. a cascade) has no live certificate row.
    if not NodeCertificate.objects.filter(serial=serial, node_id=node_id, revoked_at__isnull=True).exists():
        raise CertificateRejected("certificate does not belong to a registered node")
    return node_id


def verify_signature(*, certificate_pem: str, data: bytes, signature: bytes) -> None:
    """Check `signature` over `data` was made with the key of `certificate_pem`.

    EC keys: ECDSA with SHA-256 (DER signature). RSA keys: PKCS#1 v1.5 with SHA-256.
    Raises `CertificateRejected` when it does not verify.
    """
    cert = _load_certificate(certificate_pem)
    key = cert.public_key()
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
        else:
            raise CertificateRejected("unsupported key type")
    except InvalidSignature:
        raise CertificateRejected("signature does not verify with the certificate's key") from None
