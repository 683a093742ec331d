"""The client's address, one rule for every reader: the socket's peer, unless that peer is a trusted proxy.

`ForwardedClientMiddleware` wraps the ASGI application (`cleverthis.asgi`): a connection whose peer is one of
TRUSTED_PROXIES (addresses, networks or host names; empty: none) has its `client` and `scheme` taken from
`X-Forwarded-For` / `X-Forwarded-Proto` (the rightmost address that is not itself a trusted proxy); anyone
else's headers are ignored. A forwarded value that is not an IP address is ignored too (the peer stays the
client), so the address every reader sees is always a valid IP. The readers:

- `scope_client_ip(scope)`: ASGI code (the tunnel proxy, endpoint keys' last use);
- `request_client_ip(request)`: Django requests (request limits, API keys' last use), `REMOTE_ADDR` being
  the scope's client.

Host names in TRUSTED_PROXIES (the compose stack trusts `proxy`, its HAProxy service) are resolved when the
first connection comes, then again every `resolve_every_s`, and at most once a second when a peer that is
not trusted sends `X-Forwarded-For` (a proxy restarted with a new address is trusted again within a second).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# The most X-Forwarded-For entries looked at (a chain of proxies is short; a longer header is junk).
MAX_FORWARDED_ENTRIES = 16
_RESOLVE_TIMEOUT_S = 2.0
_UNTRUSTED_RESOLVE_EVERY_S = 1.0


def parse_ip(value: str) -> IPAddress | None:
    """`value` as an IP address (`1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]:80`), or None when it is not one."""
    text = value.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    if not text or len(text) > 64:
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def valid_ip(value: Any) -> str | None:
    """`value` written as a canonical IP address, or None when it is not one."""
    if not isinstance(value, str):
        return None
    address = parse_ip(value)
    return str(address) if address is not None else None


def scope_client_ip(scope: dict[str, Any]) -> str | None:
    """The address an ASGI connection came from (after `ForwardedClientMiddleware`), or None."""
    client = scope.get("client")
    return valid_ip(client[0]) if client else None


def request_client_ip(request: Any) -> str | None:
    """The address a Django request came from (its `REMOTE_ADDR`, the scope's client), or None."""
    return valid_ip(request.META.get("REMOTE_ADDR"))


def check_trusted_proxies(entries: Iterable[str]) -> list[str]:
    """What is wrong with a TRUSTED_PROXIES list (empty: nothing): `*` or a malformed entry."""
    errors = []
    for entry in entries:
        if entry == "*" or entry.startswith("0.0.0.0/0") or entry == "::/0":
            errors.append(f"{entry!r} would trust every client's X-Forwarded-For: name the proxy's address")
        elif "/" in entry:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                errors.append(f"{entry!r} is not a network")
        elif parse_ip(entry) is None and not _host_name(entry):
            errors.append(f"{entry!r} is neither an address, a network nor a host name")
    return errors


def _host_name(entry: str) -> bool:
    labels = entry.rstrip(".").split(".")
    return 0 < len(entry) <= 253 and all(
        0 < len(label) <= 63 and label.replace("-", "").replace("_", "").isalnum() for label in labels
    )


class TrustedProxies:
    """The peers whose forwarded headers are believed: addresses, networks, and host names resolved now and then."""

    def __init__(self, entries: Iterable[str], *, resolve_every_s: float = 30.0) -> None:
        self.addresses: set[IPAddress] = set()
        self.networks: list[IPNetwork] = []
        self.names: list[str] = []
        for entry in entries:
            if "/" in entry:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            elif (address := parse_ip(entry)) is not None:
                self.addresses.add(address)
            else:
                self.names.append(entry)
        self.resolve_every_s = resolve_every_s
        self.resolved: set[IPAddress] = set()
        self._resolved_at = -1e9
        self._resolving: asyncio.Future[None] | None = None

    def __bool__(self) -> bool:
        return bool(self.addresses or self.networks or self.names)

    def trusts(self, address: IPAddress) -> bool:
        """Whether `address` is a trusted proxy (as of the last resolution of the names)."""
        return address in self.addresses or address in self.resolved or any(address in net for net in self.networks)

    async def refresh(self, *, untrusted_forwarder: bool = False) -> None:
        """Resolve the host names again when due (callers waiting meanwhile share the one resolution)."""
        if not self.names:
            return
        age = time.monotonic() - self._resolved_at
        due = age >= self.resolve_every_s or (untrusted_forwarder and age >= _UNTRUSTED_RESOLVE_EVERY_S)
        if not due and self._resolving is None:
            return
        if self._resolving is None:
            self._resolved_at = time.monotonic()
            self._resolving = asyncio.ensure_future(self._resolve())
        resolving = self._resolving
        try:
            await asyncio.shield(resolving)
        finally:
            if self._resolving is resolving and resolving.done():
                self._resolving = None

    async def _resolve(self) -> None:
        loop = asyncio.get_running_loop()
        found: set[IPAddress] = set()
        for name in self.names:
            try:
                infos = await asyncio.wait_for(
                    loop.getaddrinfo(name, None, type=socket.SOCK_STREAM), timeout=_RESOLVE_TIMEOUT_S
                )
            except (TimeoutError, OSError) as exc:
                log.warning("trusted proxy %s does not resolve (%s): its forwarded headers are ignored", name, exc)
                continue
            found |= {address for *_, sockaddr in infos if (address := parse_ip(str(sockaddr[0]))) is not None}
        self.resolved = found


def forwarded_client(headers: Iterable[tuple[bytes, bytes]], proxies: TrustedProxies) -> IPAddress | None:
    """The client a trusted proxy names in `X-Forwarded-For`: the rightmost entry that is not a trusted proxy
    itself (the leftmost when all are). None when there is no header, or an entry on the way is not an IP
    address (the whole header is ignored then)."""
    values = [value for name, value in headers if name == b"x-forwarded-for"]
    if not values:
        return None
    entries = b",".join(values).decode("latin-1").split(",")
    if len(entries) > MAX_FORWARDED_ENTRIES:
        return None
    client = None
    for entry in reversed(entries):
        address = parse_ip(entry)
        if address is None:
            return None
        client = address
        if not proxies.trusts(address):
            break
    return client


def _forwarded_scheme(headers: Iterable[tuple[bytes, bytes]], kind: str) -> str | None:
    value = next((v for n, v in headers if n == b"x-forwarded-proto"), None)
    if value is None:
        return None
    scheme = value.decode("latin-1").strip().lower()
    if scheme not in ("http", "https"):
        return None
    return scheme.replace("http", "ws") if kind == "websocket" else scheme


class ForwardedClientMiddleware:
    """ASGI middleware: the client and scheme a trusted proxy forwarded, in place of the proxy's own."""

    def __init__(self, app: Any, proxies: TrustedProxies) -> None:
        self.app = app
        self.proxies = proxies

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] in ("http", "websocket") and self.proxies:
            scope = await self._rewritten(scope)
        return await self.app(scope, receive, send)

    async def _rewritten(self, scope: dict[str, Any]) -> dict[str, Any]:
        client = scope.get("client")
        peer = parse_ip(str(client[0])) if client else None
        if peer is None:
            return scope
        headers = scope.get("headers") or []
        if not any(name in (b"x-forwarded-for", b"x-forwarded-proto") for name, _ in headers):
            return scope
        await self.proxies.refresh()
        if not self.proxies.trusts(peer):
            await self.proxies.refresh(untrusted_forwarder=True)
            if not self.proxies.trusts(peer):
                return scope
        scope = dict(scope)
        forwarded = forwarded_client(headers, self.proxies)
        if forwarded is not None:
            scope["client"] = (str(forwarded), 0)
        scheme = _forwarded_scheme(headers, scope["type"])
        if scheme is not None:
            scope["scheme"] = scheme
        return scope
