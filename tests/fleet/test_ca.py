"""The control plane CA with real cryptography: sign, verify, revoke, signatures over nonces."""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding
from cryptography.x509.oid import NameOID
from django.core.exceptions import ValidationError
from django.db import connection

from fleet import ca
from fleet.models import CertificateAuthority, Node, NodeCertificate, RevokedSerial
from tests.fleet.conftest import make_csr_pem, make_key

pytestmark = pytest.mark.django_db


def test_ca_is_created_once_and_its_key_is_encrypted_at_rest():
    pem = ca.ca_certificate_pem()
    assert pem.startswith("-----BEGIN CERTIFICATE-----")
    assert ca.ca_certificate_pem() == pem
    assert CertificateAuthority.objects.count() == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT private_key FROM fleet_certificateauthority")
        (stored,) = cursor.fetchone()
    assert "PRIVATE KEY" not in stored
    assert CertificateAuthority.objects.get().private_key.startswith("-----BEGIN PRIVATE KEY-----")
    cert = x509.load_pem_x509_certificate(pem.encode())
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True


@pytest.mark.django_db(transaction=True)
def test_ca_creation_is_race_safe():
    results: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def create() -> None:
        try:
            barrier.wait()
            results.append(ca.ca_certificate_pem())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert CertificateAuthority.objects.count() == 1
    assert results[0] == results[1] == CertificateAuthority.objects.get().certificate_pem


def _issue(cluster, key) -> tuple[uuid.UUID, str, str, str]:
    """Sign a CSR for a new node row and record the certificate, as registration does."""
    node = Node.objects.create(cluster=cluster, name="n", hostname="n")
    pem, serial, fingerprint = ca.sign_node_csr(csr_pem=make_csr_pem(key), node_id=node.id)
    NodeCertificate.objects.create(node=node, serial=serial, fingerprint_sha256=fingerprint, certificate_pem=pem)
    return node.id, pem, serial, fingerprint


@pytest.mark.parametrize("kind", ["ec", "rsa"])
def test_sign_then_verify_returns_node_id(cluster, kind):
    key = make_key(kind)
    node_id, pem, serial, fingerprint = _issue(cluster, key)
    cert = x509.load_pem_x509_certificate(pem.encode())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == str(node_id)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [f"urn:cleverthis:node:{node_id}"]
    assert serial == str(cert.serial_number)
    assert fingerprint == cert.fingerprint(hashes.SHA256()).hex()
    assert ca.verify_node_certificate(pem) == node_id
    # The agent's nonce signature verifies with the certificate, a tampered one does not.
    nonce = b"nonce-123"
    if kind == "ec":
        signature = key.sign(nonce, ec.ECDSA(hashes.SHA256()))
    else:
        signature = key.sign(nonce, padding.PKCS1v15(), hashes.SHA256())
    ca.verify_signature(certificate_pem=pem, data=nonce, signature=signature)
    with pytest.raises(ca.CertificateRejected, match="signature does not verify"):
        ca.verify_signature(certificate_pem=pem, data=b"other nonce", signature=signature)


def test_revoked_certificate_is_refused(cluster):
    _, pem, serial, _ = _issue(cluster, make_key())
    RevokedSerial.objects.create(serial=serial, reason="test")
    with pytest.raises(ca.CertificateRejected, match="revoked"):
        ca.verify_node_certificate(pem)


def test_certificate_of_a_node_removed_without_the_service_is_refused(cluster):
    _, pem, _, _ = _issue(cluster, make_key())
    cluster.delete()  # a raw cascade: no revocation entry was written
    with pytest.raises(ca.CertificateRejected, match="does not belong to a registered node"):
        ca.verify_node_certificate(pem)


def test_signed_but_unrecorded_certificate_is_refused():
    pem, _, _ = ca.sign_node_csr(csr_pem=make_csr_pem(make_key()), node_id=uuid.uuid4())
    with pytest.raises(ca.CertificateRejected, match="does not belong"):
        ca.verify_node_certificate(pem)


def _self_issued(subject: x509.Name, node_id: uuid.UUID, *, days: int = 30, offset_days: int = 0) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC) + dt.timedelta(days=offset_days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(node_id))]))
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"urn:cleverthis:node:{node_id}")]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def test_certificate_from_another_ca_is_refused_even_with_our_issuer_name():
    ours = x509.load_pem_x509_certificate(ca.ca_certificate_pem().encode())
    forged = _self_issued(ours.subject, uuid.uuid4())
    with pytest.raises(ca.CertificateRejected, match="signature does not verify"):
        ca.verify_node_certificate(forged)
    stranger = _self_issued(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "evil")]), uuid.uuid4())
    with pytest.raises(ca.CertificateRejected, match="not issued by"):
        ca.verify_node_certificate(stranger)


def test_expired_certificate_is_refused():
    ca.ca_certificate_pem()
    row = CertificateAuthority.objects.get()
    key = serialization.load_pem_private_key(row.private_key.encode(), password=None)
    issuer = x509.load_pem_x509_certificate(row.certificate_pem.encode()).subject
    node_id = uuid.uuid4()
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    cert = (
        (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(node_id))]))
            .issuer_name(issuer)
            .public_key(ec.generate_private_key(ec.SECP256R1()).public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(past)
            .not_valid_after(past + dt.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"urn:cleverthis:node:{node_id}")]),
                critical=False,
            )
            .sign(key, hashes.SHA256())
        )
        .public_bytes(serialization.Encoding.PEM)
        .decode()
    )
    with pytest.raises(ca.CertificateRejected, match="expired"):
        ca.verify_node_certificate(cert)


@pytest.mark.parametrize(
    ("csr", "message"),
    [
        ("", "required"),
        ("not a csr", "Not a valid PEM"),
        ("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", "Not a valid PEM"),
    ],
)
def test_bad_csr_is_a_validation_error(csr, message):
    with pytest.raises(ValidationError) as info:
        ca.sign_node_csr(csr_pem=csr, node_id=uuid.uuid4())
    assert message in str(info.value.message_dict["csr_pem"])


def test_csr_with_broken_signature_is_refused():
    key = make_key()
    good = x509.load_pem_x509_csr(make_csr_pem(key).encode())
    der = bytearray(good.public_bytes(serialization.Encoding.DER))
    der[-3] ^= 0xFF  # flip a byte inside the signature
    import base64

    body = base64.encodebytes(bytes(der)).decode()
    tampered = f"-----BEGIN CERTIFICATE REQUEST-----\n{body}-----END CERTIFICATE REQUEST-----\n"
    with pytest.raises(ValidationError) as info:
        ca.sign_node_csr(csr_pem=tampered, node_id=uuid.uuid4())
    assert "does not verify" in str(info.value) or "Not a valid" in str(info.value)


def test_garbage_certificate_is_rejected():
    with pytest.raises(ca.CertificateRejected):
        ca.verify_node_certificate("garbage")
    with pytest.raises(ca.CertificateRejected):
        ca.verify_signature(certificate_pem="", data=b"x", signature=b"y")
