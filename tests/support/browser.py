"""Chromium for the browser tests: the distribution's build driven by Playwright, one way for every test.

Chromium comes from the distribution (`apt-get install chromium`, see .ci/setup); Playwright never downloads a
browser here. Without /usr/bin/chromium the tests marked `needs_chromium` are skipped with that reason.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.db import connections

from tests.support.environment import missing, needs

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking")
needs_chromium = needs(CHROMIUM.exists(), "Chromium is not installed", "apt-get install chromium")


@contextlib.contextmanager
def chromium(*extra_args: str) -> Iterator[Any]:
    """A headless Chromium (Playwright's sync API), closed however the block ends.

    Playwright's sync API keeps an event loop running in this thread; the tests' ORM calls are still plain
    synchronous code, so DJANGO_ALLOW_ASYNC_UNSAFE is set for the block (Django's documented escape hatch for
    this case) and restored after. Playwright resumes the test in a copy of its contextvars context, where
    Django keeps the connection of the test's own ORM calls: it is closed here, in that context, or the test
    database would still be in use when the session drops it.
    """
    try:
        from playwright import sync_api
    except ImportError:
        missing("Playwright is not installed", "pip install -r requirements/dev.txt")
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=[*ARGS, *extra_args])
            try:
                yield browser
            finally:
                connections.close_all()
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def watched_page(
    context: Any, *, responses: bool = True, console: bool = True, timeout_ms: int = 15000
) -> tuple[Any, list[str]]:
    """A new page of `context` and the list its errors go to: uncaught page errors, and (where asked) every
    response of status 400 or more and console errors."""
    page = context.new_page()
    page.set_default_timeout(timeout_ms)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    if responses:
        page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    if console:
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    return page, errors


def sign_in(page: Any, base: str, username: str, password: str) -> None:
    """Sign in on the control plane's login page and land on the home page."""
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
