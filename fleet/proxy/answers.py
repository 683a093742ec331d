"""What the proxy answers by itself (refusals, redirects, errors before or instead of a node's answer), and
how it writes a URL it puts in a request line or a `Location`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

# characters a URL may carry as they are (RFC 3986 reserved and unreserved, and `%` for escapes already
# there); everything else (non-ASCII, spaces, controls, quotes) is percent-encoded
URL_SAFE = "!#$%&'()*+,/:;=?@[]~"


async def plain_response(
    send: Callable[..., Awaitable[None]],
    status: int,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    content_type: bytes = b"text/plain; charset=utf-8",
) -> None:
    """A short answer, text/plain unless told (used for 4xx/5xx and redirects produced by the proxy itself)."""
    body = (message.rstrip("\n") + "\n").encode()
    head = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})
