"""Printing rows: a table streamed page by page (`-o table`, `-o wide`), JSON, YAML, CSV. Only the standard
library at import; YAML is loaded when asked for."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

FORMATS = ("table", "wide", "json", "yaml", "name")


def cell(value: Any) -> str:
    """How one value reads in a table."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, list):
        return ",".join(cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def dump_json(obj: Any, out: TextIO = sys.stdout) -> None:
    out.write(json.dumps(obj, indent=2, default=str) + "\n")


def dump_yaml(obj: Any, out: TextIO = sys.stdout) -> None:
    import yaml

    out.write(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False))


class TableWriter:
    """A table whose widths come from the first batch of rows; later rows are written as they come, so a
    long list prints its first page at once and streams the rest."""

    def __init__(self, columns: Iterable[str], out: TextIO = sys.stdout, *, header: bool = True) -> None:
        self.columns = list(columns)
        self.out = out
        self.header = header
        self.widths: list[int] | None = None

    def _line(self, cells: list[str]) -> str:
        assert self.widths is not None
        return "  ".join(c.ljust(w) for c, w in zip(cells, self.widths, strict=False)).rstrip() + "\n"

    def write(self, rows: list[dict[str, Any]]) -> None:
        cells = [[cell(row.get(c)) for c in self.columns] for row in rows]
        if self.widths is None:
            titles = [c.upper() for c in self.columns]
            self.widths = [max([len(t), *(len(r[i]) for r in cells)]) for i, t in enumerate(titles)]
            if self.header:
                self.out.write(self._line(titles))
        self.out.write("".join(self._line(r) for r in cells))
        self.out.flush()


def batches(rows: Iterable[dict[str, Any]], first: int = 100, size: int = 1000) -> Iterator[list[dict[str, Any]]]:
    """Rows grouped for printing: a first small batch (printed at once), then larger ones."""
    batch: list[dict[str, Any]] = []
    limit = first
    for row in rows:
        batch.append(row)
        if len(batch) >= limit:
            yield batch
            batch, limit = [], size
    if batch:
        yield batch


def print_rows(rows: Iterable[dict[str, Any]], fmt: str, columns: list[str], out: TextIO = sys.stdout) -> int:
    """Print `rows` in `fmt`; answers how many were printed."""
    if fmt in ("json", "yaml"):
        items = list(rows)
        (dump_json if fmt == "json" else dump_yaml)(items, out)
        return len(items)
    if fmt == "name":
        count = 0
        for row in rows:
            out.write(f"{row.get(columns[0])}\n")
            count += 1
        return count
    writer = TableWriter(columns, out)
    count = 0
    for batch in batches(rows):
        writer.write(batch)
        count += len(batch)
    if count == 0:
        sys.stderr.write("Nothing found.\n")
    return count


def print_csv(rows: list[dict[str, Any]], columns: list[str], out: TextIO = sys.stdout) -> None:
    writer = csv.writer(out)
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
