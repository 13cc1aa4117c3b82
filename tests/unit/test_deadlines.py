"""Deadline and validity arithmetic, on a fake clock.

:class:`ClockedBackend` is not a lock: it is a stand-in backend for :class:`BaseLock` whose only
job is to say "held" until a fake-clock instant, so the waiting loop's arithmetic (blocking_timeout,
backoff, holder TTL clamp, wake-ups) can be checked exactly and instantly. Lock semantics are tested
against real redis-server processes in tests/integration.

The watchdog's bookkeeping (expiry, next due time, loss) is driven the same way: a real redis-py
client to a port where nothing listens (a real refused connection) or a judge that gives a fixed
verdict, and a fake clock that says what time it is.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tasklock.core.base import MAX_POLL_INTERVAL, Attempt, BaseLock
from tasklock.core.renewal import judge_single
from tasklock.core.scripts import EXTEND
from tasklock.core.watchdog import GONE, UNREACHABLE, Outcome, Renewal, Watchdog
from tasklock.errors import BackendUnavailable
from tests.support.polling import eventually
from tests.support.servers import free_port
from tests.unit.conftest import FakeClock


class FakeWaiter:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.event = threading.Event()
        self.arms = 0
        self.closed = False

    def arm(self) -> None:
        self.arms += 1
        self.event.clear()

    def wait(self, timeout: float) -> bool:
        return self.clock.wait(self.event, timeout)

    def close(self) -> None:
        self.closed = True


class ClockedBackend(BaseLock):
    """Held by someone else until ``free_at`` (fake time; None = for ever)."""

    def __init__(
        self,
        clock: FakeClock,
        free_at: float | None = None,
        report_ttl: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("timeout", 10)
        super().__init__("unit", **kwargs)
        self.clock = clock
        self.free_at = free_at
        self.report_ttl = report_ttl
        self.attempts: list[float] = []
        self.waiters: list[FakeWaiter] = []
        self.fail_at_attempt: int | None = None
        self.wake_on_attempt: int | None = None

    def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        now = self.clock.monotonic()
        self.attempts.append(now)
        if self.fail_at_attempt == len(self.attempts):
            raise BackendUnavailable("the server went away")
        if self.wake_on_attempt == len(self.attempts):
            self.free_at = now  # released right after this attempt, and the release is published
            self.waiters[-1].event.set()
            return Attempt(False, holder_ttl=None)
        if self.free_at is not None and now >= self.free_at:
            return Attempt(True, f"{token}#1".encode(), 1)
        ttl = None if self.free_at is None or not self.report_ttl else self.free_at - now
        return Attempt(False, holder_ttl=ttl)

    def _waiter(self, token: str) -> FakeWaiter:
        waiter = FakeWaiter(self.clock)
        self.waiters.append(waiter)
        return waiter

    def _release_value(self, value: bytes) -> bool:
        return True


def test_blocking_timeout_is_honoured_exactly(fake_clock: FakeClock) -> None:
    start = fake_clock.now
    lock = ClockedBackend(fake_clock, sleep=0.1)
    assert lock.acquire(blocking_timeout=5) is False
    assert fake_clock.now - start == pytest.approx(5.0)
    assert lock.attempts[-1] == pytest.approx(start + 5.0), "one last try at the deadline"
    assert max(fake_clock.waits) <= MAX_POLL_INTERVAL
    assert fake_clock.waits[0] <= 0.1
    assert lock.waiters[0].closed


def test_big_sleep_is_cut_to_the_deadline(fake_clock: FakeClock) -> None:
    start = fake_clock.now
    lock = ClockedBackend(fake_clock, sleep=30)
    assert lock.acquire(blocking_timeout=3) is False
    assert fake_clock.waits == [pytest.approx(3.0)]
    assert fake_clock.now - start == pytest.approx(3.0)
    # one try, one right after subscribing (a release in between is not missed), one at the end
    assert len(lock.attempts) == 3


def test_zero_blocking_timeout_tries_once(fake_clock: FakeClock) -> None:
    lock = ClockedBackend(fake_clock)
    assert lock.acquire(blocking_timeout=0) is False
    assert len(lock.attempts) == 1
    assert lock.waiters == []
    assert fake_clock.waits == []


def test_non_blocking_tries_once(fake_clock: FakeClock) -> None:
    lock = ClockedBackend(fake_clock, blocking=False)
    assert lock.acquire() is False
    assert len(lock.attempts) == 1
    assert lock.waiters == []


def test_wait_never_outlasts_the_holders_ttl(fake_clock: FakeClock) -> None:
    start = fake_clock.now
    lock = ClockedBackend(fake_clock, free_at=start + 2.0, sleep=30)
    assert lock.acquire() is True
    assert 2.0 < fake_clock.now - start <= 2.011
    assert len(lock.attempts) == 3
    assert lock.fence == 1
    lock.release()


def test_unknown_holder_ttl_polls_with_backoff(fake_clock: FakeClock) -> None:
    start = fake_clock.now
    lock = ClockedBackend(fake_clock, free_at=start + 4.0, report_ttl=False, sleep=0.1)
    assert lock.acquire() is True
    assert start + 4.0 <= fake_clock.now <= start + 4.0 + MAX_POLL_INTERVAL
    assert all(w <= MAX_POLL_INTERVAL for w in fake_clock.waits)
    lock.release()


def test_wake_up_retries_without_waiting_out_the_backoff(fake_clock: FakeClock) -> None:
    start = fake_clock.now
    lock = ClockedBackend(fake_clock, sleep=30)
    lock.wake_on_attempt = 2  # the holder releases right after our second try
    assert lock.acquire(blocking_timeout=60) is True
    assert fake_clock.now == start, "woken by the release, no time spent sleeping"
    assert lock.waiters[0].arms == 2, "re-armed before each try"
    lock.release()


def test_backend_error_while_waiting_propagates_and_unsubscribes(fake_clock: FakeClock) -> None:
    lock = ClockedBackend(fake_clock)
    lock.fail_at_attempt = 3
    with pytest.raises(BackendUnavailable):
        lock.acquire(blocking_timeout=10)
    assert lock.waiters[0].closed


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"blocking_timeout": -0.1}, "blocking_timeout"),
        ({"sleep": 0}, "sleep"),
        ({"sleep": "1"}, "sleep"),
        ({"blocking_timeout": float("nan")}, "blocking_timeout"),
        ({"sleep": float("inf")}, "sleep"),
    ],
)
def test_bad_acquire_arguments_are_named(
    fake_clock: FakeClock, kwargs: dict[str, Any], fragment: str
) -> None:
    from tasklock.errors import ConfigurationError

    lock = ClockedBackend(fake_clock)
    with pytest.raises(ConfigurationError, match=fragment):
        lock.acquire(**kwargs)
    assert lock.attempts == []


@pytest.mark.parametrize("option", ["timeout", "sleep"])
def test_infinite_ttl_or_sleep_is_a_clear_error(fake_clock: FakeClock, option: str) -> None:
    from tasklock.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=f"{option} must be a finite number"):
        ClockedBackend(fake_clock, **{option: float("inf")})


def test_infinite_blocking_timeout_waits_until_free(fake_clock: FakeClock) -> None:
    lock = ClockedBackend(fake_clock, free_at=fake_clock.now + 3.0)
    assert lock.acquire(blocking_timeout=float("inf")) is True
    from tasklock.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="additional_time"):
        lock.extend(float("inf"))
    lock.release()


# -- watchdog bookkeeping --------------------------------------------------------------------------


def refused_client() -> redis.Redis:
    """A real client to a port where nothing listens: every call is a real connection error."""
    return redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))


def entry_for(
    judge: Any, ttl: float = 30.0, client: redis.Redis | None = None
) -> tuple[Renewal, list[str]]:
    reasons: list[str] = []
    call = (client or refused_client(), EXTEND, ("k",), (b"v", 1000, "1"))
    return Renewal("k", ttl, [call], judge, reasons.append), reasons


def renew_once(watchdog: Watchdog, entry: Renewal, fake_clock: FakeClock) -> None:
    """Run one renewal round for ``entry`` at the fake clock's current time; wait for it."""
    watchdog._send(fake_clock.now, [entry])
    eventually(lambda: entry.flight is None, what="the round was judged")


def test_watch_schedules_a_third_of_the_ttl(fake_clock: FakeClock) -> None:
    watchdog = Watchdog()
    entry, _ = entry_for(judge_single, ttl=3600)
    watchdog.watch(entry)
    assert entry.expires_at == fake_clock.now + 3600
    assert entry.due == fake_clock.now + 1200
    assert watchdog.held() == 1
    watchdog.unwatch(entry)
    assert watchdog.held() == 0


def test_renewed_entry_is_valid_for_a_ttl_from_when_the_round_started(
    fake_clock: FakeClock,
) -> None:
    watchdog = Watchdog()
    entry, reasons = entry_for(lambda results, elapsed: Outcome.RENEWED)
    entry.expires_at = fake_clock.now + 20
    started = fake_clock.now
    renew_once(watchdog, entry, fake_clock)
    assert entry.renewals == 1
    assert entry.expires_at == started + 30
    assert entry.due == fake_clock.now + 10
    assert reasons == []
    assert (watchdog.ticks, watchdog.round_trips, watchdog.calls) == (1, 1, 1)


def test_the_first_lease_counts_from_when_the_acquire_was_sent(fake_clock: FakeClock) -> None:
    """The server's TTL began between the acquire's send and its answer: counting from the
    answer (when watching begins) would overestimate it by the way back."""
    watchdog = Watchdog()
    entry, _ = entry_for(judge_single, ttl=30)
    entry.granted_at = fake_clock.now - 2.0  # the acquire's answer took 2 s
    watchdog.watch(entry)
    assert entry.expires_at == fake_clock.now - 2.0 + 30
    assert entry.due == fake_clock.now - 2.0 + 10
    watchdog.unwatch(entry)


def test_a_late_answer_is_renewed_again_at_once_counting_from_its_start(
    fake_clock: FakeClock,
) -> None:
    """The next renewal is due a third of the TTL after the last one was sent, as its expiry
    counts from then; when the answer came later than that, at once (not a third after the
    answer, which could leave less than a round trip before the expiry)."""
    book = Watchdog()
    entry, _ = entry_for(lambda results, elapsed: Outcome.RENEWED, ttl=30)
    book.add(entry, fake_clock.now)
    started = fake_clock.now
    book.start_round(started, [entry])
    flight = entry.flight
    assert flight is not None
    fake_clock.advance(12)  # the answer comes after a third of the TTL
    book.answer([(flight, 0, 1)])
    assert entry.expires_at == started + 30
    assert entry.due == fake_clock.now
    # A prompt answer: due a third of the TTL after the round started.
    started = fake_clock.now
    book.start_round(started, [entry])
    flight = entry.flight
    assert flight is not None
    fake_clock.advance(1)
    book.answer([(flight, 0, 1)])
    assert entry.due == started + 10


def test_unreachable_retries_soon_but_not_past_the_expiry(fake_clock: FakeClock) -> None:
    watchdog = Watchdog()
    entry, reasons = entry_for(judge_single, ttl=30)  # a real refused connection
    entry.expires_at = fake_clock.now + 20
    renew_once(watchdog, entry, fake_clock)
    assert reasons == []
    assert entry.due == fake_clock.now + 1.0  # min(ttl / 10, 1 s)
    entry.expires_at = fake_clock.now + 0.25
    renew_once(watchdog, entry, fake_clock)
    assert entry.due == entry.expires_at, "the last retry is at the expiry"
    assert reasons == []


def test_unreachable_until_the_ttl_ran_out_is_lost(fake_clock: FakeClock) -> None:
    watchdog = Watchdog()
    entry, reasons = entry_for(judge_single)  # a real refused connection
    entry.expires_at = fake_clock.now + 5
    watchdog._live.add(entry)
    renew_once(watchdog, entry, fake_clock)
    assert reasons == []
    fake_clock.advance(5)
    renew_once(watchdog, entry, fake_clock)
    assert reasons == [UNREACHABLE]
    assert entry.cancelled
    assert watchdog.held() == 0


def test_past_the_expiry_the_server_still_decides(fake_clock: FakeClock) -> None:
    """A process paused past its TTL asks anyway: if the key still holds our value, it never
    expired (a re-acquisition would store another token), so the hold is still ours."""
    watchdog = Watchdog()
    entry, reasons = entry_for(lambda results, elapsed: Outcome.RENEWED)
    entry.expires_at = fake_clock.now - 3
    started = fake_clock.now
    renew_once(watchdog, entry, fake_clock)
    assert reasons == []
    assert entry.expires_at == started + 30
    assert watchdog.round_trips == 1


def test_lost_verdict_reports_the_lock_gone(fake_clock: FakeClock) -> None:
    watchdog = Watchdog()
    entry, reasons = entry_for(lambda results, elapsed: Outcome.LOST)
    entry.expires_at = fake_clock.now + 20
    renew_once(watchdog, entry, fake_clock)
    assert reasons == [GONE]


def test_a_judge_that_raises_counts_as_no_verdict(fake_clock: FakeClock) -> None:
    def broken(results: list[Any], elapsed: float) -> Outcome:
        raise RuntimeError("judge bug")

    watchdog = Watchdog()
    entry, reasons = entry_for(broken)
    entry.expires_at = fake_clock.now + 20
    renew_once(watchdog, entry, fake_clock)
    assert reasons == []
    assert entry.queued, "still scheduled for another try"


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """A real TCP listener that accepts and never answers: a stalled server."""
    listener = socket.create_server(("127.0.0.1", 0))
    yield listener
    listener.close()


def client_of(listener: socket.socket) -> redis.Redis:
    port = listener.getsockname()[1]
    return redis.Redis(port=port, socket_timeout=30, retry=Retry(NoBackoff(), 0))


def test_results_for_a_lock_released_during_the_round_are_ignored(
    fake_clock: FakeClock, silent_server: socket.socket
) -> None:
    watchdog = Watchdog()
    entry, reasons = entry_for(
        lambda results, elapsed: Outcome.LOST, client=client_of(silent_server)
    )
    entry.expires_at = fake_clock.now + 20
    watchdog._live.add(entry)
    watchdog._send(fake_clock.now, [entry])
    connection, _ = silent_server.accept()  # the round trip is connected, waiting for an answer
    watchdog.unwatch(entry)  # released meanwhile
    connection.close()  # now it gets its answer: a connection error
    eventually(lambda: entry.flight is None and not watchdog._busy)
    assert reasons == []
    assert not entry.queued


def test_a_stalled_client_gets_one_round_trip_and_no_answer_in_time(
    fake_clock: FakeClock, silent_server: socket.socket
) -> None:
    watchdog = Watchdog()
    client = client_of(silent_server)
    first, first_reasons = entry_for(judge_single, ttl=30, client=client)
    second, second_reasons = entry_for(judge_single, ttl=30, client=client)
    for entry in (first, second):
        entry.expires_at = fake_clock.now + 25
        watchdog._live.add(entry)
    watchdog._send(fake_clock.now, [first])
    connection, _ = silent_server.accept()
    # A second round while the first is pending: no second round trip, judged "no answer".
    watchdog._send(fake_clock.now, [second])
    assert watchdog.round_trips == 1
    assert second.flight is None
    assert second.due == fake_clock.now + 1.0
    # One server: its answer is awaited until the expiry, not judged at a sixth of the TTL (a
    # slow link still renews; see test_network_faults).
    fake_clock.advance(5)
    _, _, overdue = watchdog._next_work()
    assert overdue == []
    assert first.flight is not None
    # Still no answer when the TTL runs out: lost.
    fake_clock.advance(20)
    watchdog._send(fake_clock.now, [first])
    assert first_reasons == [UNREACHABLE]
    assert second_reasons == []
    connection.close()
    eventually(lambda: not watchdog._busy, what="the stalled round trip ended")


def test_single_instance_judge() -> None:
    assert judge_single([30_000], 0.001) is Outcome.RENEWED
    assert judge_single([0], 0.001) is Outcome.LOST
    assert judge_single([redis.ConnectionError("x")], 0.001) is Outcome.UNREACHABLE
    assert judge_single([redis.ResponseError("WRONGTYPE")], 0.001) is Outcome.UNREACHABLE


class _DyingWatchdog(Watchdog):
    """A watchdog whose driver thread dies the first time it looks for work (as one killed by
    a BaseException out of a callback would)."""

    def __init__(self) -> None:
        super().__init__()
        self.deaths = 0

    def take_work(self, now: float) -> Any:
        if self.deaths == 0:
            self.deaths += 1
            raise SystemExit("the driver thread dies")
        return super().take_work(now)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_watchdog_whose_thread_died_starts_a_new_one(fake_clock: FakeClock) -> None:
    """The next watch starts a new driver thread once the old one has ended (tracked by the
    thread itself, not asked of it on every acquire)."""
    watchdog = _DyingWatchdog()
    first, _ = entry_for(judge_single, ttl=3600)
    watchdog.watch(first)
    dead = watchdog._thread
    assert dead is not None
    dead.join(10)
    assert not dead.is_alive()
    assert watchdog.deaths == 1
    second, _ = entry_for(judge_single, ttl=3600)
    watchdog.watch(second)
    assert watchdog._thread is not dead
    assert watchdog._thread is not None
    assert watchdog._thread.is_alive()
    watchdog.unwatch(first)
    watchdog.unwatch(second)
