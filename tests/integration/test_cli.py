"""The `tasklock` command against real redis-server processes: ls, show, release, doctor, errors.

Most tests call ``main([...])`` in-process (fast, and capsys sees the output); a few run the
installed console script as a subprocess, one of them on a real pseudo-terminal for the release
confirmation.
"""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import tasklock
from tasklock.core.keys import wake_channel
from tasklock.core.owner import parse_value
from tests.support.cli import Run, cli_runner, without_url_environment
from tests.support.servers import RedisServer, free_port, start_servers

TASK = "billing.settle"
TASK_KEY = f"tasklock:{{{TASK}}}:lock:" + "d" * 64
TASK_FENCE = f"tasklock:{{{TASK}}}:fence"
TASK_PENDING = f"tasklock:{{{TASK}}}:pending:" + "d" * 64
SCRIPT = Path(sys.executable).with_name("tasklock")


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    return cli_runner(capsys)


@pytest.fixture(autouse=True)
def _no_env_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    without_url_environment(monkeypatch)


def _wait_clock_past(at: float) -> None:
    """Owner metadata stamps ``at`` in milliseconds: make the next acquisition's stamp later."""
    while time.time() < at + 0.002:
        time.sleep(0.001)


def _held(r: redis.Redis, name: str, **kwargs: object) -> tasklock.Lock:
    lock = tasklock.Lock(r, name, **kwargs)  # type: ignore[arg-type]
    assert lock.acquire(blocking=False)
    raw = r.get(name)
    assert raw is not None
    _wait_clock_past(parse_value(raw).meta["at"])
    return lock


def _task_lock(r: redis.Redis, task_id: str = "job-7") -> tasklock.Lock:
    return _held(r, TASK_KEY, fence_key=TASK_FENCE, owner_info={"task": task_id, "name": TASK})


def _foreign_keys(r: redis.Redis) -> None:
    """Keys that are not tasklock locks and must never be listed, shown as locks or released."""
    r.set("plain", "hello")
    r.set("redis-py-lock", "0123456789abcdef0123456789abcdef")  # redis-py Lock: bare token
    r.set("no-meta", "0123456789abcdef0123456789abcdef #3")
    r.set("other-json", '0123456789abcdef0123456789abcdef {"who":"x"}#3')
    r.set(TASK_FENCE, 41)
    r.set(TASK_PENDING, "8c1e5a52-1b2c-4d5e-9f00-123456789abc", px=30_000)
    r.hset("a-hash", "f", "v")


# --- ls -----------------------------------------------------------------------------------------


def test_ls_table_lists_only_locks_newest_first(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    _foreign_keys(r)
    oldest = _held(r, "a-oldest")
    middle = _task_lock(r)
    newest = _held(r, "z-newest")

    code, out, err = run("ls", "--url", redis_server.url)

    assert (code, err) == (0, "")
    lines = out.strip().splitlines()
    assert lines[0].split() == ["KEY", "HOST", "PID", "TASK", "AGE", "TTL", "FENCE"]
    keys = [line.split()[0] for line in lines[1:]]
    assert keys == ["z-newest", TASK_KEY, "a-oldest"]  # by acquisition time, not by name
    task_row = lines[2].split()
    assert task_row[2] == str(os.getpid())
    assert task_row[3] == f"{TASK}[job-7]"
    assert task_row[-1] == str(middle.fence)
    assert lines[1].split()[3] == "-"  # a core lock has no task
    for lock in (oldest, middle, newest):
        lock.release()


def test_ls_json_and_match(r: redis.Redis, redis_server: RedisServer, run: Run) -> None:
    _foreign_keys(r)
    core = _held(r, "tasklock-core-lock")
    first = _task_lock(r, "job-1")
    other_key = f"tasklock:{{{TASK}}}:lock:" + "e" * 64
    second = _held(r, other_key, fence_key=TASK_FENCE, owner_info={"task": "job-2", "name": TASK})

    code, out, _ = run("ls", "--url", redis_server.url, "--match", "tasklock:{*}:lock:*", "--json")

    assert code == 0
    rows = json.loads(out)
    assert [row["key"] for row in rows] == [other_key, TASK_KEY]
    assert [row["task"] for row in rows] == ["job-2", "job-1"]
    assert [row["fence"] for row in rows] == [second.fence, first.fence]
    assert second.fence is not None
    assert first.fence is not None
    assert second.fence > first.fence
    for row in rows:
        assert row["task_name"] == TASK
        assert row["pid"] == os.getpid()
        assert 0 < row["ttl_ms"] <= 30_000
        assert row["value"] == r.get(row["key"]).decode()

    code, out, _ = run("ls", "--url", redis_server.url, "--json")
    assert [row["key"] for row in json.loads(out)] == [other_key, TASK_KEY, "tasklock-core-lock"]
    for lock in (core, first, second):
        lock.release()


def test_ls_empty(r: redis.Redis, redis_server: RedisServer, run: Run) -> None:
    _foreign_keys(r)
    code, out, _ = run("ls", "--url", redis_server.url)
    assert code == 0
    assert "No tasklock locks held" in out
    assert run("ls", "--url", redis_server.url, "--json")[1].strip() == "[]"


def test_ls_uses_tasklock_url_env(
    r: redis.Redis, redis_server: RedisServer, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = _held(r, "from-env")
    monkeypatch.setenv("TASKLOCK_URL", redis_server.url)
    code, out, _ = run("ls", "--json")
    assert code == 0
    assert [row["key"] for row in json.loads(out)] == ["from-env"]
    lock.release()


# --- show ---------------------------------------------------------------------------------------


def test_show_task_lock(r: redis.Redis, redis_server: RedisServer, run: Run) -> None:
    r.set(TASK_FENCE, 9 * 10**15)  # above the clock: the next fence is the counter's next
    lock = _task_lock(r, "job-3")

    code, out, _ = run("show", TASK_KEY, "--url", redis_server.url)

    assert code == 0
    fields = dict(line.split(None, 1) for line in out.splitlines() if "counter" not in line)
    assert fields["value"] == r.get(TASK_KEY).decode()
    assert fields["fence"] == "9000000000000001"
    assert "job-3" in out
    assert TASK in out
    assert f"{TASK_FENCE} = 9000000000000001" in out

    code, out, _ = run("show", TASK_KEY, "--url", redis_server.url, "--json")
    data = json.loads(out)
    assert data["fence"] == lock.fence == 9 * 10**15 + 1
    counter = {"key": TASK_FENCE, "kind": "task layer", "value": 9 * 10**15 + 1}
    assert data["fence_counters"] == [counter]
    assert data["meta"]["task"] == "job-3"
    lock.release()


def test_show_core_lock_and_counter_behind(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    lock = _held(r, "report")
    code, out, _ = run("show", "report", "--url", redis_server.url)
    assert code == 0
    assert "{report}:fence = 1" in out
    assert "BEHIND" not in out

    r.set("{report}:fence", 0)  # as after a restart without persistence
    code, out, _ = run("show", "report", "--url", redis_server.url)
    assert code == 0
    assert "BEHIND" in out
    lock.release()


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("missing", "not held"),
        ("plain", "does not hold a tasklock lock"),
        ("redis-py-lock", "does not hold a tasklock lock"),
        (TASK_FENCE, "does not hold a tasklock lock"),
        (TASK_PENDING, "does not hold a tasklock lock"),
        ("a-hash", "is a Redis hash"),
    ],
)
def test_show_non_locks_fail(
    r: redis.Redis, redis_server: RedisServer, run: Run, key: str, expected: str
) -> None:
    _foreign_keys(r)
    code, out, err = run("show", key, "--url", redis_server.url)
    assert code == 1
    assert out == ""
    assert expected in err
    assert len(err.strip().splitlines()) == 1


# --- keys of any bytes, values of any content ---------------------------------------------------

#: A lock value as tasklock writes it, with metadata of the test's choosing.
TOKEN = "0123456789abcdef0123456789abcdef"


def _lock_value(meta: str, fence: int = 7) -> bytes:
    return f"{TOKEN} {meta}#{fence}".encode()


#: Keys that are not plain text, each holding a tasklock lock: bytes that are not UTF-8, control
#: characters, spaces (inside and at the ends), backslashes, non-ASCII text, invisible characters.
ODD_KEYS = [
    b"bin-\xff-key",
    b"\xc3\x28 truncated",
    b"line\nbreak",
    b"cr\rlf\ttab",
    b"two words",
    b" padded ",
    b"back\\slash\\n",
    "ключ-42".encode(),
    b"nul\x00byte",
    b"esc\x1b[31mred",
    "nbsp\u00a0nel\u0085sep\u2028".encode(),
]


@pytest.fixture
def odd_locks(r: redis.Redis) -> list[bytes]:
    for i, key in enumerate(ODD_KEYS):
        meta = f'{{"host":"h{i}","pid":{100 + i},"at":{1_700_000_000 + i},"task":"t{i}"}}'
        r.set(key, _lock_value(meta, fence=i), px=60_000)
    return ODD_KEYS


def test_every_key_ls_prints_is_accepted_back_by_show_and_release(
    r: redis.Redis, redis_server: RedisServer, run: Run, odd_locks: list[bytes]
) -> None:
    code, out, err = run("ls", "--url", redis_server.url, "--json")
    assert (code, err) == (0, "")
    printed = [row["key"] for row in json.loads(out)]
    assert len(printed) == len(odd_locks)

    code, table, err = run("ls", "--url", redis_server.url)
    assert (code, err) == (0, "")
    rows = table.splitlines()
    assert len(rows) == 1 + len(odd_locks)  # no key breaks a row
    for key, row in zip(printed, rows[1:], strict=True):
        assert row.startswith(key + " ")  # the table prints what --json prints
        assert key.isprintable()
        assert not key.startswith(" ")

    for key in printed:
        code, out, err = run("show", key, "--url", redis_server.url)
        assert (code, err) == (0, ""), key
        assert f"key   {key}" in out.splitlines()[0] or out.splitlines()[0].endswith(key)

    for key in printed:
        code, out, err = run("release", key, "--force", "--yes", "--url", redis_server.url)
        assert (code, err) == (0, ""), key
    assert r.keys("*") == []  # every one found and released, none missed


def test_a_key_given_as_raw_bytes_is_found(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    r.set(b"bin-\xff-key", _lock_value('{"host":"h","pid":1,"at":1700000000}'), px=60_000)
    # What Python makes of the byte 0xff in argv (surrogateescape), as from $'bin-\xff-key'.
    code, out, err = run("show", "bin-\udcff-key", "--url", redis_server.url)
    assert (code, err) == (0, "")
    assert "bin-\\xff-key" in out
    code, out, err = run("release", "bin-\udcff-key", "--force", "--yes", "--url", redis_server.url)
    assert (code, err) == (0, "")
    assert "Released bin-\\xff-key" in out
    assert r.keys("*") == []


def test_a_bad_escape_is_a_usage_error_that_explains_the_form(
    redis_server: RedisServer, run: Run
) -> None:
    for key in ("C:\\temp\\q", "trailing\\", "\\xZZ", "\\ud800"):
        code, out, err = run("show", key, "--url", redis_server.url)
        assert (code, out) == (2, ""), key
        assert "as `tasklock ls` prints" in err
        assert "Traceback" not in err


def test_a_literal_key_with_a_backslash_not_found_gets_a_hint(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    r.set(b"C:\\temp", _lock_value('{"host":"h","pid":1}'), px=60_000)
    code, _, err = run("show", "C:\\temp", "--url", redis_server.url)  # \t read as a tab
    assert code == 1
    assert "not held" in err
    assert "\\\\" in err  # the hint: a backslash is written \\
    assert run("show", "C:\\\\temp", "--url", redis_server.url)[0] == 0


@pytest.mark.parametrize(
    "at",
    ["1e300", "-1e300", "1e20", "-5", "NaN", "Infinity", "-Infinity", '"today"', "null", "true"],
)
def test_any_acquisition_time_is_shown_or_left_unknown(
    r: redis.Redis, redis_server: RedisServer, run: Run, at: str
) -> None:
    r.set("odd-at", _lock_value(f'{{"host":"h","pid":1,"at":{at}}}'), px=60_000)
    r.set("fine", _lock_value('{"host":"h","pid":1,"at":1700000000.5}'), px=60_000)
    for argv in (("ls",), ("ls", "--json"), ("show", "odd-at"), ("show", "odd-at", "--json")):
        code, out, err = run(*argv, "--url", redis_server.url)
        assert (code, err) == (0, ""), argv
    code, out, _ = run("show", "odd-at", "--url", redis_server.url)
    [acquired] = [line for line in out.splitlines() if line.startswith("acquired")]
    assert "unknown" in acquired  # not a crash, nor a date in the year 3e292
    code, out, _ = run("ls", "--url", redis_server.url)
    assert out.splitlines()[1].startswith("fine ")  # a known time sorts first
    assert out.splitlines()[2].split()[4] == "-"  # AGE unknown


def test_odd_metadata_and_fence_counters_never_break_the_output(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    meta = '{"host":"web\\n1\\u0000","pid":1,"task":"t\\r0","name":"x\\udcff","extra":"a\\u2028b"}'
    r.set("tasklock:{app.x}:lock:1", _lock_value(meta), px=60_000)
    r.set("tasklock:{app.x}:fence", b"\xff\xfe")  # not a number, not even UTF-8
    r.set("{tasklock:{app.x}:lock:1}:fence", "\u00b2")  # "²".isdigit(), but not a number
    for argv in (("ls",), ("show", "tasklock:{app.x}:lock:1")):
        code, out, err = run(*argv, "--url", redis_server.url)
        assert (code, err) == (0, ""), argv
        for line in out.splitlines():
            assert line.isprintable(), line
    code, out, _ = run("ls", "--url", redis_server.url)
    assert len(out.splitlines()) == 2
    code, out, _ = run("show", "tasklock:{app.x}:lock:1", "--url", redis_server.url, "--json")
    # Neither counter reads as a number, so show names the likeliest one as not set.
    [counter] = json.loads(out)["fence_counters"]
    assert (counter["key"], counter["value"]) == ("tasklock:{app.x}:fence", None)


def test_a_url_that_decodes_replies_is_read_as_bytes_all_the_same(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    """An application's URL may well ask for decoded replies; the commands read keys as bytes
    (a key need not be UTF-8) whatever it says. It used to end in a TypeError traceback (a
    str key against a bytes suffix), or with a key that is not UTF-8, in an error."""
    r.set(b"bin-\xff-key", _lock_value('{"host":"h","pid":1}'), px=60_000)
    r.set(b"plain-key", _lock_value('{"host":"h","pid":2}'), px=60_000)
    code, out, err = run(
        "ls", "--url", f"{redis_server.url}?decode_responses=true&socket_timeout=5"
    )
    assert (code, err) == (0, "")
    assert "plain-key" in out
    assert "bin-" in out
    # "=false" is on to redis-py (any text is true): refused as the URL is read.
    code, out, err = run("ls", "--url", f"{redis_server.url}?decode_responses=false")
    assert (code, out) == (2, "")
    assert "which redis-py takes as on" in err


def test_the_holder_line_names_the_task_without_a_stray_comma(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    _task_lock(r, "t0")
    code, out, _ = run("release", TASK_KEY, "--force", "--yes", "--url", redis_server.url)
    assert code == 0
    assert f"task t0 ({TASK}), fence " in out
    assert "t0, (" not in out


# --- release ------------------------------------------------------------------------------------


class FakeTerminal(io.StringIO):
    """stdin as a terminal with the given answer typed; ``before_answer`` runs as it is read."""

    def __init__(self, answer: str, before_answer: Callable[[], None] | None = None) -> None:
        super().__init__(answer)
        self.before_answer = before_answer

    def isatty(self) -> bool:
        return True

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        if self.before_answer is not None:
            self.before_answer()
        return super().readline(size)


def test_release_refuses_without_force(r: redis.Redis, redis_server: RedisServer, run: Run) -> None:
    lock = _held(r, "stuck")
    code, _, err = run("release", "stuck", "--url", redis_server.url, "--yes")
    assert code == 2
    assert "--force" in err
    assert "mutual exclusion" in err
    assert "TTL" in err
    assert lock.owned()
    lock.release()


@pytest.mark.parametrize(
    "stdin",
    [
        io.StringIO("y\n"),  # piped input is not a person confirming
        FakeTerminal(""),  # end of input
        FakeTerminal("n\n"),
        FakeTerminal("\n"),
    ],
    ids=["not-a-tty", "eof", "no", "empty"],
)
def test_release_without_confirmation_keeps_the_lock(
    r: redis.Redis,
    redis_server: RedisServer,
    run: Run,
    monkeypatch: pytest.MonkeyPatch,
    stdin: io.StringIO,
) -> None:
    lock = _held(r, "stuck", owner_info={"task": "t-9"})
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, _ = run("release", "stuck", "--force", "--url", redis_server.url)
    assert code == 1
    assert "t-9" in out  # the holder was shown
    assert "Not released" in out
    assert lock.owned()
    lock.release()


def test_release_confirmed_deletes_and_wakes_waiters(
    r: redis.Redis, redis_server: RedisServer, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = _held(r, "stuck")
    pubsub = r.pubsub()
    pubsub.subscribe(wake_channel("stuck"))
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    monkeypatch.setattr(sys, "stdin", FakeTerminal("yes\n"))

    code, out, err = run("release", "stuck", "--force", "--url", redis_server.url)

    assert (code, err.count("[y/N]")) == (0, 1)
    assert "Released stuck" in out
    assert not r.exists("stuck")
    message = pubsub.get_message(timeout=5)
    assert message is not None
    assert (message["type"], message["data"]) == ("message", b"stuck")
    pubsub.close()
    with pytest.raises(tasklock.LockNotOwnedError):
        lock.release()


def test_release_yes_does_not_ask(r: redis.Redis, redis_server: RedisServer, run: Run) -> None:
    lock = _task_lock(r)
    code, _, err = run("release", TASK_KEY, "--force", "--yes", "--url", redis_server.url)
    assert (code, err) == (0, "")
    assert not r.exists(TASK_KEY)
    assert r.get(TASK_FENCE) == str(lock.fence).encode()  # the counter is kept
    waiter = tasklock.Lock(r, TASK_KEY, fence_key=TASK_FENCE)
    assert waiter.acquire(blocking=False)
    assert waiter.fence is not None
    assert lock.fence is not None
    assert waiter.fence > lock.fence
    waiter.release()


def test_release_refuses_a_value_that_changed_meanwhile(
    r: redis.Redis, redis_server: RedisServer, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _held(r, "stuck")
    shown_fence = first.fence
    second = tasklock.Lock(r, "stuck")

    def holder_changes() -> None:  # while the operator reads the prompt
        first.release()
        assert second.acquire(blocking=False)

    monkeypatch.setattr(sys, "stdin", FakeTerminal("y\n", holder_changes))
    code, out, err = run("release", "stuck", "--force", "--url", redis_server.url)

    assert code == 1
    assert f"fence {shown_fence}," in out  # what was shown
    assert "changed since it was shown" in err
    assert second.fence is not None
    assert second.fence > shown_fence
    assert f"fence {second.fence}," in err  # who holds it now
    assert second.owned()
    second.release()


@pytest.mark.parametrize("key", ["missing", "plain", "redis-py-lock", TASK_FENCE, "a-hash"])
def test_release_leaves_non_locks_alone(
    r: redis.Redis, redis_server: RedisServer, run: Run, key: str
) -> None:
    _foreign_keys(r)
    before = {k: r.dump(k) for k in r.scan_iter()}
    code, _, err = run("release", key, "--force", "--yes", "--url", redis_server.url)
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert {k: r.dump(k) for k in r.scan_iter()} == before


# --- doctor -------------------------------------------------------------------------------------


def _doctor(run: Run, *argv: str) -> tuple[int, Any, dict[tuple[str | None, str], str]]:
    code, out, _ = run("doctor", "--json", *argv)
    report = json.loads(out)
    verdicts = {(c["node"], c["name"]): c["status"] for c in report["checks"]}
    return code, report, verdicts


@pytest.fixture
def reset_memory_config(r: redis.Redis) -> Iterator[redis.Redis]:
    yield r
    r.config_set("maxmemory", 0)
    r.config_set("maxmemory-policy", "noeviction")


def test_doctor_single_default_server_warns_on_persistence(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    code, out, err = run("doctor", "--url", redis_server.url)
    assert (code, err) == (0, "")
    assert "WARN  persistence" in out
    assert "fix: CONFIG SET appendonly yes" in out
    assert "ok    eviction" in out

    code, report, verdicts = _doctor(run, "--url", redis_server.url)
    url = redis_server.url
    assert code == 0
    assert report["ok"] is True
    assert verdicts[(url, "persistence")] == "warn"
    for name in ("reachable", "version", "replication", "eviction", "latency", "clock"):
        assert verdicts[(url, name)] == "ok", name

    code, report, _ = _doctor(run, "--url", redis_server.url, "--strict")
    assert code == 1
    assert report["ok"] is False


def test_doctor_persistence_on_is_ok(run: Run) -> None:
    with start_servers(1, appendonly=True) as (server,):
        code, _, verdicts = _doctor(run, "--url", server.url, "--strict")
    assert verdicts[(server.url, "persistence")] == "ok"
    assert code == 0


@pytest.mark.parametrize(
    ("policy", "maxmemory", "verdict", "code"),
    [
        ("allkeys-lru", "100mb", "fail", 1),
        ("volatile-ttl", "100mb", "fail", 1),
        ("volatile-lru", "0", "warn", 0),
        ("noeviction", "100mb", "ok", 0),
    ],
)
def test_doctor_eviction_policy(
    reset_memory_config: redis.Redis,
    redis_server: RedisServer,
    run: Run,
    policy: str,
    maxmemory: str,
    verdict: str,
    code: int,
) -> None:
    reset_memory_config.config_set("maxmemory", maxmemory)
    reset_memory_config.config_set("maxmemory-policy", policy)
    got_code, report, verdicts = _doctor(run, "--url", redis_server.url)
    assert verdicts[(redis_server.url, "eviction")] == verdict
    assert got_code == code
    (check,) = [c for c in report["checks"] if c["name"] == "eviction"]
    assert policy in check["message"]
    if verdict != "ok":
        assert "noeviction" in check["fix"]


def test_doctor_redlock_nodes_replicas_and_quorum(run: Run) -> None:
    with start_servers(4) as servers:
        master, replica, *others = servers
        replica.client().replicaof("127.0.0.1", master.port)
        master_client = master.client()
        deadline = time.monotonic() + 10
        while master_client.info("replication")["connected_slaves"] < 1:
            assert time.monotonic() < deadline, "replica did not attach"
            time.sleep(0.02)  # polling the server's replication state; no event to wait on

        urls = [master.url, *(s.url for s in others)]
        code, _, verdicts = _doctor(run, "--urls", *urls)
        assert verdicts[(master.url, "replication")] == "warn"
        assert verdicts[(others[0].url, "replication")] == "ok"
        assert verdicts[(None, "distinct nodes")] == "ok"
        assert verdicts[(None, "quorum")] == "ok"
        assert verdicts[(None, "clock")] == "ok"  # one host, one clock
        assert code == 0  # warnings only

        code, _, verdicts = _doctor(run, "--url", replica.url)
        assert verdicts[(replica.url, "replication")] == "fail"
        assert code == 1

        code, _, verdicts = _doctor(run, "--urls", *urls, replica.url)
        assert verdicts[(None, "quorum")] == "warn"  # 4 nodes tolerate no more than 3
        assert code == 1  # the replica fails


def test_doctor_same_server_twice_fails(redis_server: RedisServer, run: Run) -> None:
    other_db = redis_server.url.replace("/0", "/1")
    with start_servers(1) as (second,):
        code, report, verdicts = _doctor(run, "--urls", redis_server.url, second.url, other_db)
    assert verdicts[(None, "distinct nodes")] == "fail"
    assert code == 1
    (check,) = [c for c in report["checks"] if c["name"] == "distinct nodes"]
    assert redis_server.url in check["message"]
    assert other_db in check["message"]


def test_doctor_unreachable_node_and_env_urls(
    redis_server: RedisServer, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with start_servers(1) as (second,):
        monkeypatch.setenv("TASKLOCK_URLS", f"{redis_server.url}, {second.url},{dead}")
        code, out, _ = run("doctor")
    assert code == 1
    assert f"Redis at {dead} did not answer" in out
    assert "FAIL  reachable" in out
    assert "across nodes" in out
    assert "3 Redlock masters" in out


# --- errors and usage ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "a command is required"),
        (["ls", "--bogus"], "--bogus"),
        (["release"], "KEY"),
        (["ls", "--url", "http://localhost"], "--url='http://localhost'"),
        (["ls", "--url", "redis://localhost:notaport/0"], "--url"),
        (["doctor", "--url", "redis://a", "--urls", "redis://b"], "not allowed with"),
        (["doctor", "--urls", "redis://a", "mysql://b"], "--urls='mysql://b'"),
        (["doctor", "--ttl", "0"], "--ttl"),
        (["ls", "--match", ""], "--match"),
        (["demo", "--url", "nope"], "--url='nope'"),
    ],
)
def test_usage_errors_exit_2(run: Run, argv: list[str], needle: str) -> None:
    code, out, err = run(*argv)
    assert code == 2
    assert out == ""
    assert needle in err
    assert "Traceback" not in err


def test_bad_env_url_is_named(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKLOCK_URL", "localhost:6379")
    code, _, err = run("ls")
    assert code == 2
    assert "TASKLOCK_URL='localhost:6379'" in err
    monkeypatch.setenv("TASKLOCK_URLS", "redis://a:1/0,redis://b:notaport/0")
    code, _, err = run("doctor")
    assert code == 2
    assert "TASKLOCK_URLS='redis://b:notaport/0'" in err


@pytest.mark.parametrize(
    "argv",
    [["ls"], ["show", "k"], ["release", "k", "--force", "--yes"]],
    ids=["ls", "show", "release"],
)
def test_unreachable_server_exits_1_naming_the_url(run: Run, argv: list[str]) -> None:
    port = free_port()
    code, out, err = run(*argv, "--url", f"redis://127.0.0.1:{port}/0")
    assert code == 1
    assert out == ""
    assert err.startswith("tasklock: error: Redis at ")
    assert f"127.0.0.1:{port}" in err
    assert len(err.strip().splitlines()) == 1


def test_demo_hook(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []
    fake = types.ModuleType("tasklock.demo")
    fake.main = lambda args: seen.append(args.url) or 0
    monkeypatch.setitem(sys.modules, "tasklock.demo", fake)
    assert run("demo", "--url", "redis://127.0.0.1:1/0")[0] == 0
    assert run("demo")[0] == 0
    assert seen == ["redis://127.0.0.1:1/0", None]

    monkeypatch.setitem(sys.modules, "tasklock.demo", None)  # the module is missing
    code, _, err = run("demo")
    assert code == 1
    assert "tasklock.demo is missing" in err


# --- the installed console script ---------------------------------------------------------------


def test_console_script_ls_json_and_unreachable(r: redis.Redis, redis_server: RedisServer) -> None:
    lock = _task_lock(r)
    done = subprocess.run(
        [str(SCRIPT), "ls", "--url", redis_server.url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert [row["key"] for row in json.loads(done.stdout)] == [TASK_KEY]
    lock.release()

    dead = f"redis://127.0.0.1:{free_port()}/0"
    done = subprocess.run(
        [str(SCRIPT), "show", "k", "--url", dead], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert dead in done.stderr
    assert "Traceback" not in done.stderr


def test_console_script_takes_a_key_as_the_raw_bytes_typed(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    r.set(b"bin-\xff-key", _lock_value('{"host":"h","pid":1}'), px=60_000)
    # As bash passes $'bin-\xff-key': the byte itself, not UTF-8 and not an escape.
    for key in (b"bin-\xff-key", b"bin-\\xff-key"):
        done = subprocess.run(
            [SCRIPT, b"show", key, b"--url", redis_server.url.encode()],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert b"Traceback" not in done.stderr
        assert done.stdout.startswith(b"key ")
        assert b"bin-\\xff-key" in done.stdout.splitlines()[0]


def test_console_script_escapes_what_the_terminal_cannot_print(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    r.set("ключ-42", _lock_value('{"host":"хост","pid":1}'), px=60_000)
    latin1 = {**os.environ, "PYTHONIOENCODING": "latin-1"}  # a terminal without Cyrillic

    def script(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), *argv, "--url", redis_server.url],
            capture_output=True,
            text=True,
            encoding="latin-1",
            env=latin1,
            timeout=60,
            check=False,
        )

    listed = script("ls")
    assert listed.returncode == 0, listed.stderr
    key = listed.stdout.splitlines()[1].split()[0]
    assert key == "\\u043a\\u043b\\u044e\\u0447-42"
    shown = script("show", key)  # the escaped form names the same key
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stderr
    assert "\\u0445\\u043e\\u0441\\u0442" in shown.stdout


def test_console_script_release_confirmed_on_a_terminal(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    lock = _held(r, "stuck", owner_info={"task": "t-1"})
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [str(SCRIPT), "release", "stuck", "--force", "--url", redis_server.url],
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(terminal)
        os.write(controller, b"y\n")  # typed ahead; the terminal keeps it until read
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(controller)
    assert proc.returncode == 0, err
    assert "[y/N]" in err
    assert "t-1" in out
    assert not r.exists("stuck")
    assert not lock.owned()
