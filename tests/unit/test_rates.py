"""The rules of ``tasklock.RateLimit`` that need no server: how a rate is written and parsed
(``parse_rate``), how a list of rates and bursts is checked (``RatePlan.of``), what the script is
sent (``RatePlan.args``, ``micros``) and how its answer reads (``Admission.from_reply``).

Every refused input is a ConfigurationError naming the option and the value as given. The
counting itself is the server's (tests/integration/test_ratelimit.py): nothing here reads a clock,
so no clock is faked.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

import tasklock
import tasklock.asyncio
from tasklock.core.rates import (
    ADMITTED,
    DEFERRED,
    REFUSED,
    Admission,
    RatePlan,
    micros,
    parse_rate,
)
from tasklock.errors import ConfigurationError

UNITS = {
    **dict.fromkeys(("s", "sec", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
}
YEAR = 366 * 86400

# -- parse_rate: what is accepted -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "count", "period", "field"),
    [
        ("10/s", 10, 1, "1000ms"),
        ("20/m", 20, 60, "60000ms"),
        ("100/h", 100, 3600, "3600000ms"),
        ("100000/d", 100_000, 86400, "86400000ms"),
        ("30/5m", 30, 300, "300000ms"),
        ("5/0.5s", 5, 0.5, "500ms"),
        ("3/1.5h", 3, 5400, "5400000ms"),
        ("7", 7, 1, "1000ms"),  # a bare number is per second, as in Celery
        (7, 7, 1, "1000ms"),
        (" 10 / 2 h ", 10, 7200, "7200000ms"),  # spaces anywhere between the parts
        ("10/S", 10, 1, "1000ms"),  # units in any case
        ("010/s", 10, 1, "1000ms"),
        ("1/366d", 1, YEAR, f"{YEAR * 1000}ms"),  # the longest period
        ("1000000/s", 1_000_000, 1, "1000ms"),  # the fastest rate: one call per microsecond
    ],
)
def test_every_form_of_rate(value: Any, count: int, period: float, field: str) -> None:
    rate = parse_rate(value)
    assert (rate.count, rate.period, rate.field) == (count, period, field)
    assert rate.interval_us == pytest.approx(period * 1_000_000 / count, rel=1e-15)
    assert str(rate) == str(value).strip()  # as the user wrote it, for messages and reprs


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_every_unit_word(unit: str) -> None:
    assert parse_rate(f"6/{unit}").period == UNITS[unit]
    assert parse_rate(f"6/2{unit}").period == 2 * UNITS[unit]
    assert parse_rate(f"6/{unit.upper()}").period == UNITS[unit]


def test_the_interval_is_the_period_over_the_count() -> None:
    assert parse_rate("10/s").interval_us == 100_000.0
    assert parse_rate("50/s").interval_us == 20_000.0
    assert parse_rate("20/m").interval_us == 3_000_000.0
    assert parse_rate("3/s").interval_us == pytest.approx(333_333.333333, abs=1e-5)
    assert parse_rate("1000000/s").interval_us == 1.0


# -- parse_rate: what is refused ------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "10/x",
        "10/ms",  # milliseconds are not a unit: "1/ms" is written "1000/s"
        "10/week",
        "10/y",
        "ten/s",
        "10/",
        "/s",
        "s",
        "",
        "   ",
        "10/s/s",
        "10.5/s",  # the count is whole
        "-1/s",
        -5,
        "+3/s",
        "10/5",  # a multiplier needs its unit
        "10/1e3s",
        "10/5.m",
        "10 s",
        "10 per second",
    ],
)
def test_a_malformed_rate_is_refused_naming_the_option_and_the_value(value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_rate(value)
    message = str(info.value)
    assert f"rate={value!r} is not a rate" in message
    assert "'10/s'" in message  # with examples of what is accepted
    assert "units: s, m, h, d" in message


@pytest.mark.parametrize("value", ["0/s", 0, "000", "0/5m", "10/0s", "10/0m", "10/0.0h", "5/0d"])
def test_a_rate_that_admits_nothing_is_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_rate(value)
    message = str(info.value)
    assert f"rate={value!r} admits nothing" in message
    assert "above 0" in message


@pytest.mark.parametrize("value", ["1/367d", "1/8785h", "10/527041m", "1/31622401s", "1/9999999d"])
def test_a_period_over_a_year_is_refused(value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_rate(value)
    message = str(info.value)
    assert f"rate={value!r}: the period is over a year" in message
    assert "'/366d'" in message


@pytest.mark.parametrize("value", ["1/8784h", "1/527040m", "1/31622400s"])
def test_a_period_of_exactly_366_days_is_accepted(value: str) -> None:
    assert parse_rate(value).period == YEAR


@pytest.mark.parametrize(
    "value", ["1000001/s", 1_000_001, "2000000", "60000001/m", "2/0.000001s", "10/0.000005s"]
)
def test_over_a_million_calls_per_second_is_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_rate(value)
    message = str(info.value)
    assert f"rate={value!r} is over a million calls per second" in message
    assert "microseconds" in message


@pytest.mark.parametrize("value", [10.0, 2.5, None, True, False, b"10/s", ["10/s"], {"10/s"}])
def test_a_rate_of_another_type_is_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_rate(value)
    assert str(info.value).startswith(
        f"rate must be a rate such as '10/s' (or a list of them), got {value!r}"
    )


def test_the_option_is_named_as_the_caller_names_it() -> None:
    with pytest.raises(ConfigurationError, match=r"^rate_limit='10/x' is not a rate"):
        parse_rate("10/x", "rate_limit")
    with pytest.raises(ConfigurationError, match=r"^rate_limit=0 admits nothing"):
        parse_rate(0, "rate_limit")
    with pytest.raises(ConfigurationError, match=r"^limits\[1\]='1/367d': the period is over"):
        RatePlan.of(["10/s", "1/367d"], option="limits")


# -- RatePlan.of: lists and bursts ----------------------------------------------------------------


def test_one_rate_and_one_burst() -> None:
    plan = RatePlan.of("10/s")
    assert [r.text for r in plan.rates] == ["10/s"]
    assert plan.bursts == (1,)
    plan = RatePlan.of("10/s", 5)
    assert plan.bursts == (5,)


@pytest.mark.parametrize("rates", [["10/s", "100000/d"], ("10/s", "100000/d")])
def test_a_list_of_rates_shares_one_burst_or_takes_one_each(rates: Any) -> None:
    plan = RatePlan.of(rates, 3)
    assert [r.text for r in plan.rates] == ["10/s", "100000/d"]
    assert plan.bursts == (3, 3)
    assert RatePlan.of(rates, [2, 50]).bursts == (2, 50)
    assert RatePlan.of(rates, (2, 50)).bursts == (2, 50)


def test_what_the_script_is_sent_per_limit() -> None:
    plan = RatePlan.of(["10/s", "3/m"], [2, 1])
    assert plan.args == ("1000ms", "100000.0", 2, "60000ms", "20000000.0", 1)
    # The interval travels as repr(float): every digit Python has, for Lua's tonumber.
    (field, interval, burst) = RatePlan.of("3/s").args
    assert (field, burst) == ("1000ms", 1)
    assert float(interval) == 1_000_000 / 3


def test_describe() -> None:
    assert RatePlan.of("10/s").describe() == "10/s"
    assert RatePlan.of(["10/s", "3/m"]).describe() == "10/s and 3/m"
    assert RatePlan.of(["10/s", "3/m"], [5, 1]).describe() == "10/s and 3/m (burst 5, 1)"


@pytest.mark.parametrize("rate", [[], ()])
def test_an_empty_list_of_rates_is_refused(rate: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"^rate is an empty list: give at least one"):
        RatePlan.of(rate)


def test_a_bad_rate_in_a_list_is_named_by_its_position() -> None:
    with pytest.raises(ConfigurationError) as info:
        RatePlan.of(["10/s", "100/h", "10/fortnight"])
    assert str(info.value).startswith("rate[2]='10/fortnight' is not a rate")
    with pytest.raises(ConfigurationError) as info:
        RatePlan.of(["0/s"])
    assert str(info.value).startswith("rate[0]='0/s' admits nothing")


@pytest.mark.parametrize(
    ("rate", "burst", "said"),
    [
        (["10/s", "100/m"], [1, 2, 3], "burst lists 3 values for 2 rate(s) (10/s, 100/m)"),
        (["10/s", "100/m"], [4], "burst lists 1 values for 2 rate(s) (10/s, 100/m)"),
        ("10/s", [1, 2], "burst lists 2 values for 1 rate(s) (10/s)"),
        (["10/s", "100/m"], [], "burst lists 0 values for 2 rate(s) (10/s, 100/m)"),
    ],
)
def test_a_burst_list_that_does_not_match_the_rates_is_refused(
    rate: Any, burst: Any, said: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        RatePlan.of(rate, burst)
    assert str(info.value).startswith(said)
    assert "one int for all, or one per rate" in str(info.value)


@pytest.mark.parametrize(
    "burst", [0, -1, True, False, 1.0, 2.5, "2", None, [1, 0], [2, True], (1, 1.5), [None, 1]]
)
def test_a_burst_that_is_not_a_whole_number_from_one_is_refused(burst: Any) -> None:
    rate = ["10/s", "100/m"] if isinstance(burst, list | tuple) else "10/s"
    with pytest.raises(ConfigurationError) as info:
        RatePlan.of(rate, burst)
    message = str(info.value)
    assert message.startswith("burst must be a whole number >= 1")
    assert f"got {burst!r}" in message


@pytest.mark.parametrize(
    "rates",
    [
        ["10/s", "20/s"],
        ["10/s", "20/1s"],
        ["10/m", "600/60s"],
        ["1/h", "60/60m", "5/s"],
        ["1/d", "24/24h"],
        ["100000/d", "10/s", "5/1d"],
    ],
)
def test_two_rates_over_the_same_period_are_refused(rates: list[str]) -> None:
    with pytest.raises(ConfigurationError) as info:
        RatePlan.of(rates)
    message = str(info.value)
    assert message.startswith(f"rate has two rates over the same period ({', '.join(rates)})")
    assert "keep one per period" in message


# -- Properties -----------------------------------------------------------------------------------

units = st.sampled_from(sorted(UNITS))


@settings(deadline=None)  # a busy box must not fail a property on time
@given(
    count=st.integers(min_value=1, max_value=10**7),
    multiplier=st.integers(min_value=1, max_value=1000),
    unit=units,
)
def test_a_rate_is_accepted_exactly_when_it_fits_the_bounds(
    count: int, multiplier: int, unit: str
) -> None:
    period = multiplier * UNITS[unit]
    text = f"{count}/{multiplier}{unit}"
    fits = period <= YEAR and period * 1_000_000 / count >= 1
    if not fits:
        with pytest.raises(ConfigurationError, match=re.escape(f"rate={text!r}")):
            parse_rate(text)
        return
    rate = parse_rate(text)
    assert (rate.count, rate.period) == (count, period)
    assert rate.interval_us * count == pytest.approx(period * 1_000_000, rel=1e-12)
    assert rate.interval_us >= 1
    # The same rate written over seconds is the same limit: same field, same interval.
    same = parse_rate(f"{count}/{period}s")
    assert (same.field, same.interval_us) == (rate.field, rate.interval_us)
    assert rate.field == f"{period * 1000}ms"


@settings(deadline=None)  # a busy box must not fail a property on time
@given(
    count=st.integers(min_value=1, max_value=10**6),
    a=st.integers(min_value=1, max_value=1000),
    b=st.integers(min_value=1, max_value=1000),
    unit_a=units,
    unit_b=units,
)
def test_a_list_is_refused_exactly_when_two_periods_coincide(
    count: int, a: int, b: int, unit_a: str, unit_b: str
) -> None:
    first, second = f"{count}/{a}{unit_a}", f"{count}/{b}{unit_b}"
    periods = (a * UNITS[unit_a], b * UNITS[unit_b])
    if max(periods) > YEAR:
        return
    if periods[0] == periods[1]:
        with pytest.raises(ConfigurationError, match="two rates over the same period"):
            RatePlan.of([first, second])
    else:
        plan = RatePlan.of([first, second], [1, 2])
        assert [r.period for r in plan.rates] == list(periods)
        assert plan.args[2::3] == (1, 2)
        assert [float(x) for x in plan.args[1::3]] == [p * 1_000_000 / count for p in periods]


@settings(deadline=None)  # a busy box must not fail a property on time
@given(
    count=st.integers(min_value=1, max_value=10**6),
    spaces=st.tuples(*[st.sampled_from(["", " ", "  ", "\t"])] * 4),
    unit=units,
    upper=st.booleans(),
)
def test_spacing_and_case_do_not_change_a_rate(
    count: int, spaces: tuple[str, ...], unit: str, upper: bool
) -> None:
    written = f"{spaces[0]}{count}{spaces[1]}/{spaces[2]}{unit}{spaces[3]}"
    if upper:
        written = written.upper()
    rate = parse_rate(written)
    assert (rate.count, rate.period) == (count, UNITS[unit])
    assert rate.text == written.strip()


@settings(deadline=None)  # a busy box must not fail a property on time
@given(st.integers(min_value=1, max_value=10**6))
def test_a_bare_count_is_per_second_as_text_or_int(count: int) -> None:
    as_int, as_text = parse_rate(count), parse_rate(str(count))
    assert (as_int.count, as_int.period, as_int.field) == (count, 1, "1000ms")
    assert (as_text.count, as_text.period, as_text.interval_us) == (
        as_int.count,
        as_int.period,
        as_int.interval_us,
    )


# -- What the script is sent and what its answer means --------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "us"),
    [
        (None, -1),  # no bound: wait as long as it takes
        (0, 0),
        (0.0, 0),
        (1.5, 1_500_000),
        (0.0000015, 1),
        (0.9999999, 999_999),  # floored: never promise a wait longer than the caller allows
        (1e-7, 0),
        (-3, 0),
        (86400, 86_400_000_000),
    ],
)
def test_micros(seconds: float | None, us: int) -> None:
    assert micros(seconds) == us


@settings(deadline=None)  # a busy box must not fail a property on time
@given(st.floats(min_value=0, max_value=10**7, allow_nan=False))
def test_micros_never_exceeds_the_wait_given(seconds: float) -> None:
    us = micros(seconds)
    assert us <= seconds * 1_000_000
    assert seconds * 1_000_000 - us < 1 + 1e-9 * seconds * 1_000_000


def test_an_admitted_answer() -> None:
    admission = Admission.from_reply([ADMITTED, 0, 4])
    assert admission
    assert admission == Admission(allowed=True, retry_after=0.0, remaining=4, deferred=False)
    waited = Admission.from_reply([ADMITTED, 250_001, 0])
    assert waited
    assert waited.retry_after == 0.250001


def test_a_refused_answer_says_when_to_try_again_to_the_microsecond() -> None:
    admission = Admission.from_reply([REFUSED, 333_102, 0])
    assert not admission
    assert admission.retry_after == 0.333102
    assert not admission.deferred


def test_a_deferred_answer_is_not_an_admission() -> None:
    admission = Admission.from_reply([DEFERRED, 1_500, 0])
    assert not admission
    assert admission.deferred
    assert admission.retry_after == 0.0015


def test_answers_as_bytes_and_negative_remaining() -> None:
    admission = Admission.from_reply([b"1", b"0", b"-3"])
    assert admission
    assert admission.remaining == 0  # clipped: a call that waited for its slot leaves none


# -- The RateLimit classes refuse bad settings before any round trip -------------------------------


def unreachable() -> redis.Redis:
    """A client that was never connected: any round trip would fail with a connection error, so a
    ConfigurationError proves the check came first."""
    return redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)


@pytest.mark.parametrize("cls", [tasklock.RateLimit, tasklock.asyncio.RateLimit])
def test_constructor_checks(cls: type[Any]) -> None:
    client = unreachable()
    with pytest.raises(ConfigurationError, match=r"redis must be a redis-py client .*got str"):
        cls("redis://localhost", "api", "10/s")
    with pytest.raises(ConfigurationError, match="redis must be a redis-py client"):
        cls(None, "api", "10/s")
    for name in ["", None, 5]:
        with pytest.raises(
            ConfigurationError, match=rf"name must be a non-empty string, got {name!r}"
        ):
            cls(client, name, "10/s")
    with pytest.raises(ConfigurationError, match=r"name must be text or UTF-8 bytes, got b'\\xff'"):
        cls(client, b"\xff", "10/s")
    with pytest.raises(ConfigurationError, match=r"^rate\[1\]='1/x' is not a rate"):
        cls(client, "api", ["10/s", "1/x"])
    with pytest.raises(ConfigurationError, match=r"^burst must be a whole number >= 1.*got 0"):
        cls(client, "api", "10/s", burst=0)
    limit = cls(client, b"api", ["10/s", "100/h"], burst=[5, 1])
    assert limit.name == "api"
    assert limit.rate == ("10/s", "100/h")
    assert limit.burst == (5, 1)
    assert repr(limit) == f"<{cls.__name__} 'api' 10/s and 100/h (burst 5, 1)>"


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"blocking": "yes"}, "blocking must be True or False, got 'yes'"),
        ({"blocking": 1}, "blocking must be True or False, got 1"),
        ({"blocking_timeout": -1}, "blocking_timeout must be >= 0 seconds, got -1"),
        ({"blocking_timeout": math.nan}, "blocking_timeout must be >= 0 seconds, got nan"),
        ({"blocking_timeout": "5"}, "blocking_timeout must be a number of seconds, got '5'"),
        ({"blocking_timeout": True}, "blocking_timeout must be a number of seconds, got True"),
    ],
)
def test_acquire_checks_its_arguments_first(kwargs: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        tasklock.RateLimit(unreachable(), "api", "10/s").acquire(**kwargs)
    assert str(info.value) == said


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"blocking": "yes"}, "blocking must be True or False, got 'yes'"),
        ({"blocking_timeout": -1}, "blocking_timeout must be >= 0 seconds, got -1"),
    ],
)
async def test_async_acquire_checks_its_arguments_first(kwargs: dict[str, Any], said: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    with pytest.raises(ConfigurationError) as info:
        await tasklock.asyncio.RateLimit(client, "api", "10/s").acquire(**kwargs)
    assert str(info.value) == said
    await client.aclose()
