"""Rates as users write them, and what one rate-limit call asks and answers: the sans-I/O half of
:class:`tasklock.RateLimit`, shared by the blocking and the asyncio class and by the task layer.

A rate is written as Celery writes ``rate_limit`` (``"10/s"``, ``"20/m"``, ``"100/h"``), plus
``"/d"`` and a multiplier (``"30/5m"``: 30 per five minutes); a bare number is per second, as
in Celery. Several rates apply together (``["10/s", "100000/d"]``): a call is admitted only when
every one of them admits it, and a refused call consumes from none.

The algorithm is GCRA (the generic cell rate algorithm, as in redis-cell and go-redis/redis_rate):
each limit keeps one number, its *theoretical arrival time* (TAT), on the server's clock. With an
emission interval ``T = period / count`` and a burst ``b``, a call at time ``now`` is admitted when
``max(TAT, now) + T - b*T <= now``, and then ``TAT = max(TAT, now) + T``. So:

* ``burst=1`` spaces calls at least ``T`` apart: never more than ``count`` in any rolling
  ``period`` (Celery's own rate limit spaces calls the same way);
* ``burst=b`` admits ``b`` calls at once after an idle spell, and then one per ``T``: up to
  ``count + b - 1`` in a rolling period that starts with a full burst.

One number per limit, whatever the rate: O(1) memory per key, expiring when idle (never a log of
calls). The script is in :mod:`tasklock.core.rate_scripts`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from tasklock.errors import ConfigurationError

__all__ = [
    "ADMITTED",
    "DEFERRED",
    "REFUSED",
    "Admission",
    "Rate",
    "RatePlan",
    "parse_rate",
]

#: Seconds per unit, by every spelling accepted.
_UNITS: dict[str, int] = {
    **dict.fromkeys(("s", "sec", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
}
_RATE = re.compile(r"^\s*(\d+)\s*(?:/\s*(\d+(?:\.\d+)?)?\s*([a-z]+))?\s*$")
_EXAMPLES = "e.g. '10/s', '20/m', '100/h', '100000/d' or '30/5m'"

#: A call the script admitted (now, or after the wait it names).
ADMITTED = 1
#: A call the script refused; it consumed nothing.
REFUSED = 0
#: A call whose slot is further than the caller waits: its slot is reserved all the same and
#: stored under the call's reservation key, for when the call comes back.
DEFERRED = 2


@dataclass(frozen=True)
class Rate:
    """``count`` calls per ``period`` seconds."""

    count: int
    period: float
    text: str

    @property
    def interval_us(self) -> float:
        """The emission interval ``T`` in microseconds: the spacing of calls at this rate."""
        return self.period * 1_000_000 / self.count

    @property
    def field(self) -> str:
        """Where this limit's TAT is kept in the key's hash: its period in milliseconds (to the
        microsecond), so that a changed count ("10/s" to "20/s") keeps its state and two rates
        over one period are refused."""
        return f"{self.period * 1000:.3f}".rstrip("0").rstrip(".") + "ms"

    def __str__(self) -> str:
        return self.text


def parse_rate(value: Any, option: str = "rate") -> Rate:
    """A :class:`Rate` from ``"N/unit"``, ``"N/Kunit"`` or a bare number of calls per second."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigurationError(
            f"{option} must be a rate such as '10/s' (or a list of them), got {value!r}: "
            f"{_EXAMPLES}"
        )
    text = str(value).strip().lower()
    match = _RATE.match(text)
    if match is None or (match.group(3) is not None and match.group(3) not in _UNITS):
        raise ConfigurationError(
            f"{option}={value!r} is not a rate: write calls per period, {_EXAMPLES} "
            "(units: s, m, h, d)"
        )
    count = int(match.group(1))
    multiplier = float(match.group(2)) if match.group(2) else 1.0
    unit = _UNITS[match.group(3)] if match.group(3) else 1
    period = multiplier * unit
    if count < 1 or period <= 0:
        raise ConfigurationError(
            f"{option}={value!r} admits nothing: the count and the period must be above 0 "
            f"({_EXAMPLES})"
        )
    if period > 366 * 86400:
        raise ConfigurationError(
            f"{option}={value!r}: the period is over a year; the longest is '/366d'"
        )
    if period * 1_000_000 / count < 1:
        raise ConfigurationError(
            f"{option}={value!r} is over a million calls per second, finer than the server's "
            "clock (microseconds) can space them"
        )
    return Rate(count, period, str(value).strip())


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


@dataclass(frozen=True)
class RatePlan:
    """The limits of one :class:`~tasklock.RateLimit` (or task), checked: what its calls send."""

    rates: tuple[Rate, ...]
    bursts: tuple[int, ...]

    @classmethod
    def of(cls, rate: Any, burst: Any = 1, *, option: str = "rate") -> RatePlan:
        """Parse ``rate`` (one or a list) and ``burst`` (one int for all, or a list that matches
        ``rate``); every mistake is a ConfigurationError naming the option."""
        if isinstance(rate, list | tuple) and not rate:
            raise ConfigurationError(f"{option} is an empty list: give at least one rate")
        rates = tuple(
            parse_rate(r, option if not isinstance(rate, list | tuple) else f"{option}[{i}]")
            for i, r in enumerate(_as_list(rate))
        )
        burst_option = "burst"
        if isinstance(burst, list | tuple):
            if len(burst) != len(rates):
                raise ConfigurationError(
                    f"{burst_option} lists {len(burst)} values for {len(rates)} rate(s) "
                    f"({', '.join(map(str, rates))}), got {burst_option}={list(burst)!r}: give "
                    "one int for all, or one per rate"
                )
            bursts = tuple(burst)
        else:
            bursts = (burst,) * len(rates)
        for b in bursts:
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise ConfigurationError(
                    f"{burst_option} must be a whole number >= 1 (calls admitted at once after "
                    f"an idle spell), or a list of them, got {burst!r}; burst=1 spaces calls "
                    "evenly"
                )
        fields = [r.field for r in rates]
        if len(set(fields)) != len(fields):
            raise ConfigurationError(
                f"{option} has two rates over the same period ({', '.join(map(str, rates))}): "
                "only the stricter one would count; keep one per period"
            )
        return cls(rates, bursts)

    @cached_property
    def args(self) -> tuple[Any, ...]:
        """The script's per-limit arguments: field, emission interval in µs, burst."""
        out: list[Any] = []
        for rate, burst in zip(self.rates, self.bursts, strict=True):
            out.extend((rate.field, repr(rate.interval_us), burst))
        return tuple(out)

    def describe(self) -> str:
        text = " and ".join(map(str, self.rates))
        if any(b > 1 for b in self.bursts):
            text += f" (burst {', '.join(map(str, self.bursts))})"
        return text


def micros(seconds: float | None) -> int:
    """A wait in whole microseconds for the script; None or infinity (no bound) is -1."""
    if seconds is None or seconds == math.inf:
        return -1
    return max(0, math.floor(seconds * 1_000_000))


@dataclass(frozen=True)
class Admission:
    """What one rate-limit call answered. Truthy when the call may go ahead.

    * ``retry_after``: seconds until this call's slot. For a refused call, when to try again (the
      earliest time every limit admits one call, exact to the microsecond on the server's
      clock); for an admitted one, 0.0, or the wait before its slot when the caller chose to
      wait; for a deferred one, when to come back.
    * ``remaining``: how many more calls every limit admits right now, after this one.
    * ``deferred``: the slot is reserved for this call (the task layer's ``on_rate_limit="retry"``)
      and it must come back after ``retry_after``.
    """

    allowed: bool
    retry_after: float
    remaining: int
    deferred: bool = False

    def __bool__(self) -> bool:
        return self.allowed

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> Admission:
        status = int(reply[0])
        return cls(
            status == ADMITTED, int(reply[1]) / 1_000_000, max(0, int(reply[2])), status == DEFERRED
        )
