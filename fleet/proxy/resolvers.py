"""What the proxy does with a request: the registry of resolvers (each app registers its own: endpoints,
Serve deployments, Ray Dashboards) and their answers — a target on a node, a refusal, or a redirect from a
path form on the control plane's host to the node origin."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote
from uuid import UUID

from fleet import admission, balancer
from fleet.proxy import origin_guard, origins
from fleet.proxy.answers import URL_SAFE
from fleet.usage import meter as usage_meter
from kernel.asgi_scope import header
from tenancy.asgi_auth import user_from_scope


@dataclass(frozen=True)
class ProxyTarget:
    """Where a request goes: a port on a node, and the path to send upstream."""

    node_id: UUID
    port: int
    path: str
    node_online: bool = True
    host: str = ""  # an in-cluster host the agent dials (a KubeRay head's Service); '' = the node itself
    meter: str = ""  # the series its requests count in (`request_meter`); '' = not counted
    usage: usage_meter.Subject | None = None  # the endpoint whose usage it counts in (`fleet.usage`)
    # An endpoint's running replicas: an HTTP request goes to the least busy (`balancer`), and one whose
    # connect fails goes once to another; `node_id`/`port` above name the first (a WebSocket goes there).
    replicas: tuple[balancer.Upstream, ...] = ()
    routing: str = balancer.LEAST_LOAD  # the endpoint's routing policy over `replicas` (`balancer.POLICIES`)
    queue: admission.QueuePolicy | None = None  # the endpoint's concurrency limit and wait queue; None: none
    # The endpoint's LoRA adapters: name → (adapter id, keys of the replicas that have it loaded); a request
    # whose `model` names one goes to those replicas (`relay.proxy_http`) and is metered for the adapter too.
    adapters: Mapping[str, tuple[UUID, frozenset[str]]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProxyRefusal:
    """A resolver's answer when the request is recognised but must not be proxied."""

    status: int
    message: str
    headers: tuple[tuple[bytes, bytes], ...] = ()  # e.g. Retry-After
    content_type: bytes = b"text/plain; charset=utf-8"


@dataclass(frozen=True)
class ProxyRedirect:
    """A resolver's answer for a path form on the control plane's host: go to the node origin instead."""

    location: str
    status: int = 307


Answer = ProxyTarget | ProxyRefusal | ProxyRedirect
Resolver = Callable[[dict[str, Any]], Awaitable[Answer | None]]
_resolvers: list[Resolver] = []
CROSS_ORIGIN = (
    "Refused: a request that changes something on this origin must come from a page of this origin "
    "(Origin or Referer header). API clients send an API key (Authorization: Bearer <key>) instead."
)


def register_resolver(resolver: Resolver) -> Resolver:
    """Add a resolver; each returns a target, a refusal, or None when the request is not its business."""
    _resolvers.append(resolver)
    return resolver


async def resolve(scope: dict[str, Any]) -> Answer | None:
    """The first resolver's answer, after the checks every node origin shares (`origin_guard`)."""
    if origins.is_node_origin(scope) and origin_guard.from_elsewhere(scope):
        return ProxyRefusal(403, CROSS_ORIGIN)
    for resolver in _resolvers:
        answer = await resolver(scope)
        if answer is not None:
            return answer
    return None


def redirect_to_origin(scope: dict[str, Any], host: str, path: str) -> ProxyRedirect:
    """The answer to a path form on the control plane's host: the same path on the node origin `host`.

    A signed-in member's GET goes through a ticket (so the browser arrives signed in there); anything else
    is sent on as it is (307 keeps method and body; API clients send their token to the origin).
    Sync: reads the session.
    """
    query = scope.get("query_string", b"").decode("latin-1")
    path = origins.safe_next(path) + (f"?{query}" if query else "")
    if scope.get("method") in ("GET", "HEAD") and not header(scope, b"authorization"):
        user = user_from_scope(scope)
        if user.is_authenticated:
            return ProxyRedirect(origins.ticket_redirect(scope, user_id=user.pk, host=host, next_path=path), 302)
    return ProxyRedirect(origins.origin_url(scope, host) + request_target(path).decode("ascii"))


def request_target(path: str) -> bytes:
    """`path` (with its query) as it may go on the wire: ASCII, percent-encoded where it must be.

    The path part is the decoded text of an ASGI `path` (UTF-8), the query part the raw query decoded as
    Latin-1 (one character per byte): each goes back to its bytes before encoding.
    """
    part, mark, query = path.partition("?")
    encoded = quote(part.encode("utf-8", "surrogateescape"), safe=URL_SAFE)
    if mark:
        encoded += "?" + quote(query.encode("latin-1", "replace"), safe=URL_SAFE)
    return encoded.encode("ascii")
