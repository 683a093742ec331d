"""Import the model catalog file (or refresh it after an edit): curated models made exactly the file's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.workloads.catalog import CatalogError
from fleet.workloads.services import catalog_import


class Command(BaseCommand):
    """`catalog_import [--file PATH]`: check the whole file, then create, update and remove curated models."""

    help = "Import the curated model catalog (fleet/workloads/catalog.yaml, or --file) into the database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--file", type=Path, default=None, help="A catalog YAML file (default: the repository's).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            outcome = catalog_import(path=options["file"])
        except (CatalogError, OSError) as exc:
            raise CommandError(f"catalog not imported: {exc}") from None
        self.stdout.write(
            f"catalog version {outcome['version']}: {outcome['created']} added, {outcome['updated']} updated, "
            f"{outcome['removed']} removed"
        )
