"""``tasklock.Leader`` on a real redis-server: one leader at a time, terms that increase, a standby
woken by a resignation, failover after a SIGKILL within one TTL, and the pause case: a leader
SIGSTOPped past its TTL resumes, sees it no longer leads before acting, and any fenced write it
still attempts on its old term is rejected. (Redlock and etcd backends: test_leader_backends.)"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest
import redis

from tasklock import Leader
from tasklock.core.clock import use_clock
from tasklock.errors import ConfigurationError
from tasklock.fencing.redis import fenced_set
from tests.support.clocks import ClockAhead
from tests.support.polling import eventually
from tests.support.scripts import ScriptProcess
from tests.support.servers import RedisServer

TTL = 2.0


def test_one_leads_the_others_stand_by(r: redis.Redis, redis_server: RedisServer) -> None:
    first = Leader(redis_server.url, "cron:one", ttl=TTL)
    second = Leader(redis_server.url, "cron:one", ttl=TTL)
    assert first.campaign()
    assert first.is_leader
    assert first.campaign()  # leading already: still True, same term
    term = first.fence
    assert not second.campaign()
    assert not second.is_leader
    assert second.fence is None
    holder = second.leader()
    assert holder is not None
    assert holder.meta["role"] == "leader"
    assert first.confirm()
    first.resign()
    assert not first.is_leader
    assert second.campaign()
    assert second.fence is not None
    assert term is not None
    assert second.fence > term
    second.resign()


def test_a_resignation_wakes_the_standby(redis_server: RedisServer) -> None:
    leader = Leader(redis_server.url, "cron:wake", ttl=30)
    standby = Leader(redis_server.url, "cron:wake", ttl=30)
    elected = threading.Event()
    assert leader.campaign()

    def wait() -> None:
        if standby.wait_for_leadership(timeout=20):
            elected.set()

    thread = threading.Thread(target=wait)
    thread.start()
    assert not elected.wait(0.2)  # it waits while the leader leads
    leader.resign()
    assert elected.wait(10)  # woken by the release, long before the 30 s TTL
    thread.join(10)
    assert standby.is_leader
    standby.resign()


def test_with_blocks_until_elected_and_resigns_on_exit(redis_server: RedisServer) -> None:
    calls: list[str] = []
    election = Leader(
        redis_server.url,
        "cron:with",
        ttl=TTL,
        on_elected=lambda leader: calls.append(f"elected {leader.fence}"),
    )
    with election:
        assert election.is_leader
        term = election.fence
    assert not election.is_leader
    assert calls == [f"elected {term}"]
    assert Leader(redis_server.url, "cron:with", ttl=TTL).campaign()


def test_confirm_steps_down_when_the_store_lost_the_term(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    lost: list[int | None] = []
    leader = Leader(redis_server.url, "cron:gone", ttl=30, on_lost=lambda e: lost.append(e.fence))
    assert leader.campaign()
    r.delete("cron:gone")  # an operator's force-release, or a failover that forgot it
    assert not leader.confirm()
    assert not leader.is_leader
    assert leader.lost
    assert "no longer holds" in str(leader.lost.reason)
    assert len(lost) == 1
    # A new term can be won (the lost one is let go first).
    assert leader.campaign()
    assert leader.is_leader
    leader.resign()


@pytest.mark.parametrize("ttl", [0, -1, "10", True, float("nan"), float("inf"), 10**9])
def test_a_bad_ttl_is_refused(redis_server: RedisServer, ttl: object) -> None:
    with pytest.raises(ConfigurationError, match="^Leader ttl must be"):
        Leader(redis_server.url, "cron:bad", ttl=ttl)  # type: ignore[arg-type]


@pytest.mark.parametrize("option", ["on_elected", "on_lost"])
def test_a_callback_that_is_not_callable_is_refused(
    r: redis.Redis, redis_server: RedisServer, option: str
) -> None:
    """Refused when made: accepted, ``on_elected=5`` raised TypeError in ``campaign()`` after the
    lock was taken, and nothing released it."""
    with pytest.raises(ConfigurationError, match=f"Leader {option} must be a callable"):
        Leader(redis_server.url, "cron:callback", ttl=5, **{option: 5})
    assert not r.exists("cron:callback")


# -- real processes --------------------------------------------------------------------------------

LEADER = """
import sys, time
import redis
from tasklock import Leader
from tasklock.core.clock import use_clock
from tasklock.fencing.redis import fenced_set

url, name = sys.argv[1], sys.argv[2]
r = redis.Redis.from_url(url)
election = Leader(url, name, ttl=float(sys.argv[3]))
assert election.wait_for_leadership(timeout=20)
print("leading", election.fence, flush=True)
while True:
    if not election.is_leader:
        print("stepped down", election.fence, flush=True)
        break
    try:
        fenced_set(r, name + ":report", f"written by term {election.fence}", election.fence)
    except StaleFence:
        print("rejected", election.fence, flush=True)
        break
    r.rpush(name + ":writes", election.fence)
    time.sleep(0.02)  # one round of work
sys.stdin.read()
"""


class LeaderProcess(ScriptProcess):
    def __init__(self, url: str, name: str, ttl: float) -> None:
        super().__init__(LEADER, url, name, str(ttl))
        word, term = self.line().split()
        assert word == "leading"
        self.term = int(term)


@pytest.fixture
def leaders() -> Iterator[list[LeaderProcess]]:
    started: list[LeaderProcess] = []
    yield started
    for leader in started:
        leader.stop()


def test_a_sigkilled_leader_is_replaced_within_one_ttl(
    r: redis.Redis, redis_server: RedisServer, leaders: list[LeaderProcess]
) -> None:
    old = LeaderProcess(redis_server.url, "cron:kill", TTL)
    leaders.append(old)
    standby = Leader(redis_server.url, "cron:kill", ttl=TTL)
    assert not standby.campaign()
    old.process.kill()
    assert standby.wait_for_leadership(timeout=3 * TTL)  # the dead leader's lock expires
    assert standby.fence is not None
    assert standby.fence > old.term
    standby.resign()


def test_a_leader_paused_past_its_ttl_never_acts_on_its_old_term(
    r: redis.Redis, redis_server: RedisServer, leaders: list[LeaderProcess]
) -> None:
    name = "cron:pause"
    old = LeaderProcess(redis_server.url, name, TTL)
    leaders.append(old)
    eventually(lambda: r.llen(f"{name}:writes") > 3, timeout=10, what="the old leader working")
    old.process.send_signal(signal.SIGSTOP)  # paused mid-loop, its watchdog too
    standby = Leader(redis_server.url, name, ttl=TTL)
    assert standby.wait_for_leadership(timeout=4 * TTL)  # its lock expired during the pause
    new_term = standby.fence
    assert new_term is not None
    assert new_term > old.term
    fenced_set(r, f"{name}:report", f"written by term {new_term}", new_term)
    writes_before = r.llen(f"{name}:writes")
    old.process.send_signal(signal.SIGCONT)
    # It sees at once (its own clock ran on while it was stopped) that it no longer leads; had a
    # write slipped past the check, the fenced store would have rejected it.
    outcome = old.line()
    assert outcome in (f"stepped down {old.term}", f"rejected {old.term}"), outcome
    assert r.llen(f"{name}:writes") == writes_before  # no round of work on the old term
    assert r.get(f"{name}:report") == f"written by term {new_term}".encode()
    assert standby.confirm()
    standby.resign()


def test_resign_then_campaign_gives_a_new_term(redis_server: RedisServer) -> None:
    election = Leader(redis_server.url, "cron:terms", ttl=TTL)
    terms = []
    for _ in range(3):
        assert election.campaign()
        terms.append(election.fence)
        election.resign()
    assert terms == sorted(terms)
    assert len(set(terms)) == 3


def test_is_leader_reads_the_lease_off_its_own_clock(redis_server: RedisServer) -> None:
    """The pause case, made exact: with this process's clock a TTL on (as after a SIGSTOP),
    is_leader is False at once, before any round trip could have told it so."""
    leader = Leader(redis_server.url, "cron:clock", ttl=30)
    assert leader.campaign()
    assert leader.is_leader
    previous = use_clock(ClockAhead(30))
    try:
        assert not leader.is_leader
        assert leader.lost  # nothing told it: its own clock did
        assert not leader.lost.is_set()
    finally:
        use_clock(previous)
    leader.resign()


def test_on_redlock_masters(nodes: list[RedisServer]) -> None:
    urls = [server.url for server in nodes]
    first, second = Leader(urls, "cron:redlock", ttl=TTL), Leader(urls, "cron:redlock", ttl=TTL)
    assert first.campaign()
    assert not second.campaign()
    term = first.fence
    first.resign()
    assert second.wait_for_leadership(timeout=10)
    assert second.fence is not None
    assert term is not None
    assert second.fence > term
    second.resign()


@pytest.mark.parametrize(
    ("store", "owner_info", "words"),
    [
        (123, None, "Leader store must be a redis-py client, a Redis, etcd or ZooKeeper URL"),
        (
            "http://127.0.0.1:6379",
            None,
            "Leader store='http://127.0.0.1:6379' is not a Redis, etcd or ZooKeeper",
        ),
        ([], None, "Leader store is an empty list"),
        (["redis://127.0.0.1:1/0", 5], None, r"Leader store\[1\] must be a Redis URL"),
        (None, "web-1", "Leader owner_info must be a dict"),
    ],
)
def test_a_bad_store_or_owner_info_is_refused_naming_it(
    redis_server: RedisServer, store: object, owner_info: object, words: str
) -> None:
    store = redis_server.url if store is None else store
    with pytest.raises(ConfigurationError, match=words):
        Leader(store, "cron:bad-store", owner_info=owner_info)  # type: ignore[arg-type]
