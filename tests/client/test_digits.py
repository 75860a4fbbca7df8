"""``memorizz.api.digits``: what counts as a number where a peer writes one."""

from __future__ import annotations

import pytest

from memorizz.api.digits import MAX_DIGITS, ascii_int


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("8080", 8080),
        ("007", 7),
        ("9" * MAX_DIGITS, int("9" * MAX_DIGITS)),
        ("9" * (MAX_DIGITS + 1), None),
        ("9" * 5000, None),  # int() itself refuses past 4,300 digits
        ("", None),
        (" 1", None),
        ("1 ", None),
        ("+1", None),
        ("-1", None),
        ("1_000", None),  # int() takes it
        ("\u00b2", None),  # str.isdigit takes it, int() raises
        ("\u0663", None),  # int() takes it as 3
        ("\uff11", None),  # a fullwidth 1: int() takes it too
    ],
)
def test_only_ascii_digits_are_a_number(text: str, value: int | None) -> None:
    assert ascii_int(text) == value


def test_the_digit_limit_is_the_callers() -> None:
    assert ascii_int("65535", max_digits=5) == 65535
    assert ascii_int("065535", max_digits=5) is None
