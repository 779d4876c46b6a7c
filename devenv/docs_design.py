"""The design docs that are rendered from data: `make docs-design`.

``docs/design/nova-differences.yaml`` is the table of every difference
between node-agent and nova that the conformance tests allow
(``tests/conformance/differences.py`` reads it); this module checks its
shape and renders it into ``docs/design/nova-differences.md``, so the tests
read data, never Markdown (STYLE.md habit 16).
``tests/conformance/test_differences_table.py`` fails when the committed
page differs from what :func:`render` makes of the data.

    python -m devenv.docs_design          # rewrite the page
    python -m devenv.docs_design --check  # exit 1 when it is stale
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DIFFERENCES = REPO / "docs" / "design" / "nova-differences.yaml"
DIFFERENCES_PAGE = REPO / "docs" / "design" / "nova-differences.md"

_FIELDS = ("id", "area", "difference", "reason")
_ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_AREA = re.compile(r"^[a-z_]+$")


@dataclass(frozen=True)
class Difference:
    """One row: ``id`` and ``area`` are what the tests match, ``difference``
    and ``reason`` are Markdown for people."""

    id: str
    area: str
    difference: str
    reason: str


@dataclass(frozen=True)
class DifferencesTable:
    about: str
    rows: tuple[Difference, ...]


def parse_differences(text: str, source: str = "nova-differences.yaml") -> DifferencesTable:
    """The table from the YAML text. Raises ``ValueError`` naming the row
    and the field for a missing or unknown field, a malformed id or area, an
    empty text, a duplicated id, or a cell that would break the table (a
    ``|`` or a line break)."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or set(doc) != {"about", "rows"}:
        raise ValueError(f"{source}: expected exactly the keys 'about' and 'rows'")
    if not isinstance(doc["about"], str) or not doc["about"].strip():
        raise ValueError(f"{source}: 'about' must be non-empty text")
    if not isinstance(doc["rows"], list) or not doc["rows"]:
        raise ValueError(f"{source}: 'rows' must be a non-empty list")
    rows: list[Difference] = []
    seen: set[str] = set()
    for n, row in enumerate(doc["rows"]):
        where = f"{source}: rows[{n}]"
        if not isinstance(row, dict) or set(row) != set(_FIELDS):
            keys = sorted(row) if isinstance(row, dict) else row
            raise ValueError(f"{where}: expected the fields {', '.join(_FIELDS)}, got {keys}")
        for key in _FIELDS:
            value = row[key]
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{where}.{key}: must be non-empty text")
            if "|" in value or "\n" in value:
                raise ValueError(
                    f"{where}.{key}: a '|' or a line break would break the rendered table"
                )
        if not _ID.match(row["id"]):
            raise ValueError(f"{where}.id: {row['id']!r} is not lower-case words joined by '-'")
        if not _AREA.match(row["area"]):
            raise ValueError(f"{where}.area: {row['area']!r} is not a conformance area name")
        if row["id"] in seen:
            raise ValueError(f"{where}.id: {row['id']!r} is listed twice")
        seen.add(row["id"])
        rows.append(Difference(**{key: row[key] for key in _FIELDS}))
    return DifferencesTable(about=doc["about"].strip(), rows=tuple(rows))


def load_differences(path: Path = DIFFERENCES) -> DifferencesTable:
    return parse_differences(path.read_text(encoding="utf-8"), source=str(path.name))


def render(table: DifferencesTable) -> str:
    """The Markdown page: a notice that it is generated, the text, the table."""
    lines = [
        "<!-- Generated from nova-differences.yaml by `make docs-design`"
        " (devenv/docs_design.py): do not edit. -->",
        "",
        "# Where node-agent differs from nova",
        "",
        table.about,
        "",
        "| id | area | difference | reason |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{r.id}` | {r.area} | {r.difference} | {r.reason} |" for r in table.rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    page = render(load_differences())
    if argv == ["--check"]:
        current = DIFFERENCES_PAGE.read_text(encoding="utf-8") if DIFFERENCES_PAGE.exists() else ""
        if current != page:
            print(
                f"{DIFFERENCES_PAGE.relative_to(REPO)} is stale: run `make docs-design`",
                file=sys.stderr,
            )
            return 1
        return 0
    if argv:
        print("usage: python -m devenv.docs_design [--check]", file=sys.stderr)
        return 2
    DIFFERENCES_PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {DIFFERENCES_PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
