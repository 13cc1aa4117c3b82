"""The pause scenario, with real processes on a real PostgreSQL and a real redis-server.

Six processes take one short-TTL lock (0.5 s, watchdog off) in turn. Some of them freeze (the
parent SIGSTOPs them) while they hold it, for longer than the TTL, so that another process takes
the lock; then each runs one transaction: fence, read the balance, write it + 1, append a history
row with its token. Two kinds of freeze:

* before the transaction, until a later holder has committed: that holder's token is newer, so
  the frozen one, once it runs again, must be refused and write nothing;
* inside the transaction, after its fence and its read, until a later holder is waiting on the
  database: its fence was current when it ran, and the fence row's lock keeps the later holder
  out until it commits, so both commit, in token order.

From what the database recorded: no lost update (the balance equals the committed transactions,
each history row saw the one before it), the committed tokens strictly increase in commit order
(the balance each wrote), every holder frozen before its transaction was refused and wrote
nothing, and every refused holder names the newer token that refused it.

The processes are ``spawn``ed (each its own interpreter, like separate worker machines); they talk
to the parent through pipes, and the parent waits on pipes and on PostgreSQL's lock view with
deadlines, never by sleeping a guessed amount.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Iterator
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from typing import Any

import pytest
import redis
import sqlalchemy as sa

import tasklock
from tasklock.fencing.sqlalchemy import fence, fence_table
from tests.support.databases import Postgres
from tests.support.servers import RedisServer

LOCK = "account:1:lock"
RESOURCE = "account:1"
TTL = 0.5
#: What the parent does with each hold, in the order the lock was acquired.
ROLES = ["frozen before", "runs", "frozen inside", "runs", "frozen before", "runs"]

metadata = sa.MetaData()
fences = fence_table(metadata)
accounts = sa.Table(
    "accounts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("balance", sa.BigInteger, nullable=False),
)
history = sa.Table(
    "history",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("token", sa.BigInteger, nullable=False),
    sa.Column("balance", sa.BigInteger, nullable=False),
)


def _worker(port: int, url: str, pipe: Connection) -> None:
    try:
        _hold_and_write(port, url, pipe)
    except BaseException:
        pipe.send(("error", traceback.format_exc()))
        raise


def _hold_and_write(port: int, url: str, pipe: Connection) -> None:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    lock = tasklock.Lock(
        redis.Redis(host="127.0.0.1", port=port, socket_timeout=10),
        LOCK,
        timeout=TTL,
        watchdog=False,
    )
    with engine.connect() as conn:  # connected first (as from a pool): the parent knows its pid
        backend = conn.scalar(sa.text("SELECT pg_backend_pid()"))
        conn.commit()
        assert lock.acquire(blocking_timeout=60), "no hold within 60 s"
        token = lock.fence
        assert token is not None
        pipe.send(("acquired", token, backend))
        assert pipe.recv() == "go"  # a holder frozen before its transaction is stopped about here
        outcome = _transaction(conn, token, pipe)
    try:
        lock.release()
        outcome["released"] = True
    except tasklock.LockNotOwnedError:
        outcome["released"] = False
    engine.dispose()
    pipe.send(("done", outcome))


def _transaction(conn: sa.Connection, token: int, pipe: Connection) -> dict[str, Any]:
    """Fence, read the balance, write it + 1, append a history row; commit or be refused."""
    outcome: dict[str, Any] = {"token": token}
    try:
        with conn.begin():
            fence(conn, fences, RESOURCE, token)
            balance = conn.scalar(sa.select(accounts.c.balance).where(accounts.c.id == 1))
            assert balance is not None
            pipe.send(("read", balance))
            assert pipe.recv() == "go on"  # a holder frozen inside its transaction: here
            conn.execute(sa.update(accounts).where(accounts.c.id == 1).values(balance=balance + 1))
            conn.execute(history.insert().values(pid=os.getpid(), token=token, balance=balance + 1))
        outcome["committed"] = True
    except tasklock.StaleFence as exc:
        outcome["committed"] = False
        outcome["refused"] = [exc.resource, exc.token, exc.newer]
    return outcome


@pytest.fixture
def pg(postgres: Postgres) -> Iterator[sa.Engine]:
    engine = sa.create_engine(postgres.sqlalchemy_url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(accounts.insert().values(id=1, balance=0))
    try:
        yield engine
    finally:
        metadata.drop_all(engine)
        engine.dispose()


class Orchestra:
    """The parent's side: starts the workers, answers their pipes, freezes and thaws them."""

    def __init__(self, port: int, url: str, pg: sa.Engine, count: int) -> None:
        ctx = get_context("spawn")
        self.pg = pg
        self.pipes: dict[int, Connection] = {}
        self.pid_of: dict[int, int] = {}  # id(pipe) -> its worker's pid
        self.procs: list[Any] = []
        for _ in range(count):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(port, url, theirs))
            proc.start()
            theirs.close()
            assert proc.pid is not None
            self.procs.append(proc)
            self.pipes[proc.pid] = ours
            self.pid_of[id(ours)] = proc.pid
        self.role: dict[int, str] = {}
        self.token: dict[int, int] = {}
        self.backend: dict[int, int] = {}  # its PostgreSQL backend's pid
        self.outcome: dict[int, dict[str, Any]] = {}
        self.frozen: dict[int, str] = {}  # pid -> the answer that thaws it

    def run(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.outcome) < len(self.procs):
            assert time.monotonic() < deadline, f"not done in {timeout}s: {self.outcome}"
            live = [pipe for pid, pipe in self.pipes.items() if pid not in self.outcome]
            for ready in wait(live, timeout=0.02):
                pid = self.pid_of[id(ready)]
                try:
                    message = self.pipes[pid].recv()
                except EOFError:
                    raise AssertionError(f"worker {pid} died: {self.outcome}") from None
                self.answer(pid, message)
            self.thaw_ready()

    def answer(self, pid: int, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "error":
            raise AssertionError(f"worker {pid} failed:\n{message[1]}")
        if kind == "acquired":
            self.role[pid] = ROLES[len(self.role)]
            self.token[pid], self.backend[pid] = message[1], message[2]
            self.freeze_or(pid, "frozen before", "go")
        elif kind == "read":
            self.freeze_or(pid, "frozen inside", "go on")
        elif kind == "done":
            self.outcome[pid] = message[1]

    def freeze_or(self, pid: int, role: str, answer: str) -> None:
        if self.role[pid] == role:
            os.kill(pid, signal.SIGSTOP)
            self.frozen[pid] = answer
        else:
            self.pipes[pid].send(answer)

    def thaw_ready(self) -> None:
        for pid, answer in list(self.frozen.items()):
            if self.may_thaw(pid):
                del self.frozen[pid]
                os.kill(pid, signal.SIGCONT)
                self.pipes[pid].send(answer)

    def may_thaw(self, pid: int) -> bool:
        mine = self.token[pid]
        newer_committed = any(o["committed"] and o["token"] > mine for o in self.outcome.values())
        if self.role[pid] == "frozen before":
            # Past its TTL for sure: a later holder took the lock and has committed.
            return newer_committed
        # Frozen inside: a later holder (so past its TTL) waits on the fence row (or, were
        # nothing fencing, has committed past it). An earlier holder thawed meanwhile may wait on
        # the row too: that one does not count.
        later = [self.backend[p] for p, token in self.token.items() if token > mine]
        if not later:
            return False
        with self.pg.connect() as conn:
            waiting = conn.scalar(
                sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = ANY(:later)"),
                {"later": later},
            )
        return bool(waiting) or newer_committed

    def close(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGCONT)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def test_frozen_holders_are_fenced_off_and_no_update_is_lost(
    redis_server: RedisServer, r: redis.Redis, postgres: Postgres, pg: sa.Engine
) -> None:
    orchestra = Orchestra(redis_server.port, postgres.sqlalchemy_url, pg, len(ROLES))
    try:
        orchestra.run(timeout=60)
    finally:
        orchestra.close()
    assert all(proc.exitcode == 0 for proc in orchestra.procs)
    outcomes = {pid: orchestra.outcome[pid] for pid in orchestra.role}
    role = orchestra.role
    with pg.connect() as conn:
        balance = conn.scalar(sa.select(accounts.c.balance))
        rows = conn.execute(sa.select(history).order_by(history.c.balance)).all()
        stored = conn.scalar(sa.select(fences.c.token).where(fences.c.resource == RESOURCE))
    committed = {pid: o for pid, o in outcomes.items() if o["committed"]}
    refused = {pid: o for pid, o in outcomes.items() if not o["committed"]}

    # No lost update: one increment per committed transaction, each on top of the one before.
    assert balance == len(rows) == len(committed), (balance, rows, outcomes)
    assert [row.balance for row in rows] == list(range(1, len(rows) + 1)), rows
    # Commit order (the balance each wrote) is token order.
    tokens = [row.token for row in rows]
    assert tokens == sorted(tokens), rows
    assert len(set(tokens)) == len(tokens), rows
    assert {row.pid: row.token for row in rows} == {p: o["token"] for p, o in committed.items()}
    assert stored == max(tokens)
    # Every holder frozen before its transaction was refused, naming the newer token, and wrote
    # nothing; so was any other refused holder.
    assert {p for p in role if role[p] == "frozen before"} <= set(refused), outcomes
    for pid, outcome in refused.items():
        resource, token, newer = outcome["refused"]
        assert (resource, token) == (RESOURCE, outcome["token"])
        assert newer in tokens, outcome
        assert newer > token, outcome
        assert pid not in {row.pid for row in rows}
    # The holder frozen inside its transaction had fenced first: it committed, before the later
    # holder that waited for it.
    assert all(committed.get(p) for p in role if role[p] == "frozen inside"), outcomes
    # Every frozen holder really lost its lock: its release found another owner.
    frozen = {p: (role[p], outcomes[p]) for p in role if role[p].startswith("frozen")}
    assert not any(outcome["released"] for _, outcome in frozen.values()), frozen
    assert len(refused) >= 2
