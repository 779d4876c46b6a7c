"""The rule the differences table sets, checked without nova: it can fail
both ways. The table is data (docs/design/nova-differences.yaml); its page,
docs/design/nova-differences.md, is rendered from it and must be current."""

import re

import pytest

from devenv import docs_design
from tests.conformance import differences
from tests.conformance.differences import UNCLASSIFIED, Observed, check


def test_every_row_of_the_table_has_an_id_and_an_area():
    rows = differences.listed()
    assert rows and all(area for area in rows.values())


def test_an_unlisted_difference_fails():
    observed = Observed("cpu_spec", cases=1)
    for diff_id, area in differences.listed().items():
        if area == "cpu_spec":
            observed.add(diff_id, "listed")
    observed.add(UNCLASSIFIED + " silent", "'1': nova [1], agent [2]")
    with pytest.raises(AssertionError, match="unlisted difference UNCLASSIFIED silent"):
        check(observed, record=False)


def test_a_listed_difference_that_no_longer_occurs_fails():
    with pytest.raises(AssertionError, match="no longer occurs: remove its row"):
        check(Observed("cpu_spec", cases=1), record=False)


def test_a_listed_area_no_test_reported_is_named():
    results = {"cpu_spec": Observed("cpu_spec", cases=1)}
    table = {"spec-empty-item": "cpu_spec", "disk-images-type-pool": "disk_gb"}
    assert differences.unchecked_areas(results, table) == ["disk_gb"]
    results["disk_gb"] = Observed("disk_gb", cases=1)
    assert differences.unchecked_areas(results, table) == []


@pytest.mark.parametrize(
    "selected, deselected, whole",
    [
        ({"test_a.py", "test_b.py"}, 0, True),
        ({"test_a.py"}, 0, False),  # one file given on the command line
        ({"test_a.py", "test_b.py"}, 3, False),  # -k
    ],
)
def test_only_a_run_of_the_whole_suite_can_miss_an_area(selected, deselected, whole):
    assert differences.whole_suite(selected, {"test_a.py", "test_b.py"}, deselected) is whole


def test_the_rendered_page_is_the_data_file_rendered():
    """The page people read says what the tests enforce: after a change to
    the YAML, `make docs-design` must be run and its output committed."""
    page = docs_design.DIFFERENCES_PAGE.read_text(encoding="utf-8")
    assert page == docs_design.render(docs_design.load_differences()), (
        "docs/design/nova-differences.md is stale: run `make docs-design` and commit it"
    )


def test_the_page_shows_every_row_the_tests_read():
    page = docs_design.DIFFERENCES_PAGE.read_text(encoding="utf-8")
    for diff_id, area in differences.listed().items():
        assert f"| `{diff_id}` | {area} |" in page


_ROW = """  - id: spec-empty-item
    area: cpu_spec
    difference: nova skips it
    reason: a typo
"""


@pytest.mark.parametrize(
    "rows, message",
    [
        (_ROW + _ROW, "'spec-empty-item' is listed twice"),
        (_ROW.replace("area: cpu_spec", "area: CPU spec"), "is not a conformance area name"),
        (_ROW.replace("id: spec-empty-item", "id: Spec_Empty"), "is not lower-case words"),
        (
            _ROW.replace("    reason: a typo\n", ""),
            "expected the fields id, area, difference, reason",
        ),
        (_ROW + "    why: extra\n", "expected the fields id, area, difference, reason"),
        (_ROW.replace("reason: a typo", "reason: a | b"), "would break the rendered table"),
        (_ROW.replace("reason: a typo", "reason: ''"), "rows[0].reason: must be non-empty text"),
    ],
)
def test_a_malformed_data_file_is_refused_naming_the_row(rows, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        docs_design.parse_differences("about: text\nrows:\n" + rows)


def test_a_well_formed_row_renders_as_one_table_line():
    table = docs_design.parse_differences("about: text\nrows:\n" + _ROW)
    assert "| `spec-empty-item` | cpu_spec | nova skips it | a typo |" in docs_design.render(table)
