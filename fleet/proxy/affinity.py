"""A request's affinity key under its endpoint's routing policy (`fleet.balancer` hashes it onto the ring).

- `session`: the `X-Session-Id` header, else the OpenAI `user` field of the JSON body, else the API key the
  request was authenticated with; None (routed by load) when it has none of them.
- `prefix`: the leading prompt text: a chat request's messages rendered in order (role, then text), up to
  and including the first user message; longer than ROUTING_PREFIX_CHARS characters, its first and last
  halves of that many (so the first user message, at its end, still tells apart conversations that share
  a system prompt longer than the cap); a completion's `prompt` (its first ROUTING_PREFIX_CHARS
  characters, or token ids); a body that is not such JSON (or arrived in parts): its first
  ROUTING_PREFIX_CHARS bytes. Stopping at the first user message keeps a conversation's key the same on
  every turn (each turn resends the history and adds to its end) while telling apart conversations that
  share a long system prompt.

Only the body's first message is read (the one the relay has in hand before choosing a replica), and it is
parsed as JSON only up to PARSE_MAX_BYTES: a larger body's key is its first ROUTING_PREFIX_CHARS bytes, so
one huge request cannot hold the event loop in a JSON parse (its answer parses it anyway, on the server).
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from fleet import balancer
from kernel.asgi_scope import api_key_id, header

PARSE_MAX_BYTES = 256 * 1024


def _document(body: bytes) -> dict[str, Any] | None:
    if not body or len(body) > PARSE_MAX_BYTES or body[:1] not in (b"{", b" ", b"\n", b"\r", b"\t"):
        return None
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return document if isinstance(document, dict) else None


def session_key(scope: dict[str, Any], body: bytes) -> bytes | None:
    """The session a request belongs to: X-Session-Id, else the body's `user`, else its API key; None."""
    session = header(scope, b"x-session-id")
    if session:
        return b"session:" + session.encode("utf-8", "replace")
    document = _document(body)
    user = document.get("user") if document is not None else None
    if isinstance(user, str) and user:
        return b"user:" + user.encode("utf-8", "replace")
    key_id = api_key_id(scope)
    return None if key_id is None else f"key:{key_id}".encode()


def _text(content: Any) -> str:
    """A message's content as text (a string, or the text parts of a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _head_and_tail(text: str, limit: int) -> str:
    """`text`, or when longer than `limit` its first and last halves of `limit` characters."""
    if len(text) <= limit:
        return text
    head = limit - limit // 2
    return text[:head] + text[len(text) - limit // 2 :]


def leading_text(document: dict[str, Any], limit: int) -> str | None:
    """The request's leading prompt text, at most `limit` characters (see the module), or None."""
    messages = document.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            part = f"{message.get('role', '')}\n{_text(message.get('content'))}\n"
            parts.append(part)
            if message.get("role") == "user":
                break
        return _head_and_tail("".join(parts), limit)
    prompt = document.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0] if isinstance(prompt[0], (str, list)) else prompt
        if isinstance(prompt, list):  # token ids
            prompt = " ".join(str(t) for t in prompt[:limit])
    return prompt[:limit] if isinstance(prompt, str) else None


def prefix_key(body: bytes) -> bytes | None:
    """The request's leading prompt text as bytes (see the module); None for an empty body."""
    limit = settings.ROUTING_PREFIX_CHARS
    document = _document(body)
    text = leading_text(document, limit) if document is not None else None
    if text is not None:
        return text.encode("utf-8", "replace")
    return body[:limit] or None


def requested_model(body: bytes) -> str | None:
    """The `model` an OpenAI request names (an endpoint's LoRA adapter routes by it), or None."""
    document = _document(body)
    model = document.get("model") if document is not None else None
    return model if isinstance(model, str) and model else None


def affinity_key(policy: str, scope: dict[str, Any], body: bytes) -> bytes | None:
    """The key `policy` routes this request by (None: by load)."""
    if policy == balancer.SESSION:
        return session_key(scope, body)
    if policy == balancer.PREFIX:
        return prefix_key(body)
    return None
