"""Canonical call keys: one key per call, whatever shape the arguments arrive in."""

from __future__ import annotations

import datetime as dt
import decimal
import pickle
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.utils import json as kombu_json

from tasklock.errors import ConfigurationError, KeyEncodingError
from tasklock.signature import CallKey, canonical_json


def settle(account_id: int, day: str = "today", *, dry_run: bool = False) -> None: ...


def flexible(a: Any, *rest: Any, fence_token: Any = None, **extra: Any) -> None: ...


def test_positional_keyword_and_defaults_give_one_key() -> None:
    key = CallKey(settle, "t.settle")
    forms = [
        ((1,), {}),
        ((), {"account_id": 1}),
        ((1, "today"), {}),
        ((1,), {"day": "today", "dry_run": False}),
    ]
    assert len({key.digest(a, k) for a, k in forms}) == 1
    assert key.digest((2,), {}) != key.digest((1,), {})
    assert key.digest((1, "tomorrow"), {}) != key.digest((1,), {})


def test_tuples_and_lists_alike_and_dict_key_order_irrelevant() -> None:
    key = CallKey(flexible, "t.flexible")
    assert key.digest(((1, 2),), {}) == key.digest(([1, 2],), {})
    assert key.digest(({"b": 1, "a": 2},), {}) == key.digest(({"a": 2, "b": 1},), {})


def test_var_arguments_are_part_of_the_key() -> None:
    key = CallKey(flexible, "t.flexible", exclude={"fence_token"})
    assert key.canonical((1, 2), {"x": 3}) == '{"a":1,"extra":{"x":3},"rest":[2]}'
    assert key.digest((1,), {"x": 2}) == key.digest((), {"a": 1, "x": 2})


def test_excluded_arguments_never_count() -> None:
    key = CallKey(flexible, "t.flexible", exclude={"fence_token"})
    assert key.digest((1,), {"fence_token": 5}) == key.digest((1,), {})


def test_key_subset() -> None:
    key = CallKey(settle, "t.settle", key=["account_id"])
    assert key.digest((1, "a"), {}) == key.digest((1, "b"), {"dry_run": True})
    assert key.digest((1,), {}) != key.digest((2,), {})


def test_key_callable_receives_arguments_as_passed() -> None:
    seen: list[Any] = []

    def pick(*args: Any, **kwargs: Any) -> Any:
        seen.append((args, kwargs))
        return kwargs.get("account_id", args[0] if args else None)

    key = CallKey(settle, "t.settle", key=pick)
    assert key.digest((7,), {}) == key.digest((), {"account_id": 7})
    assert seen == [((7,), {}), ((), {"account_id": 7})]


def test_key_naming_a_missing_argument_fails_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="'acount_id'.*t.settle takes"):
        CallKey(settle, "t.settle", key=["acount_id"])


def test_key_naming_the_fencing_keyword_fails() -> None:
    with pytest.raises(ConfigurationError, match="fencing keyword"):
        CallKey(flexible, "t.f", key=["fence_token"], exclude={"fence_token"})


class Account:
    pass


@pytest.mark.parametrize(
    "value", [Account(), object(), float("nan"), {1, Account()}, {Account(): 1}, lambda: 1]
)
def test_unencodable_argument_names_itself_and_its_type(value: Any) -> None:
    key = CallKey(settle, "t.settle")
    with pytest.raises(KeyEncodingError, match="argument 'account_id'") as info:
        key.digest((value,), {})
    assert "0x" not in str(info.value)  # never a repr with a memory address


def test_wrong_arguments_are_a_type_error_naming_the_task() -> None:
    with pytest.raises(TypeError, match=r"t\.settle"):
        CallKey(settle, "t.settle").digest((1, 2, 3), {})


def test_rich_types_are_tagged_not_confused_with_text() -> None:
    when = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
    assert canonical_json(when) != canonical_json(when.isoformat())
    assert canonical_json(uuid.UUID(int=1)) != canonical_json(str(uuid.UUID(int=1)))
    assert canonical_json(decimal.Decimal("1.10")) == canonical_json(decimal.Decimal("1.1"))
    assert canonical_json(b"\x00") != canonical_json("00")
    assert canonical_json({3, 1, 2}) == canonical_json(frozenset({2, 1, 3}))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    args=st.lists(json_values, max_size=3),
    extra=st.dictionaries(st.text(max_size=5).filter(lambda s: s != "a"), json_values, max_size=3),
)
def test_producer_and_celery_worker_agree_after_json_round_trip(
    args: list[Any], extra: dict[str, Any]
) -> None:
    """What the producer hashes equals what the worker hashes after kombu's JSON round trip."""
    key = CallKey(flexible, "t.flexible")
    call_args = [0, *args]
    sent = kombu_json.loads(kombu_json.dumps([call_args, extra]))
    assert key.digest(call_args, extra) == key.digest(sent[0], sent[1])


@settings(max_examples=100, deadline=None)
@given(args=st.lists(json_values, max_size=3))
def test_producer_and_rq_worker_agree_after_pickle_round_trip(args: list[Any]) -> None:
    key = CallKey(flexible, "t.flexible")
    call_args = [0, *args]
    assert key.digest(call_args, {}) == key.digest(pickle.loads(pickle.dumps(call_args)), {})


def test_kombu_round_trip_of_rich_types_keeps_the_key() -> None:
    key = CallKey(flexible, "t.flexible")
    call = [uuid.UUID(int=5), dt.datetime(2026, 1, 1, tzinfo=dt.UTC), decimal.Decimal("2.50")]
    sent = kombu_json.loads(kombu_json.dumps(call))
    assert key.digest(call, {}) == key.digest(sent, {})


def plain_shape(a: Any, b: Any = 2, c: Any = None, fence_token: Any = None) -> None: ...


_calls = st.tuples(
    st.lists(st.integers(), max_size=5),
    st.dictionaries(
        st.sampled_from(["a", "b", "c", "d", "fence_token"]), st.integers(), max_size=4
    ),
)


@settings(max_examples=300, deadline=None)
@given(_calls)
def test_the_quick_binding_agrees_with_inspect_on_every_call(call: Any) -> None:
    """Issue 28: the common signature is bound without inspect (its bind was most of the key's
    cost). For every call, fitting or not, it gives what inspect gives, or inspect's own error."""
    args, kwargs = call
    key = CallKey(plain_shape, "t.plain", exclude=["fence_token"])
    assert key._names is not None  # the quick path is taken
    kwargs = {k: v for k, v in kwargs.items() if k != "fence_token"}
    try:
        expected: Any = key._bound_by_inspect(tuple(args), kwargs)
    except TypeError as exc:
        expected = str(exc)
    try:
        got: Any = key.bound(tuple(args), kwargs)
    except TypeError as exc:
        got = str(exc)
    assert got == expected
