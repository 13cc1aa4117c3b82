"""Send the service a batch of jobs at once, wait for every reply, and check the ledger.

    python -m examples.asyncio_service.send --url redis://localhost:6379/0 --credits 200

Pushes an ``audit`` of one account (``--audit ACCOUNT:SECONDS``) and then ``--credits`` credits
of random amounts on ``--accounts`` accounts, all concurrently, waits for the replies (the
service's workers push them to a list of this batch), then compares each account's balance in the
ledger with its opening balance plus the credits sent, and checks that the fencing tokens of the
ledger's writes increase. Exit status 0 if everything matches, 1 if not. Run one ``send`` at a
time: a concurrent batch on the same accounts would move the balances it checks.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import sys
import uuid
from collections import Counter, defaultdict
from typing import Any

import redis.asyncio as aioredis

from examples.asyncio_service.service import QUEUE, SERVICES
from examples.asyncio_service.store import Ledger


def credit_amounts(count: int, accounts: int, seed: int) -> list[tuple[int, int]]:
    """``(account, cents)`` of ``count`` credits on accounts ``1..accounts``; the same every
    time for one ``seed``."""
    rng = random.Random(seed)
    return [(rng.randint(1, accounts), rng.randint(1, 1000)) for _ in range(count)]


async def send(args: argparse.Namespace) -> bool:
    redis = aioredis.Redis.from_url(args.url)
    try:
        return await _send(redis, args)
    finally:
        await redis.aclose()


async def _send(redis: Any, args: argparse.Namespace) -> bool:
    ledger = Ledger(redis)
    services = sorted(name.decode() for name in await redis.smembers(SERVICES))
    print(f"{len(services)} services up: {', '.join(services) or 'none (start some!)'}")

    batch = uuid.uuid4().hex[:8]
    reply_to = f"asyncio_service:replies:{batch}"
    credits: list[dict[str, Any]] = [
        {"id": f"{batch}-{n}", "kind": "credit", "account": account, "cents": cents}
        for n, (account, cents) in enumerate(
            credit_amounts(args.credits, args.accounts, args.seed), 1
        )
    ]
    jobs = credits
    if args.audit:
        account, seconds = args.audit.split(":")
        audit = {"id": f"{batch}-audit", "kind": "audit", "account": int(account)}
        jobs = [{**audit, "seconds": float(seconds)}, *credits]
    accounts = sorted({job["account"] for job in jobs})
    opening = {account: await ledger.balance(account) for account in accounts}

    # The audit first, so that it holds its account while the credits arrive; then the credits,
    # all at once (one pipeline, one round trip).
    for job in jobs[: len(jobs) - len(credits)]:
        await redis.lpush(QUEUE, json.dumps({**job, "reply": reply_to}))
    async with redis.pipeline(transaction=False) as pipe:
        for job in credits:
            pipe.lpush(QUEUE, json.dumps({**job, "reply": reply_to}))
        await pipe.execute()
    print(
        f"batch {batch}: sent {len(credits)} credits on accounts "
        + ", ".join(map(str, accounts))
        + (f", after an audit of account {account} for {seconds} s" if args.audit else "")
    )

    replies: dict[str, dict[str, Any]] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.deadline
    while len(replies) < len(jobs):
        left = deadline - loop.time()
        if left <= 0:
            print(f"timed out: {len(replies)} of {len(jobs)} replies after {args.deadline:g} s")
            return False
        # Short waits: redis-py gives up reading a reply after its socket_timeout (5 s).
        item = await redis.blpop([reply_to], timeout=min(1.0, left))
        if item is not None:
            reply = json.loads(item[1])
            replies[reply["id"]] = reply
    await redis.delete(reply_to)
    return await report(ledger, batch, credits, replies, opening)


async def report(
    ledger: Ledger,
    batch: str,
    credits: list[dict[str, Any]],
    replies: dict[str, dict[str, Any]],
    opening: dict[int, int],
) -> bool:
    ok = True
    for reply in replies.values():
        if reply["kind"] == "audit":
            verdict = "balance unchanged" if reply["stable"] else "BALANCE MOVED"
            if reply["lost"]:
                verdict = "LOST its lock"
            ok = ok and not reply["lost"] and reply["stable"]
            print(
                f"audit of account {reply['account']}: {verdict}, {reply['balance']} cents "
                f"(fence {reply['fence']}, worker {reply['worker']})"
            )

    sent: dict[int, list[int]] = defaultdict(list)
    for job in credits:
        sent[job["account"]].append(job["cents"])
    for account in sorted(opening):
        cents = sent[account]
        expected = opening[account] + sum(cents)
        balance = await ledger.balance(account)
        writes = await ledger.writes(account)
        fences = [fence for fence, _, _ in writes]
        increasing = all(a < b for a, b in itertools.pairwise(fences))
        ours = [job_id for _, _, job_id in writes if job_id.startswith(f"{batch}-")]
        once = len(ours) == len(set(ours)) == len(cents)
        good = balance == expected and increasing and once
        ok = ok and good
        print(
            f"account {account}: {opening[account]} + {len(cents)} credits of {sum(cents)} "
            f"= {expected}, ledger {balance}; {len(ours)} fenced writes, tokens "
            f"{'increasing' if increasing else 'NOT INCREASING'}: {'ok' if good else 'WRONG'}"
        )

    workers = {reply["worker"] for reply in replies.values()}
    services = {worker.rsplit("/", 1)[0] for worker in workers}
    requeued = sum(reply["requeued"] for reply in replies.values())
    stale = sum(reply["stale"] for reply in replies.values())
    per_service = Counter(reply["worker"].rsplit("/", 1)[0] for reply in replies.values())
    print(
        f"{len(workers)} workers in {len(services)} services did the jobs "
        f"({', '.join(f'{name}: {n}' for name, n in sorted(per_service.items()))}); "
        f"{requeued} requeued after blocking_timeout, {stale} rerun after a stale fence"
    )
    print("all balances match" if ok else "FAILED: see above")
    return ok


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"), help="Redis URL"
    )
    parser.add_argument("--credits", type=int, default=200, help="credit jobs to send (200)")
    parser.add_argument("--accounts", type=int, default=3, help="accounts 1..N to credit (3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the credits' amounts (1)")
    parser.add_argument(
        "--audit",
        default="1:5",
        help="ACCOUNT:SECONDS of an audit to send first (1:5); '' for none",
    )
    parser.add_argument(
        "--deadline", type=float, default=60.0, help="seconds to wait for the replies (60)"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(0 if asyncio.run(send(parse_args())) else 1)
