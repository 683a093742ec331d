"""The ticket exchange on a node origin: `GET <origin>/__cleverthis/ticket?ticket=…&next=…` trades a
single-use ticket the control plane minted (`origins.ticket_for`) for the origin cookie of that host.

The tickets and cookies themselves are `fleet.proxy.origins`'; this is the request that redeems one.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, quote

from channels.db import database_sync_to_async

from fleet.proxy import origins
from fleet.proxy.answers import URL_SAFE, plain_response


def ticket_next(query_string: bytes) -> bytes | None:
    """The `Location` an exchange goes on to: the query's `next` (default `/`), percent-encoded; None when
    `next` is not a path on this origin. Bytes that are not UTF-8 go on as they came."""
    values = parse_qs(query_string.decode("latin-1"), keep_blank_values=True, encoding="latin-1").get("next")
    if not values:
        return b"/"
    raw = values[0]
    if origins.safe_next(raw) != raw:
        return None
    return quote(raw.encode("latin-1"), safe=URL_SAFE).encode("ascii")


async def exchange_ticket(scope: dict[str, Any], send: Any) -> None:
    """`GET <node origin>/__cleverthis/ticket?ticket=…&next=…`: trade a fresh single-use ticket for the
    origin cookie of this host, then go to `next` (percent-encoded); any other method gets 403.

    The request is checked before the ticket is: one refused for its input (a `next` that is no path on
    this origin: 400) leaves the ticket unused.
    """
    query_string = scope.get("query_string", b"")
    if scope.get("method") != "GET":
        await plain_response(send, 403, "This link expired or was used already: open it again from the control plane.")
        return
    location = ticket_next(query_string)
    if location is None:
        await plain_response(send, 400, "Bad request: next must be a path on this origin (it starts with one /).")
        return
    ticket = (parse_qs(query_string.decode("latin-1")).get("ticket") or [""])[0]
    host = origins.request_host(scope)
    user_id = await database_sync_to_async(origins.redeem_ticket)(ticket, host=host)
    if not user_id:
        await plain_response(send, 403, "This link expired or was used already: open it again from the control plane.")
        return
    secure = origins.origin_url(scope, host).startswith("https:")
    cookie = origins.origin_cookie_header(user_id=user_id, host=host, secure=secure)
    await plain_response(
        send, 302, "Signed in.", [(b"location", location), (b"set-cookie", cookie), (b"cache-control", b"no-store")]
    )
