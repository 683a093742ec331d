"""The names of the origins node content is served on: hostnames, their URLs, and the id in a host.

What a node serves is proxied only on a hostname of its own, never on the control plane's:

- `endpoint-<slug>.<ENDPOINT_DOMAIN>` for inference endpoints,
- `serve-<deployment id>.<ENDPOINT_DOMAIN>` for Ray Serve deployments,
- `ray-<cluster id>.<RAY_DASHBOARD_DOMAIN>` for Ray Dashboards.

Pure functions over settings, so models may name their origin without loading the proxy. Who may
enter an origin (tickets, the origin cookie) is `fleet.proxy.origins`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@dataclass(frozen=True)
class OriginKind:
    """One family of node origins: `<prefix>-<id>.<domain>`."""

    prefix: str
    id_pattern: str
    domain_setting: str

    @property
    def domain(self) -> str:
        return str(getattr(settings, self.domain_setting)).lower().strip(".")

    def host(self, ident: Any) -> str:
        """The hostname (no port) of the origin of `ident`."""
        return f"{self.prefix}-{ident}.{self.domain}"

    def ident(self, host: str) -> str | None:
        """The id in `host` when it is an origin of this kind, else None."""
        if not host.startswith(self.prefix):  # (most hosts: no pattern to match)
            return None
        match = _origin_pattern(self.prefix, self.id_pattern, self.domain).fullmatch(host)
        return match.group(1) if match else None


@functools.lru_cache(maxsize=64)
def _origin_pattern(prefix: str, id_pattern: str, domain: str) -> re.Pattern[str]:
    """`<prefix>-<id>.<domain>`, compiled once per domain (every proxied request asks several times)."""
    return re.compile(rf"{prefix}-({id_pattern})\.{re.escape(domain)}")


ENDPOINT = OriginKind("endpoint", r"[0-9a-f]{12}", "ENDPOINT_DOMAIN")
SERVE = OriginKind("serve", _UUID, "ENDPOINT_DOMAIN")
DASHBOARD = OriginKind("ray", _UUID, "RAY_DASHBOARD_DOMAIN")
KINDS = (ENDPOINT, SERVE, DASHBOARD)


def is_node_origin_host(host: str) -> bool:
    """Whether `host` (lower-case, no port) is an origin of node content (any kind)."""
    return any(kind.ident(host) for kind in KINDS)


def public_url(host: str) -> str:
    """The URL shown for a node origin: NODE_ORIGIN_SCHEME (https unless set) and NODE_ORIGIN_PORT."""
    scheme = settings.NODE_ORIGIN_SCHEME or "https"
    port = settings.NODE_ORIGIN_PORT
    return f"{scheme}://{host}" + (f":{port}" if port else "")
