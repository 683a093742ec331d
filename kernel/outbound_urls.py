"""URLs a tenant names for the control plane to call (a budget's webhook): the public internet only.

A workspace Owner sets the URL, a Celery worker on the control plane's own network POSTs to it, so a URL naming
the loopback, a private or link-local network (a cloud's metadata service at 169.254.169.254), the Redis or
PostgreSQL beside the workers, would let a tenant reach what only the control plane may. `literal_problem`
checks what the URL says (when it is set: an API 400); `resolved_problem` also resolves its host and checks
every address it resolves to (before each call; a name that resolves to a private address is refused then).
Hosts an operator lists (`OUTBOUND_URL_ALLOWED_HOSTS`, e.g. an internal alert relay) are let through.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

SCHEMES = ("http", "https")


def _not_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_global or address.is_multicast


def literal_problem(url: str, allowed_hosts: Iterable[str] = ()) -> str | None:
    """Why the control plane must not call `url`, from the URL alone; None when it may."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        return "Only http and https URLs can be called."
    host = (parts.hostname or "").lower()
    if not host:
        return "The URL names no host."
    if host in {h.lower() for h in allowed_hosts}:
        return None
    if host == "localhost" or host.endswith(".localhost"):
        return f"{host} is this machine: only public addresses can be called."
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if _not_public(address):
        return f"{host} is not a public address: only public addresses can be called."
    return None


def resolved_problem(url: str, allowed_hosts: Iterable[str] = ()) -> str | None:
    """`literal_problem`, then every address the URL's host resolves to must be public; None when it may."""
    allowed = {h.lower() for h in allowed_hosts}
    problem = literal_problem(url, allowed)
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if problem is not None or host in allowed:
        return problem
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError) as error:
        return f"{host} does not resolve: {error}"
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if _not_public(address):
            return f"{host} resolves to {address}, not a public address: only public addresses can be called."
    return None
