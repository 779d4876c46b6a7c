"""The table of differences from nova (``docs/design/nova-differences.yaml``),
and the rule it sets.

The rule: a difference between node-agent and nova on the same input is a
bug unless the table lists it, by id, with the reason. Each conformance area
reports the differences it observed, by id; :func:`check` fails on an
unlisted one, and on a listed one (of that area) that no longer occurs.
The table is data, read here and rendered into
``docs/design/nova-differences.md`` by ``make docs-design``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from devenv.docs_design import DIFFERENCES, load_differences

TABLE = DIFFERENCES
# A difference no table row can name: always a failure.
UNCLASSIFIED = "UNCLASSIFIED"


def listed() -> dict[str, str]:
    """id -> area, from the table's data file."""
    return {row.id: row.area for row in load_differences(TABLE).rows}


@dataclass
class Observed:
    """What one area saw: the number of cases, and differences by id."""

    area: str
    cases: int = 0
    differences: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def add(self, difference_id: str, example: str) -> None:
        self.differences[difference_id].append(example)


# area -> Observed, for the end-of-run summary (conftest prints it).
RESULTS: dict[str, Observed] = {}


def check(observed: Observed, record: bool = True) -> None:
    """Fail on an unlisted difference, or a listed one of this area that did
    not occur. ``record`` puts the area in the end-of-run summary."""
    if record:
        RESULTS[observed.area] = observed
    table = listed()
    expected = {i for i, area in table.items() if area == observed.area}
    seen = set(observed.differences)
    problems = []
    for diff_id in sorted(seen - expected):
        examples = observed.differences[diff_id][:5]
        where = f" (listed for area {table[diff_id]})" if diff_id in table else ""
        problems.append(
            f"unlisted difference {diff_id}{where} in {len(observed.differences[diff_id])} "
            f"case(s), e.g.:\n    " + "\n    ".join(examples)
        )
    for diff_id in sorted(expected - seen):
        problems.append(
            f"listed difference {diff_id} no longer occurs: remove its "
            f"row from {TABLE.relative_to(TABLE.parents[2])} "
            "(then `make docs-design`)"
        )
    assert not problems, (
        f"{observed.area} ({observed.cases} cases) against nova:\n  " + "\n  ".join(problems)
    )


def unchecked_areas(results: dict[str, Observed], table: dict[str, str]) -> list[str]:
    """Areas the table lists that no test reported: their rows were never
    checked (a test that stopped reporting, or an area renamed)."""
    return sorted(set(table.values()) - set(results))


def whole_suite(selected: set[str], every_file: set[str], deselected: int) -> bool:
    """Whether a run holds every conformance test: every ``test_*.py`` file
    of the directory has a selected test and none was deselected (``-k``).
    Only such a run can say an area went unchecked."""
    return bool(every_file) and every_file <= selected and not deselected
