"""Encryption of secrets at rest: Fernet keyed from FIELD_ENCRYPTION_KEY (or derived from SECRET_KEY)."""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.db import models


class DecryptionError(ValueError):
    """A ciphertext that the configured key cannot open (wrong key or corrupted value)."""


@lru_cache(maxsize=4)
def _fernet_for(field_key: str, secret_key: str) -> Fernet:
    if field_key:
        return Fernet(field_key.encode("ascii"))
    digest = hashlib.sha256(b"cleverthis-field-encryption:" + secret_key.encode("utf-8")).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def fernet() -> Fernet:
    """The Fernet instance for the current settings."""
    return _fernet_for(settings.FIELD_ENCRYPTION_KEY, settings.SECRET_KEY)


def encrypt_bytes(data: bytes) -> str:
    """Encrypt `data`; the result is ASCII text fit for a text column."""
    return fernet().encrypt(data).decode("ascii")


def decrypt_bytes(token: str) -> bytes:
    """Decrypt what `encrypt_bytes` returned; `DecryptionError` if the key does not fit."""
    try:
        return fernet().decrypt(token.encode("ascii"))
    except (InvalidToken, ValueError) as exc:
        raise DecryptionError("cannot decrypt value: wrong FIELD_ENCRYPTION_KEY or corrupted data") from exc


def encrypt_str(value: str) -> str:
    """Encrypt a text secret."""
    return encrypt_bytes(value.encode("utf-8"))


def decrypt_str(token: str) -> str:
    """Decrypt a text secret."""
    return decrypt_bytes(token).decode("utf-8")


class EncryptedTextField(models.TextField):
    """A text column holding Fernet ciphertext; Python code sees the plaintext ("" stays "")."""

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> str | None:
        if value is None or value == "":
            return value
        return decrypt_str(value)

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        if value is None or value == "":
            return value
        return encrypt_str(value)
