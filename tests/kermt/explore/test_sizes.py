"""--init_size / --acquire_size: a share with a decimal point, a count without; plans that do not fit are refused."""

from __future__ import annotations

import pytest

from kermt.errors import UserError
from kermt.explore.sizes import check_plan, parse_size


@pytest.mark.parametrize("text, library, molecules", [
    ("0.01", 10_560, 106),  # 105.6 rounded up
    ("0.01", 10_000, 100),  # exactly 1 %: no extra molecule from float error
    ("0.001", 50, 1),  # a share too small for the library still scores one
    ("100", 10_000, 100),
    ("1", 5, 1),
    (" 0.5 ", 3, 2),
])
def test_a_size_is_a_share_with_a_decimal_point_and_a_count_without(text, library, molecules):
    assert parse_size(text, "--init_size").molecules(library) == molecules


@pytest.mark.parametrize("text, message", [
    ("1.5", r"^--init_size 1.5: a share of the library must be below 1 \(0.01 is 1 %\); write a count without a "
            r"decimal point \(100\)$"),
    ("1.0", r"must be below 1 .*\(1\)$"),
    ("2e3", r"must be below 1"),
    ("0", r"^--init_size 0: a size must be above 0"),
    ("-0.1", r"must be above 0"),
    ("nan", r"must be above 0"),
    ("ten", r"^--init_size 'ten' is not a size: write a share"),
])
def test_a_size_that_is_neither_is_one_line_naming_the_flag(text, message):
    with pytest.raises(UserError, match=message):
        parse_size(text, "--init_size")


def test_a_plan_larger_than_the_library_is_refused_before_any_work():
    init, acquire = parse_size("10", "--init_size"), parse_size("0.2", "--acquire_size")
    check_plan(init, acquire, iterations=4, library_size=50)  # 10 + 4 x 10 = 50: fits exactly
    with pytest.raises(UserError, match=r"^--init_size 10 and 5 round\(s\) of --acquire_size 0.2 would score 60 "
                                        r"molecules, more than the library's 50; lower --iterations or the sizes$"):
        check_plan(init, acquire, iterations=5, library_size=50)
    with pytest.raises(UserError, match=r"^--acquire_size 60 is larger than the library \(50 molecules\)"):
        check_plan(init, parse_size("60", "--acquire_size"), iterations=0, library_size=50)
    with pytest.raises(UserError, match="the library has no molecule to explore"):
        check_plan(init, acquire, iterations=1, library_size=0)
