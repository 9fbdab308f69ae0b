"""`is_plain`, the fast path of `check_plain`, never passes what the full walk would refuse.

Hypothesis builds values of every kind the walk judges: plain JSON, and inside it sets, tuples,
bytes, datetimes, NaN, integers past 64 bits, non-str keys, and nesting around the depth limit.
Whenever `is_plain` says yes, `check_plain` must accept; whenever `check_plain` refuses, `is_plain`
must have said no. And on plain JSON (the common case) it must say yes."""

from __future__ import annotations

import math
from datetime import date

from hypothesis import given
from hypothesis import strategies as st

from eventlog import InvalidArgumentError, limits
from eventlog._plain import check_plain, is_plain

plain_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
odd_scalars = (
    st.integers(min_value=2**64)
    | st.just(math.nan)
    | st.just(math.inf)
    | st.binary(max_size=3)
    | st.just(date(2026, 1, 1))
    | st.frozensets(st.integers(), max_size=2)
)
plain = st.recursive(
    plain_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=20,
)
anything = st.recursive(
    plain_scalars | odd_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner)
        | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=3)
    ),
    max_leaves=20,
)


def refused(value: object) -> bool:
    try:
        check_plain(value, what="v")
    except InvalidArgumentError:  # LimitExceededError is one too
        return True
    return False


@given(anything)
def test_the_fast_path_never_passes_what_the_walk_refuses(value: object) -> None:
    if is_plain(value):
        assert not refused(value)
    if refused(value):
        assert not is_plain(value)


@given(plain)
def test_plain_json_takes_the_fast_path(value: object) -> None:
    assert is_plain(value)


def nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def test_the_depth_limit_is_the_same_on_both_paths() -> None:
    deepest = nested(limits.value_depth_max)
    assert is_plain(deepest) and not refused(deepest)
    too_deep = nested(limits.value_depth_max + 1)
    assert not is_plain(too_deep) and refused(too_deep)


def test_a_value_that_contains_itself_is_left_to_the_walk() -> None:
    loop: list[object] = []
    loop.append(loop)
    assert not is_plain(loop) and refused(loop)
