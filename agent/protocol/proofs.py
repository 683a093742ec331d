"""What each side of the tunnel signs to prove its key: a context string per direction, then the nonce.

Each side proves its key over the other side's nonce. The keys involved also sign other things (the
CA key signs node certificates, a node key signed its CSR), so a proof is never a signature over the
bare nonce: it covers a fixed context string followed by the nonce, one context per direction, and
nonces are 16-128 URL-safe characters. The signed bytes then start with "C" (0x43), while everything
else these keys sign (a DER TBSCertificate, CertificationRequestInfo or TBSCertList) starts with 0x30
(SEQUENCE): a proof can never be a certificate's, CSR's or CRL's signature, whatever nonce is chosen.
"""

from __future__ import annotations

import re

from agent.protocol.versions import ProtocolError

SERVER_PROOF_CONTEXT = b"CleverThis tunnel server proof v1\x00"
AGENT_PROOF_CONTEXT = b"CleverThis tunnel agent proof v1\x00"
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,128}")


def is_valid_nonce(nonce: str) -> bool:
    """True for a nonce either side may be asked to sign: 16-128 URL-safe base64/hex characters."""
    return _NONCE.fullmatch(nonce) is not None


def _proof_message(context: bytes, nonce: str) -> bytes:
    if not is_valid_nonce(nonce):
        raise ProtocolError("a tunnel nonce must be 16-128 URL-safe characters")
    return context + nonce.encode("ascii")


def server_proof_message(agent_nonce: str) -> bytes:
    """What the control plane signs with its CA key over the agent's `?agent_nonce=` (ProtocolError if malformed)."""
    return _proof_message(SERVER_PROOF_CONTEXT, agent_nonce)


def agent_proof_message(nonce: str) -> bytes:
    """What the agent signs with its node key over the `Challenge` nonce (ProtocolError if malformed)."""
    return _proof_message(AGENT_PROOF_CONTEXT, nonce)
