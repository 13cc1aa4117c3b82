"""tasklock.RateLimit on real servers: GCRA on the server's clock, one script per call.

Every assertion is on what the server answered or stored (its TIME, the TATs in the limit's
hash, PTTLs, SLOWLOG), never on how long something took on this machine: a busy box can delay a
call, and no assertion here depends on how much. A retry_after is checked against the stored TAT
and the server's TIME read just before and just after the call (the script's own "now" is between
the two), which makes it exact to the microsecond whatever the load.

The same contract runs on Valkey 9 and Redis 7 (``other_server``), on a 3-master Redis Cluster,
for an ACL user with the documented rules, and against a port where nothing listens.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import tasklock
from tasklock.core.rate_scripts import RATE
from tasklock.core.rates import Admission
from tasklock.core.scripts import ACL_RULES
from tasklock.errors import BackendRefused, BackendUnavailable, ConfigurationError
from tests.support.polling import eventually
from tests.support.servers import RedisClusterServers, RedisServer, free_port, require_binary

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("resp")]

SECOND = 1_000_000  # µs
#: A second limit that never binds in these tests (1000 at once, then one per 3.6 s) but keeps
#: the key alive for seconds: a short limit's key expires one interval after its last call, and
#: a test that reads the TATs after a slow moment of this box would find nothing.
KEEP_ALIVE, KEEP_ALIVE_BURST = "1000/h", 1000


def server_us(client: Any) -> int:
    """The server's clock (TIME) in microseconds."""
    seconds, micros = client.time()
    return int(seconds) * SECOND + int(micros)


def stored(client: Any, name: str) -> dict[str, float]:
    """The limit's slots: one TAT (µs, server clock) per period (its starts, the ``:starts``
    fields, left out: they move with the slots but for calls that come back to a reservation)."""
    return {
        k.decode(): float(v) for k, v in client.hgetall(name).items() if not k.endswith(b":starts")
    }


def tat(client: Any, name: str, field: str) -> float:
    value = client.hget(name, field)
    assert value is not None, f"{name} has no {field}: {client.hgetall(name)}"
    return float(value)


def wait_us(admission: Admission) -> int:
    """retry_after back in whole microseconds; asserting that it is a whole number of them."""
    us = admission.retry_after * SECOND
    assert abs(us - round(us)) < 1e-3, admission
    return round(us)


def bracketed(client: Any, call: Any) -> tuple[int, Any, int]:
    """(server time before, what ``call()`` answered, server time after): the script's "now" lies
    between the two."""
    before = server_us(client)
    answer = call()
    return before, answer, server_us(client)


def assert_wait_is_exact(before: int, admission: Admission, after: int, slot: float) -> None:
    """The script answers ceil(slot - now) µs with before <= now <= after."""
    assert math.ceil(slot - after) <= wait_us(admission) <= math.ceil(slot - before), (
        before,
        admission,
        after,
        slot,
    )


class Spied(tasklock.RateLimit):
    """A RateLimit that notes each round trip's answer with the server's TIME around it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[int, Admission, int]] = []

    def admit(self, max_wait: float | None, **kwargs: Any) -> Admission:
        before = server_us(self.redis)
        admission = super().admit(max_wait, **kwargs)
        self.seen.append((before, admission, server_us(self.redis)))
        return admission


# -- One rate --------------------------------------------------------------------------------------


def test_burst_one_spaces_calls_evenly(r: redis.Redis) -> None:
    """Callers hammering "20/s": each admission comes no earlier than the previous one's TAT, the
    TATs are at least one interval apart, and every refusal says when to come back: after more
    than nothing, at most one interval, exactly when the stored TAT is reached."""
    limit = tasklock.RateLimit(r, "even", ["20/s", KEEP_ALIVE], burst=[1, KEEP_ALIVE_BURST])
    interval = 50_000
    tats: list[float] = []
    refusals = 0
    deadline = server_us(r) + 20 * SECOND
    while len(tats) < 5 or refusals < 3:
        assert server_us(r) < deadline, f"{len(tats)} admissions, {refusals} refusals in 20 s"
        before, admission, after = bracketed(r, limit.try_acquire)
        if admission:
            assert admission.retry_after == 0.0
            assert admission.remaining == 0
            if tats:
                assert after >= tats[-1], "admitted before the previous call's TAT"
            tats.append(tat(r, "even", "1000ms"))
            continue
        refusals += 1
        assert admission.remaining == 0
        assert 0 < admission.retry_after <= interval / SECOND
        assert_wait_is_exact(before, admission, after, tats[-1])
    gaps = [b - a for a, b in itertools.pairwise(tats)]
    assert min(gaps) >= interval, gaps


def test_a_burst_admits_that_many_at_once_then_refuses(r: redis.Redis) -> None:
    limit = tasklock.RateLimit(r, "burst", "10/m", burst=4)  # one call per 6 s, four at once
    answers = [limit.try_acquire() for _ in range(4)]
    assert [bool(a) for a in answers] == [True] * 4
    assert [a.remaining for a in answers] == [3, 2, 1, 0]
    assert [a.retry_after for a in answers] == [0.0] * 4
    state = stored(r, "burst")
    before, refused, after = bracketed(r, limit.try_acquire)
    assert not refused
    assert not refused.deferred
    assert refused.remaining == 0
    assert 0 < refused.retry_after <= 6.0
    # The fifth call is admitted when the TAT is within the burst's reach again: TAT - 3 * 6 s.
    assert_wait_is_exact(before, refused, after, state["60000ms"] - 3 * 6 * SECOND)
    assert stored(r, "burst") == state  # a refused call consumed nothing


def test_retry_after_is_exact_to_the_microsecond(r: redis.Redis) -> None:
    limit = tasklock.RateLimit(r, "exact", "1/m")
    assert limit.try_acquire()
    slot = tat(r, "exact", "60000ms")
    waits = []
    for _ in range(6):
        before, admission, after = bracketed(r, limit.try_acquire)
        assert not admission
        assert_wait_is_exact(before, admission, after, slot)
        waits.append(wait_us(admission))
    assert waits == sorted(waits, reverse=True)  # the server's clock moves on, the slot does not
    # Not rounded to milliseconds: six waits that are all whole milliseconds would happen once in
    # 10**18 runs.
    assert any(w % 1000 for w in waits), waits


def test_the_key_expires_when_idle(r: redis.Redis) -> None:
    limit = tasklock.RateLimit(r, "idle", "20/s", burst=3)  # 50 ms apart, three at once
    assert limit.try_acquire()
    # The TAT is at most burst intervals ahead: the key lives no longer than that (+1 ms). (It
    # may be gone already, -2, if this box was slow; it never lives without a TTL, -1.)
    assert -1 != r.pttl("idle") <= 50 + 1
    assert limit.try_acquire()
    assert limit.try_acquire()
    assert -1 != r.pttl("idle") <= 3 * 50 + 1
    eventually(lambda: not r.exists("idle"), timeout=10, what="the idle limit's key expired")
    fresh = limit.try_acquire()
    assert fresh
    assert fresh.remaining == 2  # a full burst again
    # Several limits: the key lives as long as the longest TAT.
    both = tasklock.RateLimit(r, "idle2", ["20/s", "1/m"])
    assert both.try_acquire()
    assert 50_000 < r.pttl("idle2") <= 60_000 + 1


def test_parameters_may_change_between_calls(r: redis.Redis) -> None:
    """The state is one TAT per period: a new count or burst on the same period carries it on."""
    assert tasklock.RateLimit(r, "change", "1/m").try_acquire()
    first = tat(r, "change", "60000ms")
    # 2/m spaces calls 30 s apart, but this limit's last call set its TAT 60 s ahead: refused,
    # retry_after beyond 2/m's own interval (a fresh 2/m limit would admit at once).
    refused = tasklock.RateLimit(r, "change", "2/m").try_acquire()
    assert not refused
    assert refused.retry_after > 30
    # A larger burst applies at once, on the same TAT: admitted, and the TAT moves one interval.
    assert tasklock.RateLimit(r, "change", "1/m", burst=2).try_acquire()
    assert stored(r, "change") == {"60000ms": first + 60 * SECOND}
    # "10/s" then "20/s": one field; the 20/s call's slot is counted from the 10/s call's TAT.
    assert tasklock.RateLimit(r, "speed", "10/s").try_acquire()
    ten = tat(r, "speed", "1000ms")
    assert tasklock.RateLimit(r, "speed", "20/s").admit(None)  # takes its slot, however far
    assert list(stored(r, "speed")) == ["1000ms"]
    assert tat(r, "speed", "1000ms") >= ten + 50_000
    # Another period is another limit: its own field, admitted at once.
    assert tasklock.RateLimit(r, "speed", "1/10s").try_acquire()
    assert sorted(stored(r, "speed")) == ["10000ms", "1000ms"]


def test_reset_forgets_every_call(r: redis.Redis) -> None:
    limit = tasklock.RateLimit(r, "reset", "1/h")
    assert limit.try_acquire()
    assert not limit.try_acquire()
    limit.reset()
    assert not r.exists("reset")
    assert limit.try_acquire()
    limit.reset()
    limit.reset()  # resetting an idle limit is fine


# -- Several rates ---------------------------------------------------------------------------------


def test_a_list_refuses_atomically_and_consumes_from_none(r: redis.Redis) -> None:
    limit = tasklock.RateLimit(r, "pair", ["10/m", "1/h"], burst=[5, 1])
    first = limit.try_acquire()
    assert first
    assert first.remaining == 0  # the strictest limit: 1/h has nothing left
    state = stored(r, "pair")
    assert sorted(state) == ["3600000ms", "60000ms"]
    # The second call: 10/m (burst 5) would admit it, 1/h refuses; nothing is taken from 10/m.
    before, refused, after = bracketed(r, limit.try_acquire)
    assert not refused
    assert refused.remaining == 0
    assert_wait_is_exact(before, refused, after, state["3600000ms"])  # when every limit admits
    assert stored(r, "pair") == state
    # 10/m alone on the same key: one call taken so far, so three left after this one.
    alone = tasklock.RateLimit(r, "pair", "10/m", burst=5).try_acquire()
    assert alone
    assert alone.remaining == 3
    # Order does not matter.
    again = tasklock.RateLimit(r, "pair", ["1/h", "10/m"], burst=[1, 5]).try_acquire()
    assert not again
    assert again.retry_after > 3500


def test_remaining_is_what_the_strictest_limit_has_left(r: redis.Redis) -> None:
    limit = tasklock.RateLimit(r, "left", ["10/m", "100/h"], burst=[3, 5])
    assert [limit.try_acquire().remaining for _ in range(3)] == [2, 1, 0]
    assert not limit.try_acquire()
    assert tasklock.RateLimit(r, "left", "100/h", burst=5).try_acquire().remaining == 1


# -- acquire ---------------------------------------------------------------------------------------


def test_acquire_returns_false_and_consumes_nothing_when_the_slot_is_too_far(
    r: redis.Redis,
) -> None:
    limit = tasklock.RateLimit(r, "far", "1/m")
    assert limit.acquire() is True  # the first call: no wait
    state = stored(r, "far")
    assert limit.acquire(blocking_timeout=0.5) is False
    assert limit.acquire(blocking_timeout=0) is False
    assert limit.acquire(blocking=False) is False
    assert limit.acquire(blocking=False, blocking_timeout=100) is False  # not blocking wins
    assert stored(r, "far") == state
    # A timeout past the slot: admitted, without sleeping here (admit is acquire's round trip).
    admitted = limit.admit(120)
    assert admitted
    assert 0 < admitted.retry_after <= 60
    assert stored(r, "far") == {"60000ms": state["60000ms"] + 60 * SECOND}


def test_acquire_sleeps_until_its_slot(r: redis.Redis) -> None:
    limit = Spied(r, "sleep", ["5/s", KEEP_ALIVE], burst=[1, KEEP_ALIVE_BURST])  # 200 ms apart
    assert limit.try_acquire()
    previous = tat(r, "sleep", "1000ms")
    for _ in range(2):
        assert limit.acquire(blocking_timeout=10) is True
        woke = server_us(r)
        before, admission, after = limit.seen[-1]
        # One slot reserved (the TAT moved one interval past it), not before the last call's.
        slot = tat(r, "sleep", "1000ms") - 200_000
        assert slot >= previous
        assert_wait_is_exact(before, admission, after, slot)
        assert woke >= slot  # never early, on the server's clock
        previous = slot + 200_000
    # (try_acquire takes its own hot path, not admit: only the two acquires were spied on)
    assert [bool(a) for _, a, _ in limit.seen] == [True] * 2


@pytest.fixture
def slowlog(r: redis.Redis) -> Iterator[redis.Redis]:
    """Every command in the SLOWLOG, in the order the server ran them; the settings restored."""
    saved = r.config_get("slowlog-*")
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 100_000)
    r.slowlog_reset()
    yield r
    for key, value in saved.items():
        r.config_set(key, value)
    r.slowlog_reset()


def test_waiters_are_served_in_the_order_they_asked(
    redis_server: RedisServer, slowlog: redis.Redis
) -> None:
    """Four threads call acquire() at once on a busy limit. The order they asked in is the order
    the server ran their scripts (SLOWLOG, one client name per waiter). Each reply's wait, read
    against the server's TIME around the call, places that waiter's slot within a few µs; the
    slots must follow the asking order, one interval apart at least, the last one just before
    the final TAT, and no waiter may return from acquire() before its slot.

    Which thread the OS runs first once several are due is the scheduler's business, not the
    library's, so the order of the wake-ups themselves is not asserted; and no assertion depends
    on how fast the threads were (a slow one only widens the window its slot is known within)."""
    r = slowlog
    waiters, interval = 4, 50_000
    r.script_load(RATE.source)  # no NOSCRIPT round in the log
    # Busy for 0.5 s (2/s and 20/s share the period, so the state): every waiter asks before
    # the first slot, unless this box is very slow, and then they queue back to back.
    rates, bursts = ["2/s", KEEP_ALIVE], [1, KEEP_ALIVE_BURST]
    assert tasklock.RateLimit(r, "fifo", rates, bursts).try_acquire()
    clients = [redis_server.client(client_name=f"waiter-{i}") for i in range(waiters)]
    limits = [Spied(c, "fifo", ["20/s", KEEP_ALIVE], bursts) for c in clients]
    ready = threading.Barrier(waiters)
    woke: dict[int, int] = {}
    answers: dict[int, bool] = {}

    def wait(i: int) -> None:
        ready.wait(10)
        answers[i] = limits[i].acquire(blocking_timeout=10)
        woke[i] = server_us(clients[i])

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(waiters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert answers == dict.fromkeys(range(waiters), True)
    entries = sorted(r.slowlog_get(100_000), key=lambda e: e["id"])
    asked = [
        int(e["client_name"].decode().split("-")[1])
        for e in entries
        if e["command"].startswith(b"EVALSHA") and e["client_name"].startswith(b"waiter-")
    ]
    assert sorted(asked) == list(range(waiters)), asked  # one script call each
    # Slot k lies in [before + wait - 1, after + wait] of its call (the script answers
    # ceil(slot - now)). Is there a sequence of slots, in asking order, each one interval or
    # more after the last, ending at the final TAT - interval? The smallest candidates decide.
    slot = -math.inf
    for rank, i in enumerate(asked):
        [(before, admission, after)] = limits[i].seen
        assert admission
        wait = wait_us(admission)
        slot = max(before + wait - 1, slot + interval)
        assert slot <= after + wait, f"waiter {i} (asked #{rank}) got a slot before an earlier one"
        assert woke[i] >= after + wait, f"waiter {i} woke before its slot"
    final = tat(r, "fifo", "1000ms") - interval
    assert slot <= final
    [(before, admission, after)] = limits[asked[-1]].seen
    assert_wait_is_exact(before, admission, after, final)  # the last to ask has the last slot
    for client in clients:
        client.close()


# -- admit with a reservation (the task layer's deferred calls) ------------------------------------


def test_a_deferred_call_is_admitted_at_its_reserved_slot(r: redis.Redis) -> None:
    limit = tasklock.RateLimit(r, "jobs", ["10/s", KEEP_ALIVE], burst=[1, KEEP_ALIVE_BURST])
    reservation = "{jobs}:res:1"
    # Busy for 0.5 s (a 2/s call: the same period, so the same state), so that the next call
    # is deferred however slowly this box runs the next line.
    assert tasklock.RateLimit(r, "jobs", ["2/s", KEEP_ALIVE], [1, KEEP_ALIVE_BURST]).try_acquire()
    slot = tat(r, "jobs", "1000ms")
    # Busy: deferred, not refused. The slot is reserved (the TAT moved) and stored for the call.
    before, deferred, after = bracketed(
        r, lambda: limit.admit(0.0, reservation=reservation, keep=5)
    )
    assert not deferred
    assert deferred.deferred
    assert deferred.remaining == 0
    assert_wait_is_exact(before, deferred, after, slot)
    assert float(r.get(reservation)) == slot
    assert 5000 < r.pttl(reservation) <= 500 + 5000  # the wait, plus keep
    assert tat(r, "jobs", "1000ms") == slot + 100_000
    # Someone else now finds the limit busy until one interval past the reserved slot.
    before, other, after = bracketed(r, limit.try_acquire)
    assert not other
    assert_wait_is_exact(before, other, after, slot + 100_000)
    # Back too early for what it waits (early=): deferred again, the same reservation, nothing
    # more reserved.
    for early in (0, 0.01):
        before, again, after = bracketed(
            r, lambda e=early: limit.admit(0.0, reservation=reservation, keep=5, early=e)
        )
        assert again.deferred
        assert_wait_is_exact(before, again, after, slot)
        assert float(r.get(reservation)) == slot
        assert tat(r, "jobs", "1000ms") == slot + 100_000
    # Back at the slot (polled on the server's clock): admitted at once, the reservation used up.
    eventually(lambda: server_us(r) >= slot, what="the reserved slot came")
    admitted = limit.admit(0.0, reservation=reservation, keep=5, early=0)
    assert admitted
    assert not admitted.deferred
    assert admitted.retry_after == 0.0
    assert not r.exists(reservation)
    assert tat(r, "jobs", "1000ms") == slot + 100_000  # it used its slot, not a new one
    # The key is gone: the same call again is a new call (here admitted, the limit being idle
    # again, or deferred to a new slot).
    assert limit.admit(0.0, reservation=reservation, keep=5, early=0) or r.exists(reservation)


def test_a_deferred_call_that_comes_back_early_is_admitted_with_its_wait(
    r: redis.Redis,
) -> None:
    limit = tasklock.RateLimit(r, "batch", ["10/s", "1/m"])
    reservation = "{batch}:res:7"
    assert limit.try_acquire()
    state = stored(r, "batch")
    slot = max(state["1000ms"], state["60000ms"])  # when every limit admits: 1/m's TAT
    deferred = limit.admit(0.0, reservation=reservation, keep=2)
    assert deferred.deferred
    assert deferred.retry_after > 50
    assert float(r.get(reservation)) == slot
    assert 2000 < r.pttl(reservation) <= 60_000 + 2000
    # The slot is taken from every limit.
    reserved = {"1000ms": slot + 100_000, "60000ms": slot + 60 * SECOND}
    assert stored(r, "batch") == reserved
    # Without a reservation key the same call is refused, consuming nothing.
    refused = limit.admit(0.0)
    assert not refused
    assert not refused.deferred
    assert stored(r, "batch") == reserved
    # Back with its key, 59 s early at most, waiting up to 2 minutes for its slot: admitted,
    # told to wait until the slot; nothing more reserved.
    before, admitted, after = bracketed(
        r, lambda: limit.admit(0.0, reservation=reservation, early=120)
    )
    assert admitted
    assert_wait_is_exact(before, admitted, after, slot)
    assert not r.exists(reservation)
    assert stored(r, "batch") == reserved
    # early=None: any wait; by default, as long as max_wait (0 here: deferred again).
    assert limit.admit(0.0, reservation=reservation, keep=2).deferred
    assert limit.admit(0.0, reservation=reservation).deferred
    assert r.exists(reservation)
    assert limit.admit(0.0, reservation=reservation, early=None)
    assert not r.exists(reservation)


def test_deferred_calls_that_come_back_late_together_are_spaced_again(r: redis.Redis) -> None:
    """Calls deferred to their slots that come back late and together (a backlog in the broker's
    queue) go one interval apart again, from when they came back: starts never outrun the rate."""
    limit = tasklock.RateLimit(r, "late", "10/s")  # 100 ms apart
    assert limit.try_acquire()
    keys = [f"{{late}}:res:{n}" for n in range(4)]
    assert all(limit.admit(0.0, reservation=key, keep=60).deferred for key in keys)
    slots = [float(r.get(key)) for key in keys]
    assert [b - a for a, b in itertools.pairwise(slots)] == [100_000] * 3
    eventually(lambda: server_us(r) > slots[-1] + 50_000, what="every slot has passed")
    before = server_us(r)
    back = [limit.admit(0.0, reservation=key, early=None) for key in keys[:3]]
    after = server_us(r)
    assert all(back)
    assert not any(r.exists(key) for key in keys[:3])
    # The first goes at once; each other waits for the next start, one interval after the last.
    assert back[0].retry_after == 0
    for n in (1, 2):
        assert n * 100_000 - (after - before) <= wait_us(back[n]) <= n * 100_000
    # The fourth, back as late but waiting for nothing, is deferred again, its slot kept.
    again = limit.admit(0.0, reservation=keys[3])
    assert again.deferred
    assert 200_000 - (server_us(r) - before) <= wait_us(again) <= 300_000
    assert float(r.get(keys[3])) == slots[3]


# -- Errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["string", "list", "zset"])
def test_a_key_of_another_type_is_a_configuration_error_naming_it(
    r: redis.Redis, kind: str
) -> None:
    {"string": lambda: r.set("taken", "x"), "list": lambda: r.rpush("taken", "x"),
     "zset": lambda: r.zadd("taken", {"x": 1})}[kind]()  # fmt: skip
    limit = tasklock.RateLimit(r, "taken", "10/s")
    for call in (limit.try_acquire, limit.acquire, lambda: limit.admit(1.0, reservation="{taken}")):
        with pytest.raises(ConfigurationError) as info:
            call()
        message = str(info.value)
        assert f"the key 'taken' holds a {kind}" in message
        assert "give the rate limit a name of its own" in message
        assert not isinstance(info.value, BackendRefused | BackendUnavailable)


def test_a_reservation_key_of_another_type_is_named(r: redis.Redis) -> None:
    r.hset("{jobs}:res:1", "x", "1")
    with pytest.raises(ConfigurationError) as info:
        tasklock.RateLimit(r, "jobs", "10/s").admit(0.0, reservation="{jobs}:res:1", keep=1)
    assert "'{jobs}:res:1'" in str(info.value)


def test_an_unreachable_server_is_backend_unavailable() -> None:
    port = free_port()  # nothing listens there
    # No retries: redis-py's default policy would spend seconds on each call before failing.
    client = redis.Redis(port=port, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    limit = tasklock.RateLimit(client, "nowhere", "10/s")
    for call, doing in [
        (limit.try_acquire, "rate limiting 'nowhere'"),
        (limit.acquire, "rate limiting 'nowhere'"),
        (lambda: limit.admit(1, reservation="{nowhere}:r"), "rate limiting 'nowhere'"),
        (limit.reset, "resetting rate limit 'nowhere'"),
    ]:
        with pytest.raises(BackendUnavailable) as info:
            call()
        message = str(info.value)
        assert f"redis://localhost:{port}/0" in message
        assert doing in message
        assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)


def test_an_infinite_blocking_timeout_waits_as_long_as_it_takes(r: redis.Redis) -> None:
    assert tasklock.RateLimit(r, "inf", "10/s").acquire(blocking_timeout=math.inf) is True


def test_remaining_after_the_first_call_of_a_burst_is_burst_minus_one(r: redis.Redis) -> None:
    limit = tasklock.RateLimit(r, "sevens", "7/s", burst=5)
    first = limit.try_acquire()
    assert first.remaining == 4
    assert all(limit.try_acquire() for _ in range(4))  # and there were four more


# -- ACL users -------------------------------------------------------------------------------------


@pytest.fixture
def acl(r: redis.Redis) -> Iterator[redis.Redis]:
    """The admin client; every ACL user a test made is deleted afterwards."""
    yield r
    for user in r.acl_users():
        if user not in ("default", b"default"):
            r.acl_deluser(user)


def check_acl(server: RedisServer, admin: redis.Redis) -> None:
    """The documented rules, with the limits' names filled in, are enough; without +hset the
    error is BackendRefused, saying what to grant (and, where the server says it, the command)."""
    everything = ["on", ">pw", "~*", "allchannels", "+@all"]
    rules = ACL_RULES.replace("<your lock names>", "api:*").split()
    admin.execute_command("ACL", "SETUSER", "limiter", "on", ">pw", *rules)
    admin.execute_command("ACL", "SETUSER", "nohset", *everything, "-hset")
    client = server.client(username="limiter", password="pw")
    limit = tasklock.RateLimit(client, "api:one", ["10/s", "1/m"], burst=[2, 1])
    assert limit.try_acquire()
    assert not limit.try_acquire()
    assert limit.admit(0.0, reservation="{api:one}:res:1", keep=1).deferred
    assert limit.admit(0.0, reservation="{api:one}:res:1", early=120)
    limit.reset()
    assert tasklock.RateLimit(client, "api:two", "10/s").acquire(blocking_timeout=1)
    client.close()

    nohset = server.client(username="nohset", password="pw")
    with pytest.raises(BackendRefused) as info:
        tasklock.RateLimit(nohset, "api:one", "1/s").try_acquire()
    nohset.close()
    message = str(info.value)
    assert "refused ACL user 'nohset' while rate limiting 'api:one'" in message
    assert "ACL SETUSER nohset" in message
    assert "+hmget +hset" in message  # the grant that fixes it
    assert "~api:one" in message
    if server.executable.endswith("valkey-server"):
        assert "'hset'" in message  # Redis (6.2 to 7.0) does not say which command it refused
    assert isinstance(info.value, ConfigurationError)
    assert isinstance(info.value.__cause__, redis.exceptions.ResponseError)


def test_an_acl_user_with_the_documented_rules_can_use_a_rate_limit(
    redis_server: RedisServer, acl: redis.Redis
) -> None:
    check_acl(redis_server, acl)


# -- Redis Cluster ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_on_a_redis_cluster(redis_cluster: RedisClusterServers) -> None:
    """Names on each of the three masters; the reservation key shares its limit's slot."""
    redis_cluster.flushall()
    rc = redis_cluster.client()
    try:
        for name in redis_cluster.names_on_every_node("rl"):
            node = redis_cluster.node_for(name).client()
            limit = tasklock.RateLimit(rc, name, ["1/m", "10/h"], burst=2)
            assert [bool(limit.try_acquire()) for _ in range(3)] == [True, True, False]
            assert sorted(stored(node, name)) == ["3600000ms", "60000ms"]
            state = stored(node, name)
            reservation = f"{{{name}}}:res:1"
            deferred = limit.admit(0.0, reservation=reservation, keep=1)
            assert deferred.deferred
            assert deferred.retry_after > 50
            # When both admit: 1/m's TAT less one interval, 10/h's less one of its own.
            slot = max(state["60000ms"] - 60 * SECOND, state["3600000ms"] - 360 * SECOND)
            assert float(node.get(reservation)) == slot
            assert limit.admit(0.0, reservation=reservation, early=0).deferred
            assert limit.admit(0.0, reservation=reservation, early=600)
            assert not node.exists(reservation)
            assert not limit.acquire(blocking_timeout=1)
            limit.reset()
            assert not node.exists(name)
            assert limit.acquire(blocking_timeout=1)
            node.close()
    finally:
        rc.close()


# -- The other servers of the matrix ---------------------------------------------------------------


@pytest.fixture(scope="module", params=["valkey", "redis7"], ids=["valkey-9", "redis-7"])
def other_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    server = RedisServer(binary=require_binary(request.param)).start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def other(other_server: RedisServer) -> Iterator[redis.Redis]:
    client = other_server.client()
    client.flushall()
    client.script_flush()
    yield client
    for user in client.acl_users():
        if user not in ("default", b"default"):
            client.acl_deluser(user)
    client.close()


def test_the_contract_on_other_servers(other: redis.Redis) -> None:
    """TIME inside a script, the TATs kept with their microseconds, atomic refusal, deferral."""
    limit = tasklock.RateLimit(other, "m", ["1/m", "10/h"], burst=[1, 3])
    assert limit.try_acquire().remaining == 0
    state = stored(other, "m")
    slot = state["60000ms"]
    before, refused, after = bracketed(other, limit.try_acquire)
    assert not refused
    assert_wait_is_exact(before, refused, after, slot)
    assert stored(other, "m") == state  # 10/m had room; nothing was taken from it
    deferred = limit.admit(0.0, reservation="{m}:r", keep=1)
    assert deferred.deferred
    assert float(other.get("{m}:r")) == slot
    assert limit.admit(0.0, reservation="{m}:r", keep=1, early=0).deferred
    assert limit.admit(0.0, reservation="{m}:r", early=120)
    assert not other.exists("{m}:r")
    assert 0 < other.pttl("m") <= 2 * 360_000 + 1  # 10/h: its TAT is two intervals ahead
    other.set("s", "x")
    with pytest.raises(ConfigurationError, match="the key 's' holds a string"):
        tasklock.RateLimit(other, "s", "1/s").try_acquire()


def test_acl_on_other_servers(other_server: RedisServer, other: redis.Redis) -> None:
    check_acl(other_server, other)
