"""Start-up warnings when node origins share a *site* (registrable domain) with each other or the control plane.

Browsers treat every host of one registrable domain as the same site: SameSite cookies do not separate
them, and a page on one may set cookies for the parent domain that the others receive. Node origins run
workloads' own pages, so `ENDPOINT_DOMAIN` and `RAY_DASHBOARD_DOMAIN` should each be under a registrable
domain of its own, apart from each other and from the control plane's host (as user content is served
from a separate domain elsewhere). `*.localhost` (development) is exempt.

The registrable domain is read from the Public Suffix List where the system has one
(`/usr/share/publicsuffix`, Debian's `publicsuffix` package); without it, the last two labels stand in,
which can only warn more often (e.g. for `*.co.uk` names), never less.

`origin_domain_warnings` is a Django system check (tag `security`, ids `fleet.proxy.W001`/`W002`, shown by
`manage.py check`); `log_origin_domain_warnings` logs the same warnings when the app is ready, since the
ASGI server does not run system checks.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks

log = logging.getLogger("fleet.proxy")

PUBLIC_SUFFIX_LIST = Path("/usr/share/publicsuffix/public_suffix_list.dat")
HINT = (
    "Serve node origins from a registrable domain of their own (one for endpoints, one for dashboards, "
    "neither the control plane's), or at least run behind HTTPS with HTTPS_COOKIES=1."
)


@functools.cache
def _public_suffixes() -> frozenset[str] | None:
    """The rules of the system's Public Suffix List, or None when there is none."""
    try:
        text = PUBLIC_SUFFIX_LIST.read_text(encoding="utf-8")
    except OSError:
        return None
    rules = (line.split()[0].lower() for line in text.splitlines() if line.strip() and not line.startswith("//"))
    return frozenset(rules)


def registrable_domain(host: str) -> str:
    """The site of `host`: its public suffix and one label more (an IP address, or a suffix: itself)."""
    host = host.lower().strip(".")
    try:
        ipaddress.ip_address(host.strip("[]"))
        return host
    except ValueError:
        pass
    labels = host.split(".")
    rules = _public_suffixes()
    if rules is None:
        return ".".join(labels[-2:])
    suffix = 1  # the implicit rule "*": the last label
    for start in range(len(labels)):
        candidate = ".".join(labels[start:])
        if "!" + candidate in rules:
            suffix = len(labels) - start - 1
            break
        wildcard = "*." + ".".join(labels[start + 1 :]) if start + 1 < len(labels) else ""
        if candidate in rules or wildcard in rules:
            suffix = len(labels) - start
            break
    return ".".join(labels[-(suffix + 1) :]) if suffix < len(labels) else host


def _is_local(host: str) -> bool:
    return host == "localhost" or host.endswith(".localhost")


def origin_domain_warnings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A warning for each origin domain sharing a site with the control plane, and one when the two
    origin domains share one."""
    control_host = (urlsplit(settings.CONTROL_PLANE_URL).hostname or "").lower()
    domains = {
        "ENDPOINT_DOMAIN": str(settings.ENDPOINT_DOMAIN).lower().strip("."),
        "RAY_DASHBOARD_DOMAIN": str(settings.RAY_DASHBOARD_DOMAIN).lower().strip("."),
    }
    found: list[checks.CheckMessage] = []
    sites = {name: registrable_domain(domain) for name, domain in domains.items() if not _is_local(domain)}
    if control_host and not _is_local(control_host):
        control_site = registrable_domain(control_host)
        for name, site in sites.items():
            if site == control_site:
                found.append(
                    checks.Warning(
                        f"{name} ({domains[name]}) is on the same site ({site}) as the control plane's host "
                        f"({control_host}): a workload's page there can send the control plane same-site "
                        "requests and set cookies it receives.",
                        hint=HINT,
                        id="fleet.proxy.W001",
                    )
                )
    if len(sites) == 2 and len(set(sites.values())) == 1:
        found.append(
            checks.Warning(
                f"ENDPOINT_DOMAIN ({domains['ENDPOINT_DOMAIN']}) and RAY_DASHBOARD_DOMAIN "
                f"({domains['RAY_DASHBOARD_DOMAIN']}) are on one site ({sites['ENDPOINT_DOMAIN']}): an "
                "endpoint's or a deployment's page can send a Ray Dashboard same-site requests with its cookie.",
                hint=HINT,
                id="fleet.proxy.W002",
            )
        )
    return found


checks.register(origin_domain_warnings, checks.Tags.security)


def log_origin_domain_warnings() -> None:
    """Log the warnings of `origin_domain_warnings` (called when the app is ready: process start-up)."""
    for warning in origin_domain_warnings():
        log.warning("SECURITY: %s %s (%s)", warning.msg, warning.hint, warning.id)
