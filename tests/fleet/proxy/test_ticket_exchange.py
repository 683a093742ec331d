"""Redeeming a ticket on a node origin (`tickets.exchange_ticket`) with whatever `next` a link carries.

Finding (black-box probe): `next=/logs/€` answered 500 (`UnicodeEncodeError` building the Location
header) after the ticket was already used up. `next` is now percent-encoded, must be a path on the same
origin, and a request refused for bad input leaves the ticket unused.
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote

import pytest

from fleet.proxy import origins, tickets

HOST = origins.ENDPOINT.host("a" * 12)


def exchange(ticket: str, next_value: str | None, *, raw_query: bytes | None = None, method: str = "GET") -> dict:
    query = f"ticket={quote(ticket)}" + ("" if next_value is None else f"&next={quote(next_value, safe='')}")
    scope = {
        "type": "http",
        "method": method,
        "path": origins.TICKET_PATH,
        "query_string": raw_query if raw_query is not None else query.encode(),
        "headers": [(b"host", f"{HOST}:8000".encode())],
        "scheme": "http",
    }
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(tickets.exchange_ticket(scope, send))
    return {"status": sent[0]["status"], "headers": dict(sent[0]["headers"]), "body": sent[1]["body"].decode()}


@pytest.fixture
def ticket(owner) -> str:
    return origins.ticket_for(user_id=owner.pk, host=HOST)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("next_value", "location"),
    [
        ("/logs/€", b"/logs/%E2%82%AC"),
        ("/a b/ü?q=ö&x=1#frag", b"/a%20b/%C3%BC?q=%C3%B6&x=1#frag"),
        ("/already%20encoded/", b"/already%20encoded/"),
        ("/x\r\nSet-Cookie: a=b", b"/x%0D%0ASet-Cookie:%20a=b"),
        (None, b"/"),
    ],
)
def test_next_is_percent_encoded_into_the_location(ticket, next_value, location):
    answer = exchange(ticket, next_value)
    assert answer["status"] == 302, answer
    assert answer["headers"][b"location"] == location
    assert answer["headers"][b"set-cookie"].startswith(f"{origins.ORIGIN_COOKIE}=".encode())


@pytest.mark.django_db
@pytest.mark.parametrize("next_value", ["https://evil.example/", "//evil.example/x", "/\\evil.example", "evil", ""])
def test_a_next_that_is_no_path_here_is_refused_and_the_ticket_stays_unused(ticket, next_value):
    refused = exchange(ticket, next_value)
    assert refused["status"] == 400
    assert "next" in refused["body"]
    assert b"set-cookie" not in refused["headers"]
    assert exchange(ticket, "/")["status"] == 302  # the ticket was not used up


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("raw_next", "location"), [(b"/%FF%FE", b"/%FF%FE"), (b"/\xe2\x82", b"/%E2%82"), (b"/%E2%82%AC", b"/%E2%82%AC")]
)
def test_bytes_that_are_no_utf_8_go_on_as_they_came(ticket, raw_next, location):
    raw = f"ticket={quote(ticket)}&next=".encode() + raw_next
    answer = exchange(ticket, None, raw_query=raw)
    assert (answer["status"], answer["headers"][b"location"]) == (302, location)


@pytest.mark.django_db
def test_a_ticket_is_used_once(ticket):
    assert exchange(ticket, "/x")["status"] == 302
    assert exchange(ticket, "/x")["status"] == 403
