"""Reach node origins (`fleet.proxy.origins`) of a control plane listening on 127.0.0.1 by their names.

Nothing resolves `*.localhost` for `requests` here, so requests go to the server's address with the
origin's name in the Host header, as a browser's would after DNS.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import requests


def redeem_ticket_redirect(base_url: str, location: str) -> dict[str, str]:
    """Follow a control plane's ticket redirect (`location`, an absolute URL on a node origin) against
    the server at `base_url`; return the headers that reach that origin signed in (Host and the cookie)."""
    parts = urlsplit(location)
    host = {"Host": parts.netloc}
    exchanged = requests.get(f"{base_url}{parts.path}?{parts.query}", headers=host, allow_redirects=False, timeout=30)
    assert exchanged.status_code == 302, (exchanged.status_code, exchanged.text)
    cookie = exchanged.headers["set-cookie"].split(";", 1)[0]
    return {**host, "Cookie": cookie}
