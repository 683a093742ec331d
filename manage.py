#!/usr/bin/env python
"""Django's command-line utility for CleverThis Compute Fleet."""

import os
import sys


def main() -> None:
    """Run administrative tasks; a database the settings cannot use is refused with a sentence, not a traceback."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")
    from django.core.management import execute_from_command_line
    from django.db.utils import OperationalError

    from cleverthis.settings.database import DatabaseSettingError, database_name, database_url

    try:
        execute_from_command_line(sys.argv)
    except DatabaseSettingError as exc:
        sys.exit(f"manage.py: {exc}")
    except OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
        name = database_name(database_url(os.environ))
        sys.exit(
            f"manage.py: the database {name!r} that DATABASE_URL names does not exist on its server: "
            "create it (`bash .ci/database` does, and `bash .ci/up` runs it) or point DATABASE_URL at one that exists."
        )


if __name__ == "__main__":
    main()
