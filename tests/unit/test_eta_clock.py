"""When a Celery call with ``countdown``/``eta`` is due, read off a frozen wall clock: the delay
that :func:`tasklock.celery.options.seconds_until_due` adds to a pending marker's ``pending_ttl``.

The clock is frozen (freezegun) at ``NOW``, half an hour before central Europe moves its clocks
forward (2025-03-30 01:00 UTC), so every delay is exact, and the host's own time zone is set to
Tokyo, so a naive datetime read as the host's local time would be off by nine hours. What is
pinned:

* a naive ``eta`` (datetime or ISO string) is UTC, whatever the app's ``timezone`` (Celery's
  worker reads it with ``maybe_make_aware(..., app.conf.timezone)``, which takes naive as UTC);
* an aware ``eta`` is its own instant, also across a DST change in its zone (an hour, not the two
  that its wall-clock reading suggests);
* an ``eta`` in the past, or now, is due now (0, never negative); one years ahead is not capped;
* a truthy ``countdown`` wins over ``eta`` (as in Celery), ``countdown=0`` leaves ``eta`` in charge;
* the delay is counted from the wall clock when the call is sent, not from a fixed instant.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from freezegun import freeze_time

from tasklock.celery.options import seconds_until_due

UTC = dt.UTC
NOW = dt.datetime(2025, 3, 30, 0, 30, tzinfo=UTC)  # 01:30 in Berlin (CET, +01:00)
NAIVE_NOW = NOW.replace(tzinfo=None)
TWO_HOURS = dt.timedelta(hours=2)
BERLIN = ZoneInfo("Europe/Berlin")

APP_ZONES: dict[str, dict[str, Any]] = {
    "default (UTC)": {},
    "America/New_York": {"timezone": "America/New_York"},
    "Australia/Sydney, enable_utc off": {"timezone": "Australia/Sydney", "enable_utc": False},
}


@pytest.fixture(autouse=True)
def host_in_tokyo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The host's local time zone is Tokyo (UTC+9) for each test, restored afterwards."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    # The premise: a naive datetime read as local time is nine hours early here.
    assert dt.datetime(2025, 1, 1).astimezone(UTC).hour == 15
    try:
        yield
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.fixture(params=list(APP_ZONES))
def app(request: pytest.FixtureRequest) -> Celery:
    celery = Celery(f"eta-clock-{request.param}", set_as_current=False)
    celery.conf.update(APP_ZONES[request.param])
    return celery


def due_in(app: Celery, **options: Any) -> float:
    with freeze_time(NOW):
        return seconds_until_due(options, app)


def test_a_naive_eta_is_utc_whatever_the_app_timezone(app: Celery) -> None:
    assert due_in(app, eta=NAIVE_NOW + TWO_HOURS) == 7200.0


def test_a_naive_iso_eta_is_utc_whatever_the_app_timezone(app: Celery) -> None:
    assert due_in(app, eta=(NAIVE_NOW + TWO_HOURS).isoformat()) == 7200.0


def test_an_aware_eta_is_its_own_instant(app: Celery) -> None:
    india = dt.timezone(dt.timedelta(hours=5, minutes=30))
    eta = (NOW + TWO_HOURS).astimezone(india)
    assert due_in(app, eta=eta) == 7200.0
    assert due_in(app, eta=eta.isoformat()) == 7200.0


def test_an_eta_across_a_dst_change_counts_real_seconds(app: Celery) -> None:
    """03:30 in Berlin on the day clocks go forward is one hour after 01:30 (02:00-03:00 does
    not exist that night), not the two hours that subtracting wall-clock readings gives."""
    eta = dt.datetime(2025, 3, 30, 3, 30, tzinfo=BERLIN)
    assert NOW.astimezone(BERLIN).hour == 1  # the premise: it is 01:30 there now
    assert due_in(app, eta=eta) == 3600.0
    assert due_in(app, eta=eta.isoformat()) == 3600.0  # "...T03:30:00+02:00"


@pytest.mark.parametrize(
    "eta",
    [
        NAIVE_NOW - dt.timedelta(minutes=1),
        NOW - dt.timedelta(days=400),
        (NAIVE_NOW - dt.timedelta(seconds=1)).isoformat(),
        NAIVE_NOW,
        NOW,
    ],
    ids=["naive, a minute ago", "aware, a year ago", "ISO, a second ago", "naive, now", "now"],
)
def test_an_eta_in_the_past_or_now_is_due_now(app: Celery, eta: object) -> None:
    assert due_in(app, eta=eta) == 0.0


def test_an_eta_years_ahead_is_not_capped(app: Celery) -> None:
    """pending_ttl itself is at most a year, but the delay is not capped: the marker must stay
    until the call can run, however far ahead that is."""
    far = dt.datetime(3000, 1, 1)
    assert due_in(app, eta=far) == far.replace(tzinfo=UTC).timestamp() - NOW.timestamp()
    assert due_in(app, eta=NOW + dt.timedelta(days=3 * 365)) == 3 * 365 * 86400.0


def test_a_truthy_countdown_wins_over_eta(app: Celery) -> None:
    assert due_in(app, countdown=90) == 90.0
    assert due_in(app, countdown=90.5, eta=NAIVE_NOW + TWO_HOURS) == 90.5
    assert due_in(app, countdown=-5) == 0.0  # Celery: an eta 5 s ago, so due now


def test_countdown_zero_leaves_the_eta_in_charge(app: Celery) -> None:
    assert due_in(app, countdown=0, eta=NAIVE_NOW + TWO_HOURS) == 7200.0
    assert due_in(app, countdown=None, eta=NAIVE_NOW + TWO_HOURS) == 7200.0


@pytest.mark.parametrize("eta", [None, "tomorrow", "2025-13-01T00:00:00", 12.5])
def test_what_the_worker_could_not_read_counts_as_now(app: Celery, eta: object) -> None:
    assert due_in(app, eta=eta) == 0.0


def test_the_delay_is_counted_from_the_wall_clock_at_the_call(app: Celery) -> None:
    eta = NAIVE_NOW + TWO_HOURS
    with freeze_time(NOW) as frozen:
        assert seconds_until_due({"eta": eta}, app) == 7200.0
        frozen.tick(dt.timedelta(minutes=30))
        assert seconds_until_due({"eta": eta}, app) == 5400.0
        frozen.move_to(NOW + TWO_HOURS + dt.timedelta(seconds=1))
        assert seconds_until_due({"eta": eta}, app) == 0.0
