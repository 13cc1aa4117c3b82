"""Recorded histories of critical sections, a fenced register, and the checker over them.

Every contender logs each hold as (name, fence, start, end, pid) into a shared append-only file
(one small ``O_APPEND`` write per line, so lines from different processes never interleave), and
writes through a :class:`FencedRegister` that accepts only a fence above the highest it has seen.
The checker then asserts, from the history alone, that no two holds of one name overlapped and
that the register rejected every stale write.

Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC is one clock for all processes on a Linux host.
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

__all__ = [
    "FencedRegister",
    "HistoryLog",
    "Hold",
    "assert_at_most",
    "assert_fences_increase",
    "assert_later_holds_fenced_higher",
    "assert_no_overlap",
    "run_processes",
]


@dataclass(frozen=True)
class Hold:
    name: str
    fence: int | None
    start: int  # when the body began: after acquire() returned
    end: int  # when the body ended: before release() was called
    pid: int
    requested: int | None = None  # when acquire() was called (the hold began after this)


class HistoryLog:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.touch()

    def record(self, hold: Hold) -> None:
        line = (json.dumps(asdict(hold)) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def holds(self) -> list[Hold]:
        return [Hold(**json.loads(line)) for line in self.path.read_text().splitlines() if line]


def assert_no_overlap(holds: Iterable[Hold]) -> None:
    by_name: dict[str, list[Hold]] = defaultdict(list)
    for hold in holds:
        by_name[hold.name].append(hold)
    for name, items in by_name.items():
        items.sort(key=lambda h: h.start)
        for earlier, later in itertools.pairwise(items):
            assert later.start >= earlier.end, (
                f"holds of {name!r} overlap: pid {earlier.pid} fence {earlier.fence} "
                f"[{earlier.start}, {earlier.end}] and pid {later.pid} fence {later.fence} "
                f"[{later.start}, {later.end}]"
            )


def assert_at_most(holds: Iterable[Hold], limit: int) -> int:
    """Per name, never more than ``limit`` holds at once; returns the most seen at once (so a
    test can also check that the limit was reached, i.e. that it really tested concurrency).

    A hold that ended at the instant another began does not overlap it."""
    by_name: dict[str, list[Hold]] = defaultdict(list)
    for hold in holds:
        by_name[hold.name].append(hold)
    peak = 0
    for name, items in by_name.items():
        # Ends sort before starts at the same instant.
        events = sorted(
            [(h.start, 1, h) for h in items] + [(h.end, -1, h) for h in items],
            key=lambda e: (e[0], e[1]),
        )
        inside: set[int] = set()
        for _, step, hold in events:
            if step < 0:
                inside.discard(id(hold))
                continue
            inside.add(id(hold))
            if len(inside) > limit:
                open_now = [h for h in items if id(h) in inside]
                raise AssertionError(
                    f"{len(inside)} holds of {name!r} at once (limit {limit}): "
                    + ", ".join(
                        f"pid {h.pid} fence {h.fence} [{h.start}, {h.end}]" for h in open_now
                    )
                )
            peak = max(peak, len(inside))
    return peak


def assert_fences_increase(holds: Iterable[Hold]) -> None:
    """Per name, in the order the holds began, every fence is strictly above the previous one."""
    by_name: dict[str, list[Hold]] = defaultdict(list)
    for hold in holds:
        by_name[hold.name].append(hold)
    for name, items in by_name.items():
        items.sort(key=lambda h: h.start)
        fences = [h.fence for h in items]
        assert all(f is not None for f in fences), f"a hold of {name!r} had no fence"
        for a, b in itertools.pairwise(fences):
            assert b > a, f"fence of {name!r} did not increase: {a} then {b} in {fences}"  # type: ignore[operator]


def assert_later_holds_fenced_higher(holds: Iterable[Hold]) -> None:
    """For holds that may overlap (a semaphore's permits): fences are unique per name, and a hold
    requested after another had ended has the higher fence.

    Needs ``requested`` on every hold: the server granted a hold somewhere between its request and
    its recorded start, so only a request after another hold's recorded end proves the order (a
    thread paused between acquire() returning and recording its start would otherwise seem to
    begin after a later hold ended)."""
    by_name: dict[str, list[Hold]] = defaultdict(list)
    for hold in holds:
        by_name[hold.name].append(hold)
    for name, items in by_name.items():
        fences = [h.fence for h in items]
        assert all(f is not None for f in fences), f"a hold of {name!r} had no fence"
        assert all(h.requested is not None for h in items), "record when each hold was requested"
        assert len(set(fences)) == len(fences), f"a fence of {name!r} was issued twice"
        ended = sorted(items, key=lambda h: h.end)
        highest_ended, i = -1, 0
        for hold in sorted(items, key=lambda h: h.requested or 0):
            while i < len(ended) and ended[i].end < (hold.requested or 0):
                highest_ended = max(highest_ended, ended[i].fence or -1)
                i += 1
            assert (hold.fence or -1) > highest_ended, (
                f"hold of {name!r} (pid {hold.pid}) was requested after a hold with fence "
                f"{highest_ended} had ended, but got fence {hold.fence}"
            )


class FencedRegister:
    """A storage cell that accepts a write only with a fence above the highest it has seen.

    SQLite with ``BEGIN IMMEDIATE`` serialises writers from any number of processes. Every attempt
    is recorded with its verdict, so a test can check what was accepted and what was rejected.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS writes (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                "name TEXT, fence INTEGER, payload TEXT, accepted INTEGER, highest INTEGER)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def write(self, name: str, fence: int, payload: str = "") -> bool:
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(
                "SELECT MAX(fence) FROM writes WHERE name = ? AND accepted = 1", (name,)
            ).fetchone()
            highest = row[0] if row and row[0] is not None else -1
            accepted = fence > highest
            db.execute(
                "INSERT INTO writes (name, fence, payload, accepted, highest) VALUES (?,?,?,?,?)",
                (name, fence, payload, int(accepted), highest),
            )
            db.execute("COMMIT")
            return accepted
        finally:
            db.close()

    def writes(self) -> list[dict[str, Any]]:
        db = self._connect()
        try:
            cursor = db.execute(
                "SELECT seq, name, fence, payload, accepted, highest FROM writes ORDER BY seq"
            )
            cols = [c[0] for c in cursor.description]
            return [dict(zip(cols, row, strict=True)) for row in cursor.fetchall()]
        finally:
            db.close()

    def assert_consistent(self) -> None:
        """Accepted fences strictly increase per name; every rejected write was stale."""
        highest: dict[str, int] = {}
        for w in self.writes():
            previous = highest.get(w["name"], -1)
            if w["accepted"]:
                assert w["fence"] > previous, f"register accepted a stale write: {w}"
                highest[w["name"]] = w["fence"]
            else:
                assert w["fence"] <= previous, f"register rejected a fresh write: {w}"


def now_ns() -> int:
    return time.monotonic_ns()


def run_processes(
    target: Callable[..., Any],
    args_list: Sequence[tuple[Any, ...]],
    *,
    timeout: float = 60.0,
    start_method: str = "spawn",
) -> None:
    """Run ``target(*args)`` in one fresh process per entry and wait for all; any failure fails.

    ``spawn`` gives each contender its own interpreter, as separate worker machines would have.
    """
    ctx = get_context(start_method)
    procs = [ctx.Process(target=target, args=args) for args in args_list]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                raise AssertionError(f"contender {proc.pid} still running after {timeout}s")
            assert proc.exitcode == 0, f"contender {proc.pid} exited with {proc.exitcode}"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
