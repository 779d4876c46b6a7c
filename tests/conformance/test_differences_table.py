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
