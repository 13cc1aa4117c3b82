"""``tasklock.fencing.redis``: the fence check and the write in one script, on a real redis-server
and on a real 3-master Redis Cluster.

What is checked is what the store promises: a write with a token older than the stored one is
refused with StaleFence and changes nothing; the first write, a newer and an equal token are
accepted and store the token beside the value; value and fence key expire together (never the
fence first); a deletion leaves a tombstone; the fence key shares the value's cluster slot; bad
input, keys of the wrong type and an absent server are named errors.
"""

from __future__ import annotations

import datetime
import json
import pickle
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

import tasklock
from tasklock.errors import BackendUnavailable, ConfigurationError, StaleFence
from tasklock.fencing.redis import FENCED_WRITE, fence_key, fenced_delete, fenced_set
from tests.support.polling import eventually
from tests.support.servers import HOST, RedisClusterServers, RedisServer, free_port

KEY = "report:42"
FENCE = "{report:42}:fence"


def state(r: redis.Redis, key: str = KEY) -> tuple[Any, Any]:
    """The stored value and the stored token."""
    return r.get(key), r.get(fence_key(key))


# -- accepted and refused -----------------------------------------------------------------------


def test_the_first_write_is_accepted_and_stores_its_token(r: redis.Redis) -> None:
    fenced_set(r, KEY, "v1", 100)
    assert state(r) == (b"v1", b"100")
    assert fence_key(KEY) == FENCE
    # No expiry asked: both persist.
    assert r.pttl(KEY) == -1
    assert r.pttl(FENCE) == -1


def test_a_newer_token_overwrites_and_an_equal_one_is_the_same_hold(r: redis.Redis) -> None:
    fenced_set(r, KEY, "v1", 100)
    fenced_set(r, KEY, "v2", 200)
    assert state(r) == (b"v2", b"200")
    fenced_set(r, KEY, "v2 again", 200)  # the same hold writing twice
    assert state(r) == (b"v2 again", b"200")


def test_an_older_token_is_refused_and_nothing_changes(r: redis.Redis) -> None:
    fenced_set(r, KEY, "newer", 200, px=60_000)
    pttl = r.pttl(KEY)
    with pytest.raises(StaleFence) as refused:
        fenced_set(r, KEY, "stale", 199)  # no expiry: would make both persistent if written
    assert (refused.value.resource, refused.value.token, refused.value.newer) == (KEY, 199, 200)
    assert "token 199 was refused, token 200 is newer" in str(refused.value)
    assert isinstance(refused.value, tasklock.TaskLockError)
    assert state(r) == (b"newer", b"200")
    assert 0 < r.pttl(KEY) <= pttl  # the expiry was not touched either
    again = pickle.loads(pickle.dumps(refused.value))
    assert (again.resource, again.token, again.newer) == (KEY, 199, 200)


def test_tokens_compare_exactly_across_their_whole_range(r: redis.Redis) -> None:
    """Lua numbers are doubles: 2**53 + 1 and 2**53 would compare equal, and 2**63 - 1 would not
    be representable. Lengths differ too (9 < 10, though "9" > "10" as text)."""
    fenced_set(r, KEY, "ten", 10)
    with pytest.raises(StaleFence):
        fenced_set(r, KEY, "nine", 9)
    fenced_set(r, KEY, "big", 2**53 + 1)
    with pytest.raises(StaleFence) as refused:
        fenced_set(r, KEY, "one less", 2**53)
    assert refused.value.newer == 2**53 + 1
    fenced_set(r, KEY, "top", 2**63 - 1)
    with pytest.raises(StaleFence) as refused:
        fenced_set(r, KEY, "just below", 2**63 - 2)
    assert refused.value.newer == 2**63 - 1
    assert state(r) == (b"top", b"9223372036854775807")
    fenced_set(r, "zero", "first", 0)  # 0 is a token like any other
    assert state(r, "zero") == (b"first", b"0")


def test_a_paused_holder_of_a_real_lock_is_refused(r: redis.Redis) -> None:
    """The case fencing exists for: a holder that ran past its TTL writes after the next one."""
    first = tasklock.Lock(r, "lock:report:42", timeout=0.2)
    assert first.acquire()
    slow_token = first.fence
    assert slow_token is not None
    eventually(lambda: not r.exists("lock:report:42"), what="the first hold expired")
    second = tasklock.Lock(r, "lock:report:42", timeout=30)
    assert second.acquire()
    assert second.fence is not None
    fenced_set(r, KEY, "from the second holder", second.fence)
    with pytest.raises(StaleFence) as refused:
        fenced_set(r, KEY, "from the paused holder", slow_token)
    assert refused.value.newer == second.fence
    assert r.get(KEY) == b"from the second holder"
    second.release()


def test_racing_writers_leave_the_newest_token_s_value(r: redis.Redis) -> None:
    """Twenty threads write tokens in shuffled order: whatever the interleaving, the newest wins,
    and every refusal names a token that was newer than the refused one."""
    tokens = list(range(1_000, 1_020))
    random.shuffle(tokens)
    barrier = threading.Barrier(len(tokens))
    refusals: list[StaleFence] = []

    def write(token: int) -> None:
        barrier.wait(10)
        try:
            fenced_set(r, KEY, f"by {token}", token)
        except StaleFence as exc:
            refusals.append(exc)

    threads = [threading.Thread(target=write, args=(token,)) for token in tokens]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert state(r) == (b"by 1019", b"1019")
    assert all(exc.newer is not None and exc.newer > exc.token for exc in refusals)


def test_values_are_written_as_redis_writes_them(r: redis.Redis) -> None:
    fenced_set(r, "b", b"\x00\xff binary", 1)
    fenced_set(r, "i", 42, 1)
    fenced_set(r, "f", 1.5, 1)
    assert [r.get("b"), r.get("i"), r.get("f")] == [b"\x00\xff binary", b"42", b"1.5"]


def test_a_client_that_decodes_responses(redis_server: RedisServer, r: redis.Redis) -> None:
    text = redis_server.client(decode_responses=True)
    try:
        fenced_set(text, KEY, "v", 7)
        with pytest.raises(StaleFence) as refused:
            fenced_set(text, KEY, "w", 6)
        assert refused.value.newer == 7
        assert text.get(KEY) == "v"
    finally:
        text.close()


def test_a_flushed_script_cache_is_loaded_again(r: redis.Redis) -> None:
    fenced_set(r, KEY, "v1", 1)
    r.script_flush()
    fenced_set(r, KEY, "v2", 2)  # NOSCRIPT, SCRIPT LOAD, again
    assert state(r) == (b"v2", b"2")
    assert r.script_exists(FENCED_WRITE.sha) == [True]


# -- expiry ---------------------------------------------------------------------------------------


def pttls(r: redis.Redis, key: str = KEY) -> tuple[int, int]:
    """(fence key's PTTL, value's PTTL), the fence read first: if the fence expires no earlier
    than the value, its PTTL read first is >= the value's read after."""
    fence = r.pttl(fence_key(key))
    return fence, r.pttl(key)


@pytest.mark.parametrize(
    ("expiry", "ms"),
    [
        ({"px": 60_000}, 60_000),
        ({"ex": 60}, 60_000),
        ({"ex": 1.5}, 1_500),
        ({"ex": datetime.timedelta(minutes=1)}, 60_000),
        ({"px": datetime.timedelta(milliseconds=2_500)}, 2_500),
    ],
)
def test_an_expiry_applies_to_the_value_and_its_fence_alike(
    r: redis.Redis, expiry: dict[str, Any], ms: int
) -> None:
    fenced_set(r, KEY, "v", 1, **expiry)
    fence, value = pttls(r)
    assert ms - 1_000 < value <= fence <= ms


def test_each_write_sets_the_expiry_of_both_keys_again(r: redis.Redis) -> None:
    """Like a plain SET: a write without expiry makes both persistent, a shorter one shortens
    both. The fence always expires with the value it guards, never before it."""
    fenced_set(r, KEY, "v1", 1, px=60_000)
    fenced_set(r, KEY, "v2", 2)
    assert pttls(r) == (-1, -1)
    fenced_set(r, KEY, "v3", 3, px=5_000)
    fence, value = pttls(r)
    assert 0 < value <= fence <= 5_000


def test_once_both_expired_the_resource_starts_over(r: redis.Redis) -> None:
    """The documented choice: an expired value has nothing newer to protect, so the fence goes
    with it, and the next write is accepted whatever its token."""
    fenced_set(r, KEY, "short-lived", 500, px=100)
    with pytest.raises(StaleFence):
        fenced_set(r, KEY, "stale", 400)
    eventually(lambda: r.exists(KEY, FENCE) == 0, what="value and fence expired")
    fenced_set(r, KEY, "after expiry", 400)
    assert state(r) == (b"after expiry", b"400")


def test_the_fence_is_never_gone_while_the_value_lives(r: redis.Redis) -> None:
    """Polled while a 150 ms value expires, both keys read by one script (so at one instant of
    the server's clock: a script sees time stand still): never the value without its fence."""
    both = r.register_script("return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}")
    fenced_set(r, KEY, "v", 5, px=150)
    seen = 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        value, fence = both(keys=[KEY, FENCE])
        if value is None:
            break
        assert fence == b"5", "the fence key expired while the value it guards was still there"
        seen += 1
    assert seen > 0
    eventually(lambda: r.exists(FENCE) == 0, what="the fence key expired too")


# -- delete ---------------------------------------------------------------------------------------


def test_a_fenced_delete_leaves_a_tombstone(r: redis.Redis) -> None:
    fenced_set(r, KEY, "v", 10)
    with pytest.raises(StaleFence) as refused:
        fenced_delete(r, KEY, 9)
    assert refused.value.newer == 10
    assert r.get(KEY) == b"v"
    assert fenced_delete(r, KEY, 11) is True
    assert state(r) == (None, b"11")
    with pytest.raises(StaleFence):  # the stale holder cannot bring the value back
        fenced_set(r, KEY, "resurrected", 10)
    assert r.exists(KEY) == 0
    assert fenced_delete(r, KEY, 11) is False  # nothing to delete; the same hold again
    fenced_set(r, KEY, "newer", 12)
    assert state(r) == (b"newer", b"12")


def test_a_tombstone_keeps_the_expiry_of_the_deleted_value(r: redis.Redis) -> None:
    fenced_set(r, KEY, "v", 1, px=60_000)
    fenced_delete(r, KEY, 2)
    assert 50_000 < r.pttl(FENCE) <= 60_000
    fenced_set(r, "forever", "v", 1)
    fenced_delete(r, "forever", 2)
    assert r.pttl(fence_key("forever")) == -1
    assert fenced_delete(r, "never-written", 3) is False
    assert state(r, "never-written") == (None, b"3")


# -- errors ---------------------------------------------------------------------------------------


def test_a_missing_fence_token_is_never_a_silent_pass(r: redis.Redis) -> None:
    with pytest.raises(ConfigurationError, match="is None"):
        fenced_set(r, KEY, "v", None)
    with pytest.raises(ConfigurationError, match="is None"):
        fenced_delete(r, KEY, None)
    assert r.exists(KEY, FENCE) == 0


@pytest.mark.parametrize("token", [True, "5", 5.0, -1, 2**63])
def test_a_bad_token_is_named(r: redis.Redis, token: Any) -> None:
    with pytest.raises(ConfigurationError, match="fence token for 'report:42'"):
        fenced_set(r, KEY, "v", token)
    assert r.exists(KEY, FENCE) == 0


@pytest.mark.parametrize("key", ["", None, b"report:42", 42])
def test_a_bad_key_is_named(r: redis.Redis, key: Any) -> None:
    with pytest.raises(ConfigurationError, match="key must be a non-empty string"):
        fenced_set(r, key, "v", 1)
    with pytest.raises(ConfigurationError, match="key must be a non-empty string"):
        fenced_delete(r, key, 1)


@pytest.mark.parametrize("value", [None, True, {"a": 1}, ["x"]])
def test_a_value_redis_cannot_store_is_named(r: redis.Redis, value: Any) -> None:
    with pytest.raises(ConfigurationError, match="value must be str, bytes, int or float"):
        fenced_set(r, KEY, value, 1)
    assert r.exists(KEY, FENCE) == 0


@pytest.mark.parametrize(
    ("expiry", "match"),
    [
        ({"ex": 1, "px": 1000}, "not both"),
        ({"px": 1.5}, "whole number of milliseconds"),
        ({"ex": "10"}, "number of seconds"),
        ({"px": True}, "number of milliseconds"),
        ({"ex": 0}, "above 0"),
        ({"px": -5}, "above 0"),
        ({"ex": float("inf")}, "finite"),
        ({"ex": float("nan")}, "finite"),
        ({"px": datetime.timedelta(0)}, "above 0"),
        ({"px": 2**70}, "finite expiry above 0"),
    ],
)
def test_a_bad_expiry_is_named(r: redis.Redis, expiry: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        fenced_set(r, KEY, "v", 1, **expiry)
    assert r.exists(KEY, FENCE) == 0


def test_a_value_key_of_another_type_is_named_and_kept(r: redis.Redis) -> None:
    r.hset(KEY, "field", "data of your own")
    with pytest.raises(ConfigurationError) as wrong:
        fenced_set(r, KEY, "v", 1)
    assert "the key 'report:42' holds a hash, not a string (the fenced value)" in str(wrong.value)
    with pytest.raises(ConfigurationError, match="holds a hash"):
        fenced_delete(r, KEY, 1)
    assert r.hgetall(KEY) == {b"field": b"data of your own"}
    assert r.exists(FENCE) == 0


def test_a_fence_key_of_another_type_or_content_is_named(r: redis.Redis) -> None:
    r.rpush(FENCE, "x")
    with pytest.raises(ConfigurationError) as wrong:
        fenced_set(r, KEY, "v", 1)
    assert "the key '{report:42}:fence' holds a list, not a string (its fence token)" in str(
        wrong.value
    )
    r.delete(FENCE)
    r.set(FENCE, "not a token")
    with pytest.raises(ConfigurationError, match=r"fence key '\{report:42\}:fence' holds 'not a"):
        fenced_set(r, KEY, "v", 1)
    assert r.exists(KEY) == 0


def test_a_server_that_does_not_answer_is_backend_unavailable() -> None:
    port = free_port()  # nothing listens there
    client = redis.Redis(host=HOST, port=port, socket_connect_timeout=1)
    with pytest.raises(BackendUnavailable) as down:
        fenced_set(client, KEY, "v", 1)
    assert f"{HOST}:{port}" in str(down.value)
    assert "writing 'report:42' fenced by token 1" in str(down.value)
    assert isinstance(down.value.__cause__, redis.ConnectionError)
    with pytest.raises(BackendUnavailable):
        fenced_delete(client, KEY, 1)


def test_a_key_with_a_stray_brace_works_on_a_single_redis(r: redis.Redis) -> None:
    fenced_set(r, "a}b", "v", 2)
    assert r.get("a}b:fence") == b"2"
    with pytest.raises(StaleFence):
        fenced_set(r, "a}b", "w", 1)


# -- Redis Cluster --------------------------------------------------------------------------------


@pytest.fixture
def rc(redis_cluster: RedisClusterServers) -> Iterator[Any]:
    """A cluster client; every node emptied before the test."""
    redis_cluster.flushall()
    client = redis_cluster.client()
    yield client
    client.close()


@pytest.mark.parametrize(
    "key",
    ["report:42", "jobs:{acct-42}:report", "{acct-42}", "a{b", "x{", "{a}}", "ü-ключ", "a" * 300],
)
def test_the_fence_key_hashes_like_its_key(redis_cluster: RedisClusterServers, key: str) -> None:
    """redis-py's slot and the server's own CLUSTER KEYSLOT agree: one slot for both keys."""
    fence = fence_key(key)
    assert key_slot(fence.encode()) == key_slot(key.encode())
    node = redis_cluster.nodes[0].client()
    try:
        assert node.cluster("KEYSLOT", fence) == node.cluster("KEYSLOT", key)
    finally:
        node.close()


def test_on_a_redis_cluster(redis_cluster: RedisClusterServers, rc: Any) -> None:
    """Keys on each of the three masters, plain and with a hash tag: accepted, refused, deleted;
    value and fence key on the node that serves the key."""
    names = redis_cluster.names_on_every_node("report")
    keys = [*names, *(f"jobs:{{{name}}}:total" for name in names)]
    for key in keys:
        node = redis_cluster.node_for(key).client()
        try:
            fenced_set(rc, key, "v1", 10, px=60_000)
            fenced_set(rc, key, "v2", 10)
            with pytest.raises(StaleFence) as refused:
                fenced_set(rc, key, "stale", 9)
            assert refused.value.newer == 10
            assert node.get(key) == b"v2"
            assert node.get(fence_key(key)) == b"10"
            assert node.pttl(fence_key(key)) == -1
            assert fenced_delete(rc, key, 11) is True
            assert node.get(fence_key(key)) == b"11"
            with pytest.raises(StaleFence):
                fenced_set(rc, key, "resurrected", 10)
        finally:
            node.close()


def test_a_stray_brace_on_a_cluster_is_named(rc: Any) -> None:
    for key in ("a}b", "x{}y", "{}x"):
        with pytest.raises(ConfigurationError, match="has a '}' but no hash tag"):
            fenced_set(rc, key, "v", 1)
    fenced_set(rc, "{acct}a}b", "v", 1)  # a hash tag makes it fine
    assert rc.get("{acct}a}b:fence") == b"1"


def test_a_cluster_that_lost_its_scripts_loads_them_again(
    redis_cluster: RedisClusterServers, rc: Any
) -> None:
    for node in redis_cluster.nodes:
        client = node.client()
        client.script_flush()
        client.close()
    for key in redis_cluster.names_on_every_node("flushed"):
        fenced_set(rc, key, "v", 1)
        assert rc.get(key) == b"v"


# -- the demo's ledger ----------------------------------------------------------------------------


def test_the_demo_records_a_refused_write_as_not_accepted(
    redis_server: RedisServer, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's settle runs write with fenced_set: a late run of an older hold is recorded
    with "accepted": False, which the demo's checks report as a broken promise."""
    from tasklock.demo import ledger
    from tasklock.demo.processes import DemoError
    from tasklock.demo.scenario import Verdict, check_runs

    monkeypatch.setenv("TASKLOCK_URL", redis_server.url)
    monkeypatch.setenv("TASKLOCK_KEY_PREFIX", "fenced-demo")
    newer = ledger.work("celery", "settle", 101, 2_000, 0)
    late = ledger.work("celery", "settle", 101, 1_000, 0)
    assert (newer["accepted"], late["accepted"]) == (True, False)
    key = "fenced-demo:settled:{celery:settle:101}"
    assert r.get(f"{key}:fence") == b"2000"  # under the namespace, as the demo's cleanup needs
    assert json.loads(r.get(key) or "")["fence"] == 2_000
    assert [run["accepted"] for run in ledger.read_runs(r, "fenced-demo")] == [True, False]
    with pytest.raises(DemoError, match=r"tokens \[1000\] were rejected as stale"):
        check_runs("Celery settle", [{**late, "start": 0, "end": 1}], [Verdict(ran=True)])
