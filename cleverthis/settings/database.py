"""The one rule that names the database, for the settings and the `.ci` scripts alike.

`DATABASE_URL` names the database the control plane uses. `CLEVERTHIS_DB_NAME` is a shorthand for the
local default URL (`postgres://postgres@127.0.0.1:5432/<name>`) used only when `DATABASE_URL` is unset;
both set and naming different databases is refused with a sentence saying so. Standard library only: the
`.ci` scripts run this file (`python3 cleverthis/settings/database.py name|url|maintenance-url`) before the
virtualenv exists.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from urllib.parse import unquote, urlparse, urlunparse

DEFAULT_NAME = "cleverthis"
LOCAL_URL = "postgres://postgres@127.0.0.1:5432/{name}"


class DatabaseSettingError(ValueError):
    """DATABASE_URL and CLEVERTHIS_DB_NAME disagree, or DATABASE_URL is not a PostgreSQL URL."""


def database_name(url: str) -> str:
    """The database a PostgreSQL URL names (`cleverthis` when its path is empty)."""
    return unquote(urlparse(url).path.lstrip("/")) or DEFAULT_NAME


def database_url(environ: Mapping[str, str]) -> str:
    """The database URL `environ` names: `DATABASE_URL`, else the local URL for `CLEVERTHIS_DB_NAME`."""
    url = (environ.get("DATABASE_URL") or "").strip()
    name = (environ.get("CLEVERTHIS_DB_NAME") or "").strip()
    if not url:
        return LOCAL_URL.format(name=name or DEFAULT_NAME)
    scheme = urlparse(url).scheme
    if scheme not in {"postgres", "postgresql", "pgsql"}:
        raise DatabaseSettingError(f"DATABASE_URL must be a PostgreSQL URL (postgres://…), not a {scheme!r} one.")
    if name and name != database_name(url):
        raise DatabaseSettingError(
            f"DATABASE_URL names the database {database_name(url)!r} but CLEVERTHIS_DB_NAME names {name!r}: "
            "unset CLEVERTHIS_DB_NAME (DATABASE_URL is the one the control plane reads) or make them agree."
        )
    return url


def maintenance_url(url: str) -> str:
    """The same server and credentials, database `postgres`: where a missing database can be created from."""
    return urlunparse(urlparse(url)._replace(path="/postgres", query=""))


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    """`name`, `url` or `maintenance-url` of the configured database on stdout; exit 2 with the reason if the
    settings disagree."""
    try:
        url = database_url(environ)
    except DatabaseSettingError as exc:
        print(exc, file=sys.stderr)
        return 2
    what = argv[0] if argv else "url"
    answers = {"name": database_name(url), "url": url, "maintenance-url": maintenance_url(url)}
    if what not in answers:
        print(f"usage: database.py {'|'.join(answers)}", file=sys.stderr)
        return 64
    print(answers[what])
    return 0


if __name__ == "__main__":
    import os

    sys.exit(main(sys.argv[1:], os.environ))
