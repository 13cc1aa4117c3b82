"""`tasklock stats` (and the `exporter` command's arguments) against a real redis-server.

Counts get to Redis the way they do in production: a :class:`tasklock.guard.Guard` runs (the
task layer under every adapter) feed :mod:`tasklock.fleet`, and :func:`tasklock.fleet.flush`
writes them now instead of within the second. Topologies (Redis Cluster, Redlock masters) are
in test_cli_topologies.py.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from typing import Any

import pytest
import redis

from tasklock import fleet
from tasklock.core.keys import wake_channel
from tasklock.errors import DuplicateTask
from tasklock.guard import Guard
from tests.support.cli import Run, cli_runner, without_url_environment
from tests.support.servers import RedisServer, free_port, wait_for


def settle(account_id: int, fence_token: int | None = None) -> str:
    return f"settled {account_id}"


def run_task(guard: Guard, args: tuple[Any, ...], body: Any = None, task_id: str = "t1") -> Any:
    return guard.run(
        args,
        {},
        body or (lambda extra: settle(*args)),
        task_id=task_id,
        on_skip=lambda d: "skipped",
        on_retry=lambda d: "retry",
        duplicate_error=DuplicateTask,
    )


def while_held(guard: Guard, args: tuple[Any, ...], calls: Any) -> None:
    """Run ``calls()`` while another thread's run of ``guard`` holds the lock of ``args``."""
    entered, finish = threading.Event(), threading.Event()

    def body(extra: dict[str, Any]) -> str:
        entered.set()
        assert finish.wait(30)
        return "held"

    thread = threading.Thread(target=run_task, args=(guard, args, body, "holder"))
    thread.start()
    assert entered.wait(10)
    try:
        calls()
    finally:
        finish.set()
        thread.join(10)


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    return cli_runner(capsys)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    without_url_environment(monkeypatch)
    fleet.flush()  # counts other tests left pending go to their servers, not to this one


def busy_fleet(url: str, prefix: str = "tasklock") -> None:
    """Three tasks' worth of decisions: runs, skipped and retried duplicates, enqueue dedupes."""
    options = {"url": url, "key_prefix": prefix}
    skip = Guard(settle, "billing.settle", options)
    retry = Guard(settle, "mail.send", {**options, "on_duplicate": "retry"})
    dedupe = Guard(settle, "reports.build", {**options, "dedupe_enqueue": True})
    for n in range(3):
        run_task(skip, (n,))
    while_held(skip, (1,), lambda: [run_task(skip, (1,)) for _ in range(2)])
    while_held(retry, (1,), lambda: run_task(retry, (1,)))
    assert dedupe.claim_pending((1,), {}, "first") is None
    assert dedupe.claim_pending((1,), {}, "second") == "first"
    fleet.flush()


def test_json_is_keyed_by_task_with_integer_counts(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    busy_fleet(redis_server.url)

    code, out, err = run("stats", "--url", redis_server.url, "--json")

    assert (code, err) == (0, "")
    data = json.loads(out)
    assert set(data) == {"billing.settle", "mail.send", "reports.build"}
    for counts in data.values():
        assert set(fleet.FIELDS) <= set(counts)
        assert all(type(value) is int for value in counts.values())
    assert data["billing.settle"]["ran"] == 4  # three calls and the holder
    assert data["billing.settle"]["duplicates"] == data["billing.settle"]["duplicates_skip"] == 2
    assert data["mail.send"]["duplicates_retry"] == data["mail.send"]["retries"] == 1
    assert data["reports.build"]["enqueue_dedupes"] == 1
    assert data == fleet.read_counts(r)  # the CLI adds nothing and drops nothing


def test_text_is_a_table_sorted_by_task(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    busy_fleet(redis_server.url)
    waits = Guard(settle, "audit.log", {"url": redis_server.url, "on_duplicate": "wait"})
    channel = wake_channel(waits.lock_key((1,), {}))
    waiter = threading.Thread(target=run_task, args=(waits, (1,), None, "waiter"))

    def start_waiting() -> None:  # the holder finishes once the waiter waits for its release
        waiter.start()
        wait_for(lambda: r.pubsub_numsub(channel)[0][1] > 0, "the call waits for the holder")

    while_held(waits, (1,), start_waiting)
    waiter.join(30)
    fleet.flush()

    code, out, err = run("stats", "--url", redis_server.url)

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == (
        f"tasklock counts on {redis_server.url} (window total: totals, kept while a task is "
        "counted at least once a week)"
    )
    header = lines[2]
    for title in ("TASK", "RAN", "DUPLICATES", "WAITED", "RETRIES", "LOST", "BACKEND ERRORS"):
        assert title in header
    assert "ENQUEUE DEDUPES" in header
    rows = {line.split()[0]: line for line in lines[3:]}
    assert list(rows) == ["audit.log", "billing.settle", "mail.send", "reports.build"]
    assert rows["billing.settle"].split()[1:4] == ["4", "2", "(skip"]
    assert "2 (skip 2)" in rows["billing.settle"]
    assert "1 (retry 1)" in rows["mail.send"]
    assert "1 (mean " in rows["audit.log"]  # one call waited, and its mean wait is shown


def test_windows_count_the_slots_they_cover(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    guard = Guard(settle, "billing.settle", {"url": redis_server.url})
    run_task(guard, (1,))
    fleet.flush()
    # What a worker wrote two hours ago: in the last day's slots, not the last hour's.
    slot = int((time.time() - 2 * 3600) // fleet.BUCKET_SECONDS)
    r.hset(fleet.bucket_key("tasklock", "billing.settle", slot), "ran", 5)

    def ran(window: str) -> int:
        code, out, _ = run("stats", "--url", redis_server.url, "--json", "--window", window)
        assert code == 0
        return int(json.loads(out)["billing.settle"]["ran"])

    assert (ran("total"), ran("hour"), ran("day")) == (1, 1, 6)
    code, out, _ = run("stats", "--url", redis_server.url, "--window", "day")
    assert code == 0
    assert "(window day: the last 24 hours)" in out.splitlines()[0]
    code, _, err = run("stats", "--url", redis_server.url, "--window", "week")
    assert code == 2
    assert "invalid choice: 'week'" in err


def test_no_counts_says_when_they_appear(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    code, out, err = run("stats", "--url", redis_server.url)

    assert (code, err) == (0, "")
    first, second = out.strip().splitlines()
    assert first == (
        f"No tasklock counts on {redis_server.url} (window total: totals, kept while a task is "
        "counted at least once a week)."
    )
    assert "within a second of tasks running" in second
    assert "tasks on etcd keep theirs in process" in second
    assert run("stats", "--url", redis_server.url, "--json")[:2] == (0, "{}\n")


def test_prefix_selects_the_tasks_key_prefix(
    r: redis.Redis, redis_server: RedisServer, run: Run
) -> None:
    busy_fleet(redis_server.url, prefix="shop")

    code, out, _ = run("stats", "--url", redis_server.url, "--json")
    assert (code, json.loads(out)) == (0, {})
    code, out, _ = run("stats", "--url", redis_server.url, "--json", "--prefix", "shop")
    assert code == 0
    assert json.loads(out)["billing.settle"]["ran"] == 4
    code, out, _ = run("stats", "--url", redis_server.url, "--prefix", "shop")
    assert code == 0
    assert "prefix 'shop'" in out.splitlines()[0]


def test_url_comes_from_the_environment(
    r: redis.Redis, redis_server: RedisServer, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy_fleet(redis_server.url)
    monkeypatch.setenv("TASKLOCK_URL", redis_server.url)
    code, out, _ = run("stats", "--json")
    assert code == 0
    assert "billing.settle" in json.loads(out)


def test_etcd_url_is_refused_saying_where_counts_live(run: Run) -> None:
    code, out, err = run("stats", "--url", "etcd://127.0.0.1:2379")

    assert (code, out) == (2, "")
    assert err.startswith("tasklock: error: --url='etcd://127.0.0.1:2379' is etcd, and fleet ")
    assert "counts live in Redis" in err
    assert "keep their counts in each process" in err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1


def test_server_that_does_not_answer_is_one_line(run: Run) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    code, out, err = run("stats", "--url", url)
    assert (code, out) == (1, "")
    assert err.startswith("tasklock: error: ")
    assert len(err.splitlines()) == 1


# --- exporter: arguments and the missing extra (serving is tested with tasklock.prometheus) ----


def test_exporter_needs_a_port(run: Run) -> None:
    code, _, err = run("exporter", "--url", "redis://127.0.0.1:6379/0")
    assert code == 2
    assert "the following arguments are required: --port" in err
    code, _, err = run("exporter", "--port", "70000")
    assert code == 2
    assert "must be a port from 1 to 65535, got '70000'" in err
    code, _, err = run("exporter", "--port", "http")
    assert code == 2
    assert "must be a port number, got 'http'" in err


def test_exporter_refuses_etcd(run: Run) -> None:
    code, _, err = run("exporter", "--url", "etcd://127.0.0.1:2379", "--port", "9100")
    assert code == 2
    assert "exporter reads fleet counts and locks from Redis" in err
    code, out, _ = run("exporter", "--help")
    assert code == 0
    assert "etcd" not in out  # its --url help used to offer etcd://h1,h2, then refuse it


def test_exporter_on_a_taken_port_says_so_and_never_that_it_serves(
    run: Run, redis_server: RedisServer
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run("exporter", "--url", redis_server.url, "--port", str(port))
    assert (code, out) == (1, "")
    assert f"cannot serve on 127.0.0.1:{port}" in err
    assert "serving" not in err, err
    assert "starting" not in err, err


def test_exporter_without_prometheus_client_says_what_to_install(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not installed: an import of it fails as it does in an environment without the extra.
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "tasklock.prometheus", raising=False)

    code, out, err = run("exporter", "--url", "redis://127.0.0.1:6379/0", "--port", "9100")

    assert (code, out) == (2, "")
    assert err.strip() == (
        "tasklock: error: `tasklock exporter` needs prometheus_client, which is not installed: "
        "pip install 'tasklock[prometheus]'"
    )
