"""Every CSV export neutralises formula-like cells through one helper (`kernel.csv_export`)."""

from __future__ import annotations

import csv
import io
import re
import uuid
from pathlib import Path

import pytest

from kernel.csv_export import SafeWriter, safe_cell

ROOT = Path(__file__).resolve().parents[2]
CODE = ("audit", "cleverthis", "fleet", "kernel", "raymgr", "tenancy")


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        ("=1+1", "'=1+1"),
        ("+1", "'+1"),
        ("-1", "'-1"),
        ("@A1", "'@A1"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("a=b", "a=b"),
        ("", ""),
        (None, ""),
        (-5, -5),
        (2.5, 2.5),
    ],
)
def test_cells_that_start_like_a_formula_get_a_quote(value, cell):
    assert safe_cell(value) == cell


def test_the_writer_quotes_every_such_cell_and_round_trips():
    ident = uuid.uuid4()
    buffer = io.StringIO()
    SafeWriter(buffer).writerow(["=cmd|'/C calc'!A0", ident, None, 3, 'say "hi", =x'])
    (row,) = csv.reader(io.StringIO(buffer.getvalue()))
    assert row == ["'=cmd|'/C calc'!A0", str(ident), "", "3", 'say "hi", =x']


def test_no_export_writes_csv_around_the_helper():
    """Only `kernel/csv_export.py` may make a csv writer: every other export goes through `SafeWriter`."""
    raw = re.compile(r"\bcsv\.(writer|DictWriter)\(")
    offenders = [
        str(path.relative_to(ROOT))
        for top in CODE
        for path in (ROOT / top).rglob("*.py")
        if path != ROOT / "kernel" / "csv_export.py" and raw.search(path.read_text())
    ]
    assert offenders == []
    users = [
        str(path.relative_to(ROOT))
        for top in CODE
        for path in (ROOT / top).rglob("*.py")
        if "SafeWriter(" in path.read_text() and path != ROOT / "kernel" / "csv_export.py"
    ]
    assert sorted(users) == ["audit/api.py", "fleet/usage/views.py", "fleet/workloads/benchmark_api.py"]
