"""Smoke test: a real prefork Celery worker, ten settle requests per account at once, and the
ledger shows one transfer per account; a write with an outdated fence token is rejected."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from celery import Celery
from tests.support.servers import RedisServer

import tasklock
from examples.celery_app import ledger
from examples.conftest import PYTHON, Processes

HERE = Path(__file__).resolve().parent
WORKER = [
    PYTHON, "-m", "celery", "-A", "payments", "worker", "--pool", "prefork", "--concurrency", "4",
    "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
]  # fmt: skip


def test_each_account_is_paid_out_once(
    redis_server: RedisServer, processes: Processes, tmp_path: Path
) -> None:
    db = str(tmp_path / "payments.sqlite3")
    env = {"REDIS_URL": redis_server.url, "PAYMENTS_DB": db}
    processes.start("celery worker", WORKER, HERE, env)
    control = Celery(broker=redis_server.url).control
    processes.wait_until(lambda: control.ping(timeout=0.5), "the Celery worker to answer")

    sent = processes.run([PYTHON, "send.py"], HERE, env)

    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "FAILED" not in sent.stdout
    # Ten requests per account, one transfer each: nobody was paid twice.
    transfers = ledger.transfers(db)
    assert sorted(account for account, _, _ in transfers) == [1, 2, 3], sent.stdout
    assert {cents for _, cents, _ in transfers} == {1250 + 4000 + 99}
    skipped = re.search(r"skipped  (\d+) duplicates", sent.stdout)
    assert skipped, sent.stdout
    assert int(skipped.group(1)) > 0

    # A worker that stalled past its lock's TTL comes back with an older token: rejected. (A token
    # equal to the account's newest is the same hold writing again, and would be accepted.)
    ledger.add_payment(db, 1, 500)
    [(payment_id, _)] = ledger.pending(db, 1)
    newest_for_account_1 = next(fence for account, _, fence in transfers if account == 1)
    stale = newest_for_account_1 - 1
    with pytest.raises(tasklock.StaleFence) as refused:
        ledger.transfer(db, 1, [payment_id], stale)
    assert (refused.value.token, refused.value.newer) == (stale, newest_for_account_1)
    assert ledger.pending(db, 1) == [(payment_id, 500)], "a rejected write must change nothing"
    assert len(ledger.transfers(db)) == 3
