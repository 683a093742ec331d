"""The map matches the house: every production module is named in its folder's row of the README's "Where
things live" table (the deepest row whose folder holds it), so a reader finds the room a change needs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kernel", "cleverthis", "tenancy", "audit", "fleet", "raymgr", "agent")
UNNAMED = {"__init__.py", "apps.py"}  # a package's face, Django's app config: every app has one


def layout_rows() -> dict[str, str]:
    """{folder: the text of its row} from the README's layout table."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| folder | what it holds") :]
    table = table[: table.index("\n\n")]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = line.split("|")
        rows[cells[1].strip().split()[0].strip("`").rstrip("/")] = cells[2] + cells[3]
    return rows


def unnamed_modules(rows: dict[str, str]) -> list[str]:
    """Production modules whose name does not stand (in backticks) in their folder's row."""
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if "migrations" in relative.parts or path.name in UNNAMED:
                continue
            folder = relative.parent.as_posix()
            row = max((f for f in rows if folder == f or folder.startswith(f + "/")), key=len, default=None)
            named = row is not None and re.search(rf"`[^`]*\b{re.escape(path.stem)}\b[^`]*`", rows[row])
            if not named:
                missing.append(f"{relative} (row {row})")
    return missing


def test_the_check_sees_an_unnamed_module():
    rows = {"fleet/proxy": "the relay (`relay`), `streams`"}
    assert "fleet/proxy/tickets.py (row fleet/proxy)" in unnamed_modules(rows)


def test_every_production_module_is_named_in_its_folders_row():
    missing = unnamed_modules(layout_rows())
    assert missing == [], f"modules the README's layout table does not name in their folder's row: {missing}"
