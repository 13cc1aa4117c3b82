"""Several processes on one real redis-server: mutual exclusion from a recorded history, fence
tokens across processes, fork behaviour, and the process-pause case (SIGSTOP past the TTL).

Contenders are ``spawn`` processes (each its own interpreter, like separate worker machines);
they record every hold in a shared history and write through a fenced register. Synchronisation
is by files and polls with deadlines, never by sleeping a guessed amount.
"""

from __future__ import annotations

import json
import os
import signal
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import redis

import tasklock
from tasklock.core.watchdog import get_watchdog
from tests.support.forking import ForkedChild
from tests.support.history import (
    FencedRegister,
    HistoryLog,
    Hold,
    assert_fences_increase,
    assert_no_overlap,
    run_processes,
)
from tests.support.polling import eventually
from tests.support.servers import RedisServer


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _contend(port: int, name: str, rounds: int, history: str, register: str, index: int) -> None:
    client = _client(port)
    log = HistoryLog(history)
    cell = FencedRegister(register)
    # Half the contenders use the default (watchdog-renewed) TTL, half an explicit one.
    lock = tasklock.Lock(client, name, timeout=None if index % 2 else 10)
    for round_ in range(rounds):
        assert lock.acquire(blocking_timeout=60), "no hold within 60 s"
        start = time.monotonic_ns()
        fence = lock.fence
        assert fence is not None
        assert cell.write(name, fence, f"{os.getpid()}:{round_}"), "a current holder was rejected"
        end = time.monotonic_ns()
        lock.release()
        log.record(Hold(name, fence, start, end, os.getpid()))


def test_processes_exclude_each_other(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    processes, rounds = 5, 20
    history, register = tmp_path / "history.jsonl", tmp_path / "register.db"
    FencedRegister(register)
    run_processes(
        _contend,
        [
            (redis_server.port, "shared", rounds, str(history), str(register), i)
            for i in range(processes)
        ],
        timeout=90,
    )
    holds = HistoryLog(history).holds()
    assert len(holds) == processes * rounds
    assert len({h.pid for h in holds}) == processes
    assert_no_overlap(holds)
    assert_fences_increase(holds)
    fences = sorted(h.fence for h in holds if h.fence is not None)
    assert len(set(fences)) == len(fences) == processes * rounds, (
        "one fence per hold, none repeated"
    )
    cell = FencedRegister(register)
    cell.assert_consistent()
    assert all(w["accepted"] for w in cell.writes())
    assert not r.exists("shared")


def _pause_victim(port: int, name: str, directory: str) -> None:
    base = Path(directory)
    lock = tasklock.Lock(_client(port), name, timeout=1.0, watchdog=True)
    assert lock.acquire(blocking_timeout=10)
    _write_json(base / "held.json", {"fence": lock.fence, "pid": os.getpid()})
    # The test SIGSTOPs this process somewhere in here, past its TTL, then says "go".
    while not (base / "go").exists():
        time.sleep(0.01)
    accepted = FencedRegister(base / "register.db").write(name, lock.fence or 0, "paused holder")
    lost = lock.lost.wait(10)
    try:
        lock.release()
        released = "released"
    except tasklock.LockLostError:
        released = "LockLostError"
    except tasklock.LockError as exc:
        released = type(exc).__name__
    _write_json(
        base / "result.json",
        {"accepted": accepted, "lost": lost, "reason": lock.lost.reason, "release": released},
    )


def test_paused_holder_is_fenced_off(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    register = FencedRegister(tmp_path / "register.db")
    victim = get_context("spawn").Process(
        target=_pause_victim, args=(redis_server.port, "paused", str(tmp_path))
    )
    victim.start()
    try:
        held = tmp_path / "held.json"
        eventually(held.exists, timeout=30, what="the victim holds the lock")
        first = json.loads(held.read_text())
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGSTOP)
        # Its watchdog is frozen with it: the TTL runs out.
        eventually(lambda: not r.exists("paused"), timeout=10, what="the paused hold expired")
        successor = tasklock.Lock(r, "paused", timeout=30)
        assert successor.acquire(blocking=False)
        assert successor.fence is not None
        assert successor.fence > first["fence"]
        assert register.write("paused", successor.fence, "successor")
        os.kill(victim.pid, signal.SIGCONT)
        (tmp_path / "go").touch()
        victim.join(30)
        assert victim.exitcode == 0
    finally:
        if victim.is_alive():
            assert victim.pid is not None
            os.kill(victim.pid, signal.SIGCONT)
            victim.kill()
            victim.join(5)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["accepted"] is False, "the stale holder's write must be rejected"
    # Its clock says so first; then its watchdog's renewal or its release finds the key gone,
    # whichever reaches the server first, and the hold stays lost after the release either way.
    assert result["lost"] is True, "it must know it lost once it runs again"
    assert "gone or held by another owner" in result["reason"]
    assert result["release"] == "LockLostError"
    assert successor.owned(), "the stale holder did not disturb the successor"
    successor.release()
    register.assert_consistent()
    writes = [(w["payload"], w["accepted"]) for w in register.writes()]
    assert writes == [("successor", 1), ("paused holder", 0)]


def test_forked_child_has_no_hold_and_its_own_watchdog(r: redis.Redis) -> None:
    parent_lock = tasklock.Lock(r, "forked", timeout=0.5, watchdog=True)
    assert parent_lock.acquire()

    def in_child(report: dict[str, Any]) -> None:
        report["owned"] = parent_lock.owned()
        report["fence"] = parent_lock.fence
        report["inherited"] = get_watchdog().held()
        try:
            parent_lock.release()
            report["release"] = "released"
        except tasklock.LockError as exc:
            report["release"] = str(exc)
        own = tasklock.Lock(r, "child-own", timeout=0.5, watchdog=True)
        report["own"] = own.acquire(blocking=False)
        deadline = time.monotonic() + 2.5  # five of its TTLs
        report["own_kept"] = True
        while time.monotonic() < deadline:
            if r.pttl("child-own") <= 0 or not own.owned():
                report["own_kept"] = False
                break
            time.sleep(0.02)
        report["own_renewals"] = own.local.hold.renewal.renewals
        own.release()

    child = ForkedChild(in_child)
    try:
        eventually(lambda: r.exists("child-own"), what="the child took its own lock")
        # The parent stops renewing (as if it died). Only a child renewing the parent's
        # inherited hold could keep the key alive now.
        get_watchdog().unwatch(parent_lock.local.hold.renewal)
        eventually(lambda: not r.exists("forked"), timeout=5, what="the parent's hold expired")
        assert child.running(), "the child was still running meanwhile"
        assert r.exists("child-own"), "and still holding (and renewing) its own lock"
    finally:
        report = child.collect()
    assert report["owned"] is False
    assert report["fence"] is None
    assert report["inherited"] == 0
    assert f"acquired in process {os.getpid()}" in report["release"]
    assert "forked child" in report["release"]
    assert report["own"] is True
    assert report["own_kept"] is True
    assert report["own_renewals"] >= 4
