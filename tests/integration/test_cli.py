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
from tasklock.cli import main
from tasklock.core.keys import wake_channel
from tasklock.core.owner import parse_value
from tests.support.servers import RedisServer, free_port, start_servers

TASK = "billing.settle"
TASK_KEY = f"tasklock:{{{TASK}}}:lock:" + "d" * 64
TASK_FENCE = f"tasklock:{{{TASK}}}:fence"
TASK_PENDING = f"tasklock:{{{TASK}}}:pending:" + "d" * 64
SCRIPT = Path(sys.executable).with_name("tasklock")

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """Call main() in-process; returns (exit status, stdout, stderr)."""

    def call(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return call


@pytest.fixture(autouse=True)
def _no_env_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TASKLOCK_URL", raising=False)
    monkeypatch.delenv("TASKLOCK_URLS", raising=False)


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
    assert task_row[-1] == str(middle.fence) == "42"  # the task counter was at 41
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
    assert [row["fence"] for row in rows] == [second.fence, first.fence] == [43, 42]
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
    r.set(TASK_FENCE, 9)
    lock = _task_lock(r, "job-3")

    code, out, _ = run("show", TASK_KEY, "--url", redis_server.url)

    assert code == 0
    fields = dict(line.split(None, 1) for line in out.splitlines() if "counter" not in line)
    assert fields["value"] == r.get(TASK_KEY).decode()
    assert fields["fence"] == "10"
    assert "job-3" in out
    assert TASK in out
    assert f"{TASK_FENCE} = 10" in out

    code, out, _ = run("show", TASK_KEY, "--url", redis_server.url, "--json")
    data = json.loads(out)
    assert data["fence"] == lock.fence == 10
    assert data["fence_counters"] == [{"key": TASK_FENCE, "kind": "task layer", "value": 10}]
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
    assert waiter.fence == lock.fence + 1
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
    assert second.fence == shown_fence + 1
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
