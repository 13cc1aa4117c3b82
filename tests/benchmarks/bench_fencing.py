"""Fencing benchmarks: what checking a lock's fencing token in the writer's transaction costs.

One single-row write transaction (``with engine.begin() as conn: ...``, an ``UPDATE accounts SET
balance = balance + 1 WHERE id = 1``), timed with and without the fence, on three databases:
PostgreSQL 16 (the pgserver wheel, a unix socket, psycopg 3; fsync and synchronous_commit as
pgserver leaves them: on), SQLite in a file in a temporary directory with its default rollback
journal (``journal_mode=delete``, ``synchronous=full``), and SQLite in WAL mode
(``synchronous=normal``, the usual WAL setting: no fsync at commit). Variants:

* plain: the transaction as it is, the UPDATE built inline as application code builds it;
* ``fence()`` + the same UPDATE (``tasklock.fencing.sqlalchemy.fence``, a ``tasklock_fence`` table);
* ``fenced_update()``: the fence column on the row itself (one statement, no fence table);
* floor: ``SELECT 1`` + the same UPDATE: what any second statement in the transaction costs;
* prototypes, timed here only, of what could make the fence cheaper: fence()'s own upsert (the
  same SQL, ``tasklock.fencing.rules``) built once and reused; on PostgreSQL the upsert and the
  UPDATE as one statement (a data-modifying CTE: one round trip instead of two); the UPDATE
  built once (``plain, pre-built``), and fenced_update's statement built once with the token as
  a bound parameter (against that pre-built plain).

Tokens come from one counter per database, so every fenced call is accepted: a StaleFence (or a
fenced statement that changed no row) is counted, and at the end the balance, the fence table's
token and the fence column are checked against what the calls should have left. Rounds rotate
the order of the variants; reported are the median and best microseconds per transaction, the
CPU microseconds in this process, their ratios to plain, and the paired ratios (the median over
rounds of a variant's time / plain's in the same round), with the per-round ratios of fence()
and fenced_update(). Targets: fence() + UPDATE <= 1.3x plain (paired); fenced_update() held to
the same 1.3x; no refusal, every write where it should be. SQLAlchemy's building of a statement
is part of every figure: on SQLite in WAL mode most of a plain transaction is Python.

    python tests/benchmarks/bench_fencing.py [--calls 30] [--rounds 21]
        [--databases postgresql,sqlite,sqlite-wal] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.interleave import (  # noqa: E402
    measure,
    paired_ratio,
    print_ratios,
    report_targets,
)

MISSING: dict[str, str] = {}
try:
    import sqlalchemy as sa

    from tasklock.errors import StaleFence
    from tasklock.fencing import rules
    from tasklock.fencing.sqlalchemy import fence, fence_table, fenced_update
except ImportError as exc:
    MISSING["all"] = f"sqlalchemy cannot be imported ({exc})"
try:
    with warnings.catch_warnings():
        # platformdirs warns on import when XDG_RUNTIME_DIR is unset; nothing to act on.
        warnings.simplefilter("ignore")
        import pgserver  # noqa: F401
    import psycopg
except ImportError as exc:
    MISSING["postgresql"] = f"pgserver or psycopg cannot be imported ({exc})"

from tests.support.databases import start_postgres  # noqa: E402

PLAIN = "plain: UPDATE"
FENCE = "fence() + UPDATE"
FUPD = "fenced_update()"
TRIP = "floor: SELECT 1 + UPDATE"
PRE_FENCE = "proto: fence's upsert pre-built + UPDATE"
CTE = "proto: upsert + UPDATE, one statement (CTE)"
PLAIN_PRE = "plain, UPDATE pre-built"
PRE_FUPD = "proto: fenced UPDATE pre-built"
WIDTH = 44
TARGET = 1.3
RESOURCE = "acct:1"
DATABASES = ("postgresql", "sqlite", "sqlite-wal")


class Refused(Exception):
    """A prototype's fence that stored nothing (a StaleFence for fence() itself)."""


def tables() -> tuple[sa.MetaData, sa.Table, sa.Table]:
    metadata = sa.MetaData()
    fences = fence_table(metadata)
    accounts = sa.Table(
        "accounts",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("balance", sa.BigInteger, nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=True),
    )
    return metadata, fences, accounts


@contextlib.contextmanager
def database(kind: str) -> Iterator[tuple[sa.Engine, str]]:
    """An engine on a fresh database of ``kind``, and a line describing it."""
    if kind == "postgresql":
        with start_postgres() as postgres:
            engine = sa.create_engine(postgres.sqlalchemy_url)
            try:
                with engine.connect() as conn:
                    shown = {
                        name: conn.exec_driver_sql(f"SHOW {name}").scalar()
                        for name in ("server_version", "fsync", "synchronous_commit")
                    }
                yield (
                    engine,
                    (
                        f"PostgreSQL {shown['server_version']} (pgserver, unix socket, psycopg "
                        f"{psycopg.__version__}; fsync {shown['fsync']}, synchronous_commit "
                        f"{shown['synchronous_commit']})"
                    ),
                )
            finally:
                engine.dispose()
        return
    with tempfile.TemporaryDirectory(prefix="tasklock-bench-fence-") as directory:
        engine = sa.create_engine(f"sqlite:///{directory}/bench.db")
        if kind == "sqlite-wal":

            @sa.event.listens_for(engine, "connect")
            def wal(dbapi_connection: Any, _record: Any) -> None:
                cursor = dbapi_connection.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.close()

        try:
            with engine.connect() as conn:
                journal = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
                sync = conn.exec_driver_sql("PRAGMA synchronous").scalar()
            level = {0: "off", 1: "normal", 2: "full", 3: "extra"}.get(sync, sync)
            yield (
                engine,
                (
                    f"SQLite {sqlite3.sqlite_version} (a file in a temporary "
                    f"directory; journal_mode={journal}, synchronous={level})"
                ),
            )
        finally:
            engine.dispose()


class Tally:
    """What the variants did: transactions that wrote, refusals, the last tokens given."""

    def __init__(self) -> None:
        self.tokens = itertools.count(1)
        self.written: dict[str, int] = {}
        self.refused: dict[str, int] = {}
        self.last_fence_row = 0  # the last token given to the fence table
        self.last_fence_column = 0  # the last token given to accounts.fence

    def fence_row_token(self) -> int:
        self.last_fence_row = next(self.tokens)
        return self.last_fence_row

    def fence_column_token(self) -> int:
        self.last_fence_column = next(self.tokens)
        return self.last_fence_column

    def counted(self, name: str, run: Callable[[], None]) -> Callable[[], None]:
        """``run`` counting its refusals (which roll its transaction back) and its writes."""
        self.written[name] = self.refused[name] = 0

        def call() -> None:
            try:
                run()
            except (StaleFence, Refused):
                self.refused[name] += 1
            else:
                self.written[name] += 1

        return call


def variants(
    engine: sa.Engine, fences: sa.Table, accounts: sa.Table, tally: Tally
) -> dict[str, Callable[[], None]]:
    """Each variant as one whole write transaction; each writes balance + 1 once, or raises."""
    dialect = engine.dialect
    quoted = dialect.identifier_preparer.format_table(fences)
    types = {
        "resource": fences.c.resource.type,
        "token": fences.c.token.type,
        "now": fences.c.updated_at.type,
    }

    def prepared(template: str) -> sa.TextClause:
        """A rules template as a text() with the fence table's types, built once."""
        sql, _ = rules.render(template, dict.fromkeys(types), "named")
        names = [name for name in types if f":{name}" in sql]
        return sa.text(sql).bindparams(*(sa.bindparam(name, type_=types[name]) for name in names))

    upsert = prepared(rules.fence_sql(dialect.name, quoted))
    select_one = sa.text("SELECT 1")
    token_param = sa.bindparam("token", type_=sa.BigInteger)
    plain_pre = sa.update(accounts).where(accounts.c.id == 1).values(balance=accounts.c.balance + 1)
    fenced_pre = (
        sa.update(accounts)
        .where(
            accounts.c.id == 1,
            sa.or_(accounts.c.fence.is_(None), accounts.c.fence <= token_param),
        )
        .values(balance=accounts.c.balance + 1, fence=token_param)
    )

    def update() -> sa.Update:  # as the application writes it, inside the transaction
        return sa.update(accounts).where(accounts.c.id == 1).values(balance=accounts.c.balance + 1)

    def fence_params() -> dict[str, Any]:
        now = datetime.datetime.now(datetime.UTC)
        return {"resource": RESOURCE, "token": tally.fence_row_token(), "now": now}

    def plain() -> None:
        with engine.begin() as conn:
            conn.execute(update())

    def fenced() -> None:
        with engine.begin() as conn:
            fence(conn, fences, RESOURCE, tally.fence_row_token())
            conn.execute(update())

    def column() -> None:
        with engine.begin() as conn:
            changed = fenced_update(
                conn,
                accounts,
                accounts.c.id == 1,
                tally.fence_column_token(),
                balance=accounts.c.balance + 1,
            )
            if changed != 1:
                raise Refused(f"fenced_update changed {changed} rows")

    def trip() -> None:
        with engine.begin() as conn:
            conn.execute(select_one).scalar()
            conn.execute(update())

    def pre_fence() -> None:
        with engine.begin() as conn:
            if not conn.execute(upsert, fence_params()).fetchall():
                raise Refused("the pre-built upsert returned no row")
            conn.execute(update())

    def plain_prebuilt() -> None:
        with engine.begin() as conn:
            conn.execute(plain_pre)

    def pre_fenced_update() -> None:
        with engine.begin() as conn:
            changed = conn.execute(fenced_pre, {"token": tally.fence_column_token()}).rowcount
            if changed != 1:
                raise Refused(f"the pre-built fenced UPDATE changed {changed} rows")

    runs: dict[str, Callable[[], None]] = {
        PLAIN: plain,
        FENCE: fenced,
        FUPD: column,
        TRIP: trip,
        PRE_FENCE: pre_fence,
    }
    if dialect.name == "postgresql":
        # PostgreSQL runs a data-modifying CTE whether or not it is read; the UPDATE reads it.
        table = accounts.name
        cte = prepared(
            f"WITH fenced AS ({rules.fence_sql(dialect.name, quoted)}) UPDATE {table} "
            f"SET balance = {table}.balance + 1 WHERE {table}.id = 1 "
            "AND EXISTS (SELECT 1 FROM fenced)"
        )

        def one_statement() -> None:
            with engine.begin() as conn:
                if conn.execute(cte, fence_params()).rowcount != 1:
                    raise Refused("the one-statement fence changed no row")

        runs[CTE] = one_statement
    runs[PLAIN_PRE] = plain_prebuilt
    runs[PRE_FUPD] = pre_fenced_update
    return {name: tally.counted(name, run) for name, run in runs.items()}


def verify(engine: sa.Engine, fences: sa.Table, accounts: sa.Table, tally: Tally) -> list[str]:
    """What is wrong with the database after the run (nothing: an empty list)."""
    with engine.connect() as conn:
        balance, column = conn.execute(
            sa.select(accounts.c.balance, accounts.c.fence).where(accounts.c.id == 1)
        ).one()
        stored = conn.scalar(sa.select(fences.c.token).where(fences.c.resource == RESOURCE))
    wrong = [f"{name}: {count} refused" for name, count in tally.refused.items() if count]
    written = sum(tally.written.values())
    if balance != written:
        wrong.append(f"balance {balance}, but {written} transactions wrote")
    if stored != tally.last_fence_row:
        wrong.append(f"fence table token {stored}, last given {tally.last_fence_row}")
    if column != tally.last_fence_column:
        wrong.append(f"fence column {column}, last given {tally.last_fence_column}")
    return wrong


def bench_database(kind: str, calls: int, rounds: int) -> dict[str, Any]:
    metadata, fences, accounts = tables()
    with database(kind) as (engine, description):
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(sa.insert(accounts).values(id=1, balance=0))
        tally = Tally()
        runs = variants(engine, fences, accounts, tally)
        samples: dict[str, list[float]] = {}
        counts, warmup = dict.fromkeys(runs, calls), dict.fromkeys(runs, 30)
        results = measure(runs, counts, rounds, warmup, samples=samples)
        wrong = verify(engine, fences, accounts, tally)
    for name, us in results.items():
        us["paired_x_plain"] = paired_ratio(samples, name, PLAIN)
        us["paired_x_plain_prebuilt"] = paired_ratio(samples, name, PLAIN_PRE)
    return {
        "database": description,
        "latency_us": results,
        "samples": samples,
        "transactions": sum(tally.written.values()) + sum(tally.refused.values()),
        "wrong": wrong,
    }


def report_database(
    kind: str, out: dict[str, Any], calls: int, rounds: int, checks: dict[str, bool]
) -> None:
    latency, samples = out["latency_us"], out["samples"]
    title = (
        f"{kind}: {out['database']}\n    {rounds} interleaved rounds of {calls} transactions "
        "per variant"
    )
    print_ratios(title, latency, PLAIN, "x plain", WIDTH)
    print("\n    paired ratios (median over rounds of this round's time / the other's)")
    print(f"    {'variant':<{WIDTH}} {'x plain':>8} {'x plain pre-built':>18}")
    for name, us in latency.items():
        print(
            f"    {name:<{WIDTH}} {us['paired_x_plain']:8.2f} {us['paired_x_plain_prebuilt']:18.2f}"
        )
    for name, base in ((FENCE, PLAIN), (FUPD, PLAIN), (FENCE, TRIP), (PRE_FUPD, PLAIN_PRE)):
        ratios = [a / b for a, b in zip(samples[name], samples[base], strict=True)]
        print(
            f"\n    {name} / {base}, per round: median {statistics.median(ratios):.2f}, "
            f"range {min(ratios):.2f}-{max(ratios):.2f}\n      "
            + " ".join(f"{x:.2f}" for x in ratios)
        )
    print(
        f"\n    checked: {out['transactions']} transactions (warm-up included), "
        + ("every write accepted and where it should be" if not out["wrong"] else "WRONG: ")
        + "; ".join(out["wrong"])
    )
    checks[f"{kind}: fence() + UPDATE <= {TARGET}x plain (paired)"] = (
        latency[FENCE]["paired_x_plain"] <= TARGET
    )
    checks[f"{kind}: fenced_update() <= {TARGET}x plain (paired)"] = (
        latency[FUPD]["paired_x_plain"] <= TARGET
    )
    checks[f"{kind}: no StaleFence, balance and tokens as written"] = not out["wrong"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=30, help="transactions per variant per round")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument(
        "--databases", default=",".join(DATABASES), help=f"some of {','.join(DATABASES)}"
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    kinds = [kind for kind in args.databases.split(",") if kind]
    unknown = [kind for kind in kinds if kind not in DATABASES]
    if unknown:
        parser.error(f"unknown database(s): {', '.join(unknown)}; choose from {DATABASES}")
    results: dict[str, Any] = {}
    if "all" in MISSING:
        print(
            f"SKIPPED bench_fencing: {MISSING['all']}; it needs sqlalchemy, pgserver and "
            "psycopg[binary]"
        )
        return results
    started = time.perf_counter()
    checks: dict[str, bool] = {}
    load = os.getloadavg()
    print(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for kind in kinds:
        if kind in MISSING:
            print(f"\nSKIPPED {kind}: {MISSING[kind]}")
            continue
        began = time.perf_counter()
        out = bench_database(kind, args.calls, args.rounds)
        report_database(kind, out, args.calls, args.rounds, checks)
        print(f"    ({kind}: {time.perf_counter() - began:.0f} s)")
        results[kind] = {key: value for key, value in out.items() if key != "samples"}
    return report_targets(checks, results, started, args.json)


if __name__ == "__main__":
    main()
