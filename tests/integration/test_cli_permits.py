"""The `tasklock` command on Semaphores, against a real redis-server: ``ls`` lists each live permit
beside the locks, ``show`` lists a semaphore's permits and fence counter, and ``release`` frees
one named permit (owner-checked, waking a waiter) and refuses to guess which.

A Semaphore's permits are members of one sorted set at its name, scored with their expiry on the
server's clock (see :mod:`tasklock.ops.permits`): the tests put expired permits and other
libraries' sorted sets beside them, and check that neither is listed, shown or touched.
"""

from __future__ import annotations

import io
import json
import sys
import time
from collections.abc import Callable

import pytest
import redis
import redis.exceptions as redis_errors

import tasklock
from tasklock.cli import main
from tasklock.core.owner import parse_value
from tasklock.ops import permits
from tests.support.polling import eventually
from tests.support.servers import RedisServer
from tests.support.waking import BIG_SLEEP, assert_woken_by_release, evalsha_calls, subscribers

TASK = "reports.export"
TASK_KEY = f"tasklock:{{{TASK}}}:lock:" + "d" * 64
TASK_FENCE = f"tasklock:{{{TASK}}}:fence"
TOKEN = "0123456789abcdef0123456789abcdef"
#: The fields of an `ls --json` row before permits were listed: scripts rely on every one.
LOCK_FIELDS = {
    "key",
    "host",
    "pid",
    "task",
    "task_name",
    "acquired_at",
    "ttl_ms",
    "fence",
    "token",
    "meta",
    "value",
}

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], redis_server: RedisServer) -> Run:
    """Call main() in-process against the module's server; returns (status, stdout, stderr)."""

    def call(*argv: str) -> tuple[int, str, str]:
        code = main([*argv, "--url", redis_server.url])
        out, err = capsys.readouterr()
        return code, out, err

    return call


def _after_stamp(value: bytes) -> None:
    """Owner metadata stamps ``at`` in ms: make the next acquisition's stamp later."""
    at = parse_value(value).meta["at"]
    while time.time() < at + 0.002:
        time.sleep(0.001)


def _permits(
    r: redis.Redis, name: str, count: int, limit: int = 3, **kwargs: object
) -> list[tasklock.Semaphore]:
    """``count`` Semaphores on ``name``, each holding a permit, acquired in this order."""
    held = []
    for i in range(count):
        sem = tasklock.Semaphore(
            r,
            name,
            limit,
            timeout=60,
            thread_local=False,
            owner_info={"task": f"job-{i}"},
            **kwargs,  # type: ignore[arg-type]
        )
        assert sem.acquire(blocking=False)
        [(member, _)] = [m for m in r.zrange(name, 0, -1, withscores=True) if _is(sem, m[0])]
        _after_stamp(member)
        held.append(sem)
    return held


def _is(sem: tasklock.Semaphore, member: bytes) -> bool:
    return member.endswith(b"#%d" % sem.fence) if sem.fence is not None else False


def _member(sem: tasklock.Semaphore, r: redis.Redis) -> tuple[bytes, float]:
    [found] = [m for m in r.zrange(sem.name, 0, -1, withscores=True) if _is(sem, m[0])]
    return found


def _server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def _stale_and_foreign(r: redis.Redis, semaphore: str) -> None:
    """What must never be listed as a permit: an expired permit in ``semaphore``, a semaphore
    whose permits all expired, and other libraries' sorted sets (one with tasklock-looking
    members that are not permits, one scored in the future like a delayed queue)."""
    now = _server_ms(r)
    expired = f'{TOKEN} {{"host":"gone","pid":1,"at":1700000000}}#5'
    r.zadd(semaphore, {expired: now - 10_000})
    r.zadd("stale-sem", {expired: now - 10_000})
    r.zadd(
        "leaderboard",
        {
            "alice": 9e15,
            f"{TOKEN} no-meta#3": 9e15,
            f'{TOKEN} {{"who":"x"}}#4': 9e15,
            f'{TOKEN} {{"host":"h","pid":1}}': 9e15,  # no fence: never a permit
        },
    )
    r.zadd("delayed-jobs", {"job-1": now + 60_000, "job-2": now + 120_000})


# --- ls -----------------------------------------------------------------------------------------


def test_ls_lists_every_live_permit_beside_the_locks(r: redis.Redis, run: Run) -> None:
    lock = tasklock.Lock(r, "plain-lock", timeout=30)
    assert lock.acquire()
    _after_stamp(r.get("plain-lock") or b"")
    first, second = _permits(r, "api", 2)
    _stale_and_foreign(r, "api")

    code, out, err = run("ls")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["KEY", "HOST", "PID", "TASK", "AGE", "TTL", "FENCE", "KIND"]
    rows = [line.split(None, 7) for line in lines[1:]]
    assert [(row[0], row[3], row[6], row[7]) for row in rows] == [
        ("api", "job-1", str(second.fence), "permit (2 live)"),
        ("api", "job-0", str(first.fence), "permit (2 live)"),
        ("plain-lock", "-", str(lock.fence), "lock"),
    ]

    code, out, err = run("ls", "--json")
    assert (code, err) == (0, "")
    listed = json.loads(out)
    assert [(row["key"], row["kind"], row["permits"]) for row in listed] == [
        ("api", "permit", 2),
        ("api", "permit", 2),
        ("plain-lock", "lock", None),
    ]
    for row, holder in zip(listed, (second, first, lock), strict=True):
        assert row.keys() >= LOCK_FIELDS  # fields added, none renamed or dropped
        assert row["fence"] == holder.fence
        assert 0 < row["ttl_ms"] <= (60_000 if row["kind"] == "permit" else 30_000)
    assert listed[0]["value"] == _member(second, r)[0].decode()
    assert listed[1]["meta"]["task"] == "job-0"

    code, out, _ = run("ls", "--json", "--match", "api*")
    assert [row["fence"] for row in json.loads(out)] == [second.fence, first.fence]


def test_a_lock_only_table_keeps_its_columns(r: redis.Redis, run: Run) -> None:
    lock = tasklock.Lock(r, "only-lock", timeout=30)
    assert lock.acquire()
    _stale_and_foreign(r, "gone-sem")  # sorted sets with no live permit add no column
    code, out, _ = run("ls")
    assert code == 0
    assert out.splitlines()[0].split() == ["KEY", "HOST", "PID", "TASK", "AGE", "TTL", "FENCE"]
    assert len(out.splitlines()) == 2


def test_ls_with_only_stale_and_foreign_sorted_sets_lists_nothing(r: redis.Redis, run: Run) -> None:
    _stale_and_foreign(r, "api")
    code, out, _ = run("ls")
    assert code == 0
    assert "No tasklock locks held" in out
    assert json.loads(run("ls", "--json")[1]) == []


@pytest.mark.parametrize("skew", [-3600.0, 3600.0], ids=["client-behind", "client-ahead"])
def test_live_means_live_on_the_servers_clock(
    r: redis.Redis, run: Run, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    """The client's clock an hour off either way: expired permits stay out, live ones in."""
    [held] = _permits(r, "api", 1)
    _stale_and_foreign(r, "api")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew)
    code, out, _ = run("ls", "--json")
    monkeypatch.setattr(time, "time", real)
    assert code == 0
    [row] = json.loads(out)
    assert row["fence"] == held.fence
    assert 59_000 < row["ttl_ms"] <= 60_000


def test_ls_without_scan_type_as_on_redis_5(
    r: redis.Redis, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Servers before 6.0 refuse SCAN's TYPE option: both passes fall back to reading values."""
    lock = tasklock.Lock(r, "plain-lock", timeout=30)
    assert lock.acquire()
    first, second = _permits(r, "api", 2)
    _stale_and_foreign(r, "api")
    r.set("plain", "hello")
    r.hset("a-hash", "f", "v")
    scan = redis.Redis.scan
    refused: list[str] = []

    def old_scan(self: redis.Redis, *args: object, **kwargs: object) -> object:
        if kwargs.get("_type") is not None:
            refused.append(str(kwargs["_type"]))
            raise redis_errors.ResponseError("syntax error")
        return scan(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(redis.Redis, "scan", old_scan)
    code, out, err = run("ls", "--json")
    assert (code, err) == (0, "")
    assert refused == ["string", "zset"]
    listed = json.loads(out)
    assert sorted(row["fence"] for row in listed) == sorted([lock.fence, first.fence, second.fence])
    assert {row["key"] for row in listed} == {"api", "plain-lock"}


def test_a_semaphore_with_more_permits_than_one_read_is_listed_whole(
    r: redis.Redis, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sets are read PERMITS_PER_READ members at a time (a large foreign set costs one bounded
    read); a semaphore with more live permits than that is read again, whole."""
    monkeypatch.setattr(permits, "PERMITS_PER_READ", 2)
    held = _permits(r, "wide", 3, limit=5)
    fences = sorted(s.fence for s in held if s.fence is not None)
    code, out, _ = run("ls", "--json")
    assert code == 0
    assert sorted(row["fence"] for row in json.loads(out)) == fences
    assert {row["permits"] for row in json.loads(out)} == {3}
    code, out, _ = run("show", "wide", "--json")
    assert sorted(h["fence"] for h in json.loads(out)["holders"]) == fences


# --- show ---------------------------------------------------------------------------------------


def test_show_a_semaphore_lists_its_permits_and_fence_counter(r: redis.Redis, run: Run) -> None:
    first, second = _permits(r, "api", 2)
    _stale_and_foreign(r, "api")
    first.extend(100)  # the first acquired now frees last

    code, out, err = run("show", "api")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["key", "api"]
    assert "semaphore, 2 live permits" in lines[1]
    assert f"{{api}}:fence = {second.fence}" in out
    header = lines.index("permits, first to free first:") + 1
    assert lines[header].split() == ["FENCE", "HOST", "PID", "TASK", "AGE", "TTL", "TOKEN"]
    rows = [line.split() for line in lines[header + 1 :]]
    tokens = [parse_value(_member(s, r)[0]).token for s in (first, second)]
    assert [(row[0], row[3], row[-1]) for row in rows] == [
        (str(second.fence), "job-1", tokens[1]),
        (str(first.fence), "job-0", tokens[0]),
    ]
    assert "gone" not in out  # the expired permit

    code, out, _ = run("show", "api", "--json")
    data = json.loads(out)
    assert (data["key"], data["kind"], data["permits"]) == ("api", "semaphore", 2)
    assert [h["fence"] for h in data["holders"]] == [second.fence, first.fence]
    assert [h["token"] for h in data["holders"]] == tokens[::-1]
    assert 0 < data["holders"][0]["ttl_ms"] <= 60_000
    assert 100_000 < data["holders"][1]["ttl_ms"] <= 160_000
    assert data["fence_counters"] == [
        {"key": "{api}:fence", "kind": "default", "value": second.fence}
    ]


def test_show_a_task_layer_semaphore_names_the_tasks_counter(r: redis.Redis, run: Run) -> None:
    r.set(TASK_FENCE, 9 * 10**15)  # above the clock: the next fence is the counter's next
    [held] = _permits(r, TASK_KEY, 1, fence_key=TASK_FENCE)
    code, out, _ = run("show", TASK_KEY)
    assert code == 0
    assert held.fence == 9 * 10**15 + 1
    assert f"fence counter (task layer)  {TASK_FENCE} = {held.fence}" in out
    r.set(TASK_FENCE, 5)  # as after a restart without persistence
    assert "BEHIND" in run("show", TASK_KEY)[1]


@pytest.mark.parametrize("key", ["leaderboard", "delayed-jobs", "stale-sem"])
@pytest.mark.parametrize("command", ["show", "release"])
def test_sorted_sets_without_a_live_permit_are_left_alone(
    r: redis.Redis, run: Run, key: str, command: str
) -> None:
    _stale_and_foreign(r, "api")
    before = {k: r.dump(k) for k in r.scan_iter()}
    argv = [command, key] if command == "show" else [command, key, "--force", "--yes"]
    code, out, err = run(*argv, *(["--fence", "5"] if command == "release" else []))
    assert (code, out) == (1, "")
    assert "no live tasklock permit" in err
    assert len(err.strip().splitlines()) == 1
    assert {k: r.dump(k) for k in r.scan_iter()} == before


# --- release ------------------------------------------------------------------------------------


def test_release_one_permit_wakes_a_waiter_and_leaves_the_others(r: redis.Redis, run: Run) -> None:
    first, second = _permits(r, "api", 2, limit=2)
    kept = _member(second, r)
    waiter = tasklock.Semaphore(r, "api", 2, timeout=60, sleep=BIG_SLEEP, thread_local=False)
    before = evalsha_calls(r)
    outcome: list[tuple[int, str, str]] = []

    def asleep() -> None:
        eventually(lambda: subscribers(r, "api") >= 1, what="the waiter subscribed")
        eventually(lambda: evalsha_calls(r) >= before + 2, what="the waiter tried twice")

    def release() -> None:
        outcome.append(run("release", "api", "--force", "--yes", "--fence", str(first.fence)))

    assert_woken_by_release(waiter, release, asleep)

    [(code, out, err)] = outcome
    assert (code, err) == (0, "")
    assert f"fence {first.fence}" in out
    assert f"Released the permit with fence {first.fence} of api; waiters were woken." in out
    assert not first.owned()
    assert second.owned()
    assert _member(second, r) == kept  # untouched, its expiry too
    assert waiter.owned()
    assert r.zcard("api") == 2  # the set was never deleted
    waiter.release()
    second.release()


def test_release_by_token(r: redis.Redis, run: Run) -> None:
    first, second = _permits(r, "api", 2)
    token = parse_value(_member(second, r)[0]).token
    code, out, _ = run("release", "api", "--force", "--yes", "--token", token)
    assert code == 0
    assert f"fence {second.fence}" in out
    assert first.owned()
    assert not second.owned()


def test_release_of_a_semaphore_needs_the_permit_named(r: redis.Redis, run: Run) -> None:
    first, second = _permits(r, "api", 2)
    before = r.dump("api")

    code, out, err = run("release", "api", "--force", "--yes")

    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1
    assert "is a semaphore with 2 live permits" in err
    assert f"--fence {first.fence}" in err  # an example that works
    assert "--token" in err
    assert f"fence {first.fence}," in err
    assert f"fence {second.fence}," in err
    assert "task job-0" in err
    assert r.dump("api") == before

    code, out, err = run("release", "api", "--force", "--yes", "--fence", "12345")
    assert (code, out) == (1, "")
    assert "no live permit matching --fence 12345" in err
    assert f"fence {second.fence}," in err
    assert r.dump("api") == before

    code, _, err = run("release", "api", "--yes", "--fence", str(first.fence))  # no --force
    assert code == 2
    assert "--force" in err
    assert r.dump("api") == before
    assert first.owned()
    assert second.owned()


class _Terminal(io.StringIO):
    """stdin as a terminal with ``answer`` typed; ``before_answer`` runs as it is read."""

    def __init__(self, answer: str, before_answer: Callable[[], None]) -> None:
        super().__init__(answer)
        self.before_answer = before_answer

    def isatty(self) -> bool:
        return True

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        self.before_answer()
        return super().readline(size)


def test_release_leaves_a_permit_that_changed_meanwhile_alone(
    r: redis.Redis, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = _permits(r, "api", 2, limit=2)
    newcomer = tasklock.Semaphore(r, "api", 2, timeout=60, thread_local=False)
    shown = first.fence

    def permit_changes_hands() -> None:  # while the operator reads the prompt
        first.release()
        assert newcomer.acquire(blocking=False)

    monkeypatch.setattr(sys, "stdin", _Terminal("y\n", permit_changes_hands))
    code, out, err = run("release", "api", "--force", "--fence", str(shown))

    assert code == 1
    assert f"fence {shown}" in out  # what was shown
    assert "changed since it was shown" in err
    assert second.owned()
    assert newcomer.owned()
    assert r.zcard("api") == 2


def test_a_fence_named_for_a_lock_must_be_its_own(r: redis.Redis, run: Run) -> None:
    lock = tasklock.Lock(r, "plain-lock", timeout=30)
    assert lock.acquire()
    assert lock.fence is not None
    code, _, err = run("release", "plain-lock", "--force", "--yes", "--fence", str(lock.fence - 1))
    assert code == 1
    assert "does not name" in err
    assert lock.owned()
    code, out, _ = run("release", "plain-lock", "--force", "--yes", "--fence", str(lock.fence))
    assert code == 0
    assert "Released plain-lock" in out
    assert not lock.owned()
