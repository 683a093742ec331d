"""CSV exports that a spreadsheet cannot run: every export writes its rows through `SafeWriter`.

A cell whose text begins with `=`, `+`, `-`, `@`, a tab or a carriage return is taken by spreadsheet
programs as a formula (`=HYPERLINK(...)` in a key's or node's name would run in the reader's sheet).
OWASP's rule: such a cell is written with a single quote before it, which the sheet shows as text.
Numbers (int, float) are written as they are: they are values, never formulas.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: Any) -> Any:
    """`value` as a CSV cell: None → "", text starting like a formula → prefixed with `'`, numbers as they are."""
    if value is None:
        return ""
    if isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class SafeWriter:
    """`csv.writer` whose every cell goes through `safe_cell`; `writerow` returns what the file's `write`
    returned (a streamed export passes a file whose `write` returns the line)."""

    def __init__(self, file: Any, **options: Any) -> None:
        self._writer = csv.writer(file, **options)

    def writerow(self, row: Iterable[Any]) -> Any:
        return self._writer.writerow([safe_cell(value) for value in row])
