"""The rule the README table sets, checked without nova: it can fail both ways."""

import pytest

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


@pytest.mark.parametrize("selected, deselected, whole", [
    ({"test_a.py", "test_b.py"}, 0, True),
    ({"test_a.py"}, 0, False),                  # one file given on the command line
    ({"test_a.py", "test_b.py"}, 3, False),     # -k
])
def test_only_a_run_of_the_whole_suite_can_miss_an_area(selected, deselected, whole):
    assert differences.whole_suite(selected, {"test_a.py", "test_b.py"}, deselected) is whole
