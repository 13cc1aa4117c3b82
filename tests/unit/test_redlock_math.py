"""Redlock's arithmetic, pure: quorum, tolerance, drift, validity, fences, verdicts; and the
configuration checks. Time comes from the fake clock; no server is needed (clients that point at
a port where nothing listens are never used to connect here)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from tasklock.core.fanout import PENDING, NoReply, NotAwaited
from tasklock.core.lease import GIVE_UP, SUBSCRIBE
from tasklock.core.owner import new_token, parse_value
from tasklock.core.quorum import (
    DEFAULT_NODE_TIMEOUT,
    NoVerdict,
    Quorum,
    QuorumLoop,
    Tally,
    Validity,
    attempt_value,
    check_node_count,
    decided_by,
    default_connect_timeout,
    default_node_timeout,
    drift_for,
    fault_tolerance,
    flag,
    next_fence,
    quorum_for,
    quorum_ttl,
    round1,
    seconds_until_free,
    tally,
    validity_left,
)
from tasklock.core.redlock import Redlock
from tasklock.core.watchdog import Outcome
from tasklock.errors import ConfigurationError, QuorumNotReached
from tests.support.servers import free_port
from tests.unit.conftest import FakeClock


def test_quorum_and_tolerance_table() -> None:
    assert [quorum_for(n) for n in (1, 3, 5, 7)] == [1, 2, 3, 4]
    assert [fault_tolerance(n) for n in (1, 3, 5, 7)] == [0, 1, 2, 3]


@given(st.integers(min_value=1, max_value=101))
def test_any_two_quorums_share_a_master(n: int) -> None:
    # The fencing argument rests on this: two majorities of the same N always intersect.
    assert 2 * quorum_for(n) > n
    assert quorum_for(n) + fault_tolerance(n) == n


@pytest.mark.parametrize("n", [0, 2, 4, 6])
def test_node_counts_without_a_sensible_quorum_are_refused(n: int) -> None:
    with pytest.raises(ConfigurationError) as info:
        check_node_count(n)
    message = str(info.value)
    assert "N=3 tolerates 1" in message
    assert "N=5 tolerates 2" in message
    if n:
        assert f"quorum is {quorum_for(n)} of {n}" in message


def test_one_node_is_allowed_with_a_warning() -> None:
    with pytest.warns(RuntimeWarning, match="not fault tolerant"):
        check_node_count(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_node_count(3)
        check_node_count(5)


def test_drift_and_validity() -> None:
    assert drift_for(30.0, 0.01, 2) == pytest.approx(0.302)
    assert drift_for(1.0, 0.0, 0) == 0
    assert validity_left(10.0, 2.5, 0.102) == pytest.approx(7.398)
    assert validity_left(1.0, 0.99, 0.012) < 0


def test_validity_runs_on_the_monotonic_clock(fake_clock: FakeClock) -> None:
    validity = Validity(ttl=1.0, drift=drift_for(1.0, 0.01, 2))  # drift 12 ms
    assert validity.left() == pytest.approx(0.988)
    fake_clock.advance(0.5)
    assert validity.elapsed() == pytest.approx(0.5)
    assert validity.left() == pytest.approx(0.488)
    fake_clock.advance(0.487)
    assert validity.left() > 0
    fake_clock.advance(0.002)  # 0.989 s elapsed: past TTL - drift
    assert validity.left() < 0


def test_default_node_timeout() -> None:
    assert default_node_timeout(30.0) == DEFAULT_NODE_TIMEOUT
    assert default_node_timeout(0.5) == pytest.approx(0.05)


@given(st.lists(st.integers(min_value=0, max_value=2**53), min_size=1, max_size=9))
def test_next_fence_is_above_every_counter_read(counters: list[int]) -> None:
    fence = next_fence(counters)
    assert all(fence > c for c in counters)


def test_quorum_ttl_is_what_a_quorum_has_at_least() -> None:
    assert quorum_ttl([900, 1000, 950, 10], 3) == 900
    assert quorum_ttl([1000, 999], 3) is None


def test_seconds_until_free() -> None:
    # 5 masters, quorum 3: 1 free now, 4 held expiring in 100/200/300 ms and never (-1).
    assert seconds_until_free([300, 100, -1, 200], free=1, quorum=3) == pytest.approx(0.2)
    assert seconds_until_free([100], free=3, quorum=3) == 0.0
    assert seconds_until_free([-1, -1, 500], free=1, quorum=3) is None


def test_round_replies_are_classified() -> None:
    assert round1([1, 7]) == (True, 7)
    assert round1([0, 2500]) == (False, 2500)
    verdict, reason = round1(NoReply("no reply within 50 ms"))
    assert verdict is None
    assert "NoReply: no reply within 50 ms" in reason
    assert round1([1])[0] is None  # malformed: no verdict, never a yes
    assert flag(1) == (True, 1)
    assert flag(0) == (False, 0)
    assert flag(True)[0] is None
    assert flag(NoScriptError("NOSCRIPT"))[0] is None


def test_tally_verdicts() -> None:
    results: list[Any] = [
        [1, 4],
        [0, 900],
        RedisConnectionError("Connection refused"),
        NoReply("x"),
        [1, 6],
    ]
    verdicts = tally(results, round1)
    assert verdicts.yes == {0: 4, 4: 6}
    assert verdicts.no == {1: 900}
    assert set(verdicts.failed) == {2, 3}
    assert not verdicts.reached(3)
    assert not verdicts.refused(5, 3)
    assert verdicts.undecided(5, 3)
    assert not verdicts.unreachable(3)
    majority_silent = Tally(failed={0: "a", 1: "b", 2: "c"})
    assert majority_silent.unreachable(3)
    # Masters not waited for because the outcome was decided do not count as unreachable.
    decided = tally([0, 0, 0, NotAwaited("x"), NotAwaited("y")], flag)
    assert decided.refused(5, 3)
    assert not decided.unreachable(3)
    assert decided.unawaited == {3, 4}


def test_tally_maps_positions_to_master_indexes() -> None:
    verdicts = tally([1, 0], flag, indexes=[2, 4])
    assert verdicts.yes == {2: 1}
    assert verdicts.no == {4: 0}


def test_fan_out_stops_waiting_once_decided() -> None:
    decided = decided_by(flag, 3)
    silent = NoReply("no reply")
    assert not decided([1, 1, PENDING, PENDING, PENDING])
    assert decided([1, 1, 1, PENDING, PENDING])  # quorum of yeses
    assert decided([0, 0, 0, PENDING, 1])  # definite noes: a quorum can no longer be reached
    assert not decided([0, 0, PENDING, PENDING, PENDING])
    # Errors decide nothing: the silent masters are waited for, so that a silent majority is
    # reported as QuorumNotReached rather than as "held by someone else".
    assert not decided([1, 1, silent, silent, PENDING])
    assert not decided([silent, silent, silent, PENDING, PENDING])


# -- configuration (constructing a Redlock opens no connection) ---------------------------------
def _clients(count: int) -> list[redis.Redis]:
    return [redis.Redis(host="127.0.0.1", port=free_port()) for _ in range(count)]


def test_bad_arguments_are_named() -> None:
    clients = _clients(3)
    with pytest.raises(ConfigurationError, match="clients must be a list"):
        Redlock("redis://127.0.0.1:1/0", "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"clients\[1\] must be a redis-py client"):
        Redlock([clients[0], object(), clients[2]], "x")
    with pytest.raises(ConfigurationError, match=r"clients\[0\]=.*is not a Redis URL"):
        Redlock(["http://x", clients[1], clients[2]], "x")
    with pytest.raises(ConfigurationError, match="node_timeout must be > 0"):
        Redlock(clients, "x", node_timeout=0)
    with pytest.raises(ConfigurationError, match="drift_factor must be >= 0.0 and < 1.0"):
        Redlock(clients, "x", drift_factor=1.5)
    with pytest.raises(ConfigurationError, match="drift_extra_ms must be a number"):
        Redlock(clients, "x", drift_extra_ms="2")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="no validity time"):
        Redlock(clients, "x", timeout=0.002)
    with pytest.raises(ConfigurationError, match="timeout must be"):
        Redlock(clients, "x", timeout=-1)
    with pytest.raises(ConfigurationError, match="fence_key must be"):
        Redlock(clients, "x", fence_key="")


def test_two_masters_are_refused_with_the_tolerance_table() -> None:
    with pytest.raises(ConfigurationError, match="tolerates 0 failed master"):
        Redlock(_clients(2), "x")


def test_the_same_server_twice_is_refused() -> None:
    a, b, _c = _clients(3)
    with pytest.raises(ConfigurationError, match=r"clients\[0\] and clients\[2\] are the same"):
        Redlock([a, b, a], "x")
    port = a.connection_pool.connection_kwargs["port"]
    twin = redis.Redis(host="localhost", port=port, db=3)  # another db of the same server
    with pytest.raises(ConfigurationError, match="independent masters"):
        Redlock([a, b, twin], "x")
    with pytest.raises(ConfigurationError, match="same Redis server"):
        Redlock([f"redis://localhost:{port}/0", b, f"redis://127.0.0.1:{port}/1"], "x")


def test_url_clients_get_the_connect_allowance_as_socket_timeouts() -> None:
    """The rounds have deadlines of their own (node_timeout from each write); the clients' socket
    timeouts only bound connecting (TCP, HELLO), which gets connect_timeout."""
    ports = [free_port() for _ in range(3)]
    lock = Redlock([f"redis://127.0.0.1:{p}/0" for p in ports], "x", node_timeout=0.07)
    for client in lock.clients:
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == lock.connect_timeout
        assert kwargs["socket_connect_timeout"] == lock.connect_timeout
    assert lock.quorum == 2
    assert lock.node_timeout == 0.07
    assert lock.connect_timeout == 1.0


def test_connect_allowance_defaults_and_bounds() -> None:
    assert default_connect_timeout(30, 0.1) == 1.0
    assert default_connect_timeout(2, 0.1) == 0.5  # a quarter of a short TTL
    assert default_connect_timeout(0.3, 0.1) == 0.1  # never below node_timeout
    assert Redlock(_clients(3), "x", timeout=5, connect_timeout=0.3).connect_timeout == 0.3
    with pytest.raises(ConfigurationError, match="connect_timeout must be > 0"):
        Redlock(_clients(3), "x", connect_timeout=0)


def test_an_attempt_without_verdict_is_retried_until_the_caller_gives_up() -> None:
    """A majority silent is not "held by someone else", nor an error while a blocking acquire
    still has time: the loop waits and retries; the error comes when it gives up."""
    rules = Quorum("x", ["a", "b", "c"], 2, 0.1, 10.0, 0.1, 0.01, 2.0)
    silent = Tally(yes={0: 1}, failed={1: "NoReply: no reply", 2: "NoReply: no reply"})
    attempt = rules.failed_attempt(silent)
    assert isinstance(attempt, NoVerdict)
    assert isinstance(attempt.error, QuorumNotReached)
    held = rules.failed_attempt(Tally(no={0: 500, 1: 700}, failed={2: "x"}))
    assert not isinstance(held, NoVerdict)
    assert held.holder_ttl == 0.7
    waiting = QuorumLoop(True, None, 0.1)
    assert waiting.after_failure(attempt) == SUBSCRIBE
    assert isinstance(waiting.after_failure(attempt), float)
    with pytest.raises(QuorumNotReached, match="2 of 3 masters gave no verdict"):
        QuorumLoop(False, None, 0.1).after_failure(attempt)
    assert QuorumLoop(False, None, 0.1).after_failure(held) == GIVE_UP


def test_renewal_judge() -> None:
    lock = Redlock(_clients(5), "x", timeout=1.0)  # drift 12 ms
    lost: list[str] = []
    judge = lock._renewal(b"owner#3", lost.append).judge
    silent = NoReply("no reply")
    assert judge([1000, 1000, 1000, silent, silent], 0.1) is Outcome.RENEWED
    # A quorum renewed, but too late to still be valid: no verdict, the watchdog retries.
    assert judge([1000, 1000, 1000, 0, 0], 0.99) is Outcome.UNREACHABLE
    assert judge([1000, 1000, 0, 0, 0], 0.1) is Outcome.LOST  # gone on a majority
    assert judge([1000, 1000, silent, silent, 0], 0.1) is Outcome.UNREACHABLE
    assert lost == []  # the judge decides; the watchdog reports


def test_attempt_values_are_unique_and_stay_readable() -> None:
    token = new_token({"task": "t-9"})
    first, second = attempt_value(token), attempt_value(token)
    assert first != second
    holder = parse_value(first + "#12")
    assert holder.fence == 12
    assert holder.token == token.split(" ")[0]
    assert holder.meta["task"] == "t-9"
    assert {"host", "pid", "try"} <= set(holder.meta)
    assert parse_value(attempt_value("abc {}")).meta.keys() == {"try"}
    assert attempt_value("plain-token").startswith("plain-token~")  # not tasklock's format
