"""Smoke tests of the asyncio service, against real redis-server and service processes.

* Three services of eight asyncio workers each; 200 credits sent at once on three accounts, behind
  a 3 s audit that holds one account: no credit is lost or applied twice, the ledger's fencing
  tokens increase per account, the watchdog keeps the audit's lock, credits that meet it go back
  to the queue, and SIGTERM stops every process cleanly.
* A service frozen (SIGSTOP) past its lock's TTL while auditing: another service credits the
  account meanwhile, and the audit, awake again, finds ``lock.lost`` set and gives up.
* The ledger on its own: a token older than one it has seen is refused.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from tests.support.servers import RedisServer

from examples.asyncio_service import store
from examples.asyncio_service.send import credit_amounts
from examples.asyncio_service.service import QUEUE, SERVICES
from examples.conftest import PYTHON, Processes

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
CREDITS, ACCOUNTS, SEED = 200, 3, 7


def number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return int(found.group(1))


def test_credits_from_three_services_are_serialised_per_account(
    redis_server: RedisServer, processes: Processes
) -> None:
    url = redis_server.url
    client = redis_server.client()
    services = []
    for n in (1, 2, 3):
        argv = [PYTHON, "-m", "examples.asyncio_service.service", "--url", url]
        # A 2 s TTL, so that the 3 s audit lives on the watchdog's renewals; credits that meet it
        # give up after 1 s and go back to the queue.
        argv += ["--workers", "8", "--lock-ttl", "2", "--blocking-timeout", "1"]
        argv += ["--name", f"service-{n}"]
        services.append(processes.start(f"service-{n}", argv, ROOT, {}))
    processes.wait_until(lambda: client.scard(SERVICES) == 3, "three services ready")

    argv = [PYTHON, "-m", "examples.asyncio_service.send", "--url", url]
    argv += ["--credits", str(CREDITS), "--accounts", str(ACCOUNTS), "--seed", str(SEED)]
    result = processes.run([*argv, "--audit", "1:3"], ROOT, {}, timeout=90)

    out = result.stdout
    assert result.returncode == 0, out + result.stderr + processes.output()
    assert "3 services up: service-1, service-2, service-3" in out
    assert re.search(r"audit of account 1: balance unchanged, \d+ cents", out), out
    assert re.search(r"\d+ workers in 3 services did the jobs", out), out
    assert number(r"(\d+) requeued after blocking_timeout", out) >= 1, out
    assert out.rstrip().endswith("all balances match"), out

    # The ledger, checked here rather than trusting send's report.
    sent: dict[int, list[int]] = defaultdict(list)
    for account, cents in credit_amounts(CREDITS, ACCOUNTS, SEED):
        sent[account].append(cents)
    assert len(sent) == ACCOUNTS
    for account, cents in sent.items():
        entries = client.lrange(store.writes_key(account), 0, -1)
        writes = [store.parse_write(entry) for entry in entries]
        fences = [fence for fence, _, _ in writes]
        balances = [balance for _, balance, _ in writes]
        job_ids = [job_id for _, _, job_id in writes]
        assert int(client.hget(store.ledger_key(account), "balance")) == sum(cents)
        assert len(writes) == len(set(job_ids)) == len(cents), "one write per credit"
        assert all(a < b for a, b in itertools.pairwise(fences)), f"account {account}: {fences}"
        # Each write added one credit to the balance the previous write left: no lost update.
        steps = [b - a for a, b in itertools.pairwise([0, *balances])]
        assert sorted(steps) == sorted(cents)
        assert not client.exists(f"account:{account}"), "every lock released"
    assert client.llen(QUEUE) == 0

    for process in services:
        os.killpg(process.pid, signal.SIGTERM)
    for name, process, log in processes.started:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} did not stop on SIGTERM:\n{processes.output()}")
        text = log.read_text()
        assert process.returncode == 0, f"{name}:\n{text}"
        assert re.search(rf"{name}: stopped, \d+ jobs done", text), text
        assert "Traceback" not in text, text
    assert client.scard(SERVICES) == 0


def test_an_audit_frozen_past_its_ttl_finds_its_lock_lost(
    redis_server: RedisServer, processes: Processes
) -> None:
    url = redis_server.url
    client = redis_server.client()
    argv = [PYTHON, "-m", "examples.asyncio_service.service", "--url", url, "--workers", "1"]
    frozen = processes.start("frozen", [*argv, "--lock-ttl", "1", "--name", "frozen"], ROOT, {})
    processes.wait_until(lambda: client.scard(SERVICES) == 1, "the first service ready")
    audit = {"id": "audit", "kind": "audit", "account": 5, "seconds": 60, "reply": "replies"}
    client.lpush(QUEUE, json.dumps(audit))
    processes.wait_until(lambda: client.exists("account:5"), "the audit holding account 5")

    os.kill(frozen.pid, signal.SIGSTOP)  # its watchdog stops with it: the 1 s TTL runs out
    try:
        processes.wait_until(lambda: not client.exists("account:5"), "the frozen hold to expire")
        processes.start("other", [*argv, "--name", "other"], ROOT, {})
        credit = {"id": "credit", "kind": "credit", "account": 5, "cents": 100, "reply": "replies"}
        client.lpush(QUEUE, json.dumps(credit))
        credited = json.loads(processes.wait_until(lambda: client.lpop("replies"), "the credit"))
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    assert credited["worker"] == "other/w1"
    assert credited["balance"] == 100

    # Awake again, the audit sees lock.lost (the watchdog found the key gone) and gives up long
    # before its 60 s are over.
    audited = json.loads(processes.wait_until(lambda: client.lpop("replies"), "the audit"))
    assert audited["id"] == "audit"
    assert audited["lost"] is True
    assert audited["fence"] < credited["fence"]
    frozen_log = processes.started[0][2].read_text()
    assert "lost the lock on account 5, audit abandoned" in frozen_log, frozen_log

    for _, process, log in processes.started:
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(15) == 0, log.read_text()


async def test_the_ledger_refuses_a_token_older_than_one_it_has_seen(
    redis_server: RedisServer,
) -> None:
    redis = aioredis.Redis.from_url(redis_server.url)
    try:
        ledger = store.Ledger(redis)
        old, new = 1795484772456034, 1795484772456035
        assert await ledger.read_for_update(9, old) == 0
        # A newer holder reads before the old one writes: the old write is refused from then on.
        assert await ledger.read_for_update(9, new) == 0
        with pytest.raises(store.StaleFence):
            await ledger.write(9, old, 100, "old")
        await ledger.write(9, new, 250, "new")
        with pytest.raises(store.StaleFence):
            await ledger.read_for_update(9, old)
        # Compared as digit strings: exact beyond Lua's doubles (2**53 + 1 > 2**53).
        await ledger.write(9, 2**53, 300, "big")
        await ledger.write(9, 2**53 + 1, 400, "bigger")
        with pytest.raises(store.StaleFence):
            await ledger.write(9, 2**53, 500, "stale")
        assert await ledger.balance(9) == 400
        assert await ledger.writes(9) == [
            (new, 250, "new"),
            (2**53, 300, "big"),
            (2**53 + 1, 400, "bigger"),
        ]
    finally:
        await redis.aclose()
