"""A plain-asyncio service that serialises work per account with ``tasklock.asyncio.Lock``.

Run it (from the repository root) as often as you like, on as many machines as you like::

    python -m examples.asyncio_service.service --url redis://localhost:6379/0 --workers 8

Each process runs ``--workers`` asyncio tasks that take jobs from the Redis list ``QUEUE`` (put
there by :mod:`examples.asyncio_service.send`) and process them one account at a time, whichever
process or task took them:

* ``credit``: a read-modify-write of the account's balance in the fenced ledger
  (:mod:`examples.asyncio_service.store`) under ``account:<id>``'s lock, with the lock's fencing
  token on both the read and the write.
* ``audit``: a long job that holds the account's lock for ``seconds`` and checks that its balance
  did not move meanwhile. The lock's TTL is renewed by the watchdog for as long as it is held;
  the job checks ``lock.lost`` between steps and gives up if the lock was lost after all.

A job whose lock is not free within ``--blocking-timeout`` goes back to the queue; one whose write
the ledger refused (:class:`~examples.asyncio_service.store.StaleFence`: its lock expired and a
newer holder came) runs again under a new lock. SIGTERM or Ctrl-C: the workers finish the job in
hand and the process exits with status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import socket
from typing import Any

import redis.asyncio as aioredis

from examples.asyncio_service.store import Ledger, StaleFence
from tasklock import LockError
from tasklock.asyncio import Lock

#: The job queue: producers LPUSH, workers BRPOP (first in, first out).
QUEUE = "asyncio_service:jobs"
#: Names of the running services, for ``send`` (and the smoke test) to see who is up.
SERVICES = "asyncio_service:services"
#: How long an idle worker waits for a job before it looks at the stop flag again.
IDLE_POLL = 0.5
#: How long a reply list is kept when nobody reads it.
REPLY_TTL = 3600

log = logging.getLogger("asyncio_service")


class Service:
    def __init__(
        self,
        redis: Any,
        name: str,
        workers: int,
        blocking_timeout: float,
        lock_ttl: float | None,
    ) -> None:
        self.redis = redis
        self.ledger = Ledger(redis)
        self.name = name
        self.workers = workers
        self.blocking_timeout = blocking_timeout
        self.lock_ttl = lock_ttl
        self.stopping = asyncio.Event()
        self.done = 0

    async def run(self) -> None:
        """Run the workers until :attr:`stopping` is set, then let them finish their jobs."""
        async with asyncio.TaskGroup() as workers:
            for number in range(1, self.workers + 1):
                workers.create_task(self.worker(f"{self.name}/w{number}"))
            await self.redis.sadd(SERVICES, self.name)
            log.info(
                "%s: ready, %d workers on %s (lock TTL %s renewed by the watchdog, "
                "blocking_timeout %g s)",
                self.name,
                self.workers,
                QUEUE,
                "30 s" if self.lock_ttl is None else f"{self.lock_ttl:g} s",
                self.blocking_timeout,
            )
        await self.redis.srem(SERVICES, self.name)
        log.info("%s: stopped, %d jobs done", self.name, self.done)

    async def worker(self, worker: str) -> None:
        while not self.stopping.is_set():
            # A timeout rather than cancelling the BRPOP on shutdown: a cancelled BRPOP may
            # already have taken a job off the list, which would then be lost.
            item = await self.redis.brpop([QUEUE], timeout=IDLE_POLL)
            if item is None:
                continue
            job = json.loads(item[1])
            reply = await self.process(job, worker)
            if reply is None:  # the account stayed locked for blocking_timeout: try later
                job["requeued"] = job.get("requeued", 0) + 1
                await self.redis.lpush(QUEUE, json.dumps(job))
                continue
            self.done += 1
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.rpush(job["reply"], json.dumps(reply))
                pipe.expire(job["reply"], REPLY_TTL)
                await pipe.execute()

    async def process(self, job: dict[str, Any], worker: str) -> dict[str, Any] | None:
        """Run one job under its account's lock; its reply, or None if the lock stayed busy."""
        account = job["account"]
        stale = 0
        while True:
            try:
                async with Lock(
                    self.redis,
                    f"account:{account}",
                    # None: a 30 s TTL that the watchdog renews while the lock is held, so a
                    # crashed process frees it within 30 s but a long job keeps it. (An explicit
                    # TTL, --lock-ttl, is renewed too: watchdog=True.)
                    timeout=self.lock_ttl,
                    watchdog=True,
                    # async with raises LockError if the lock is not ours within this time.
                    blocking_timeout=self.blocking_timeout,
                    # If the hold expired under us, the release fails, and that is no news: the
                    # ledger either refused our write (StaleFence, below) or took it before a
                    # newer holder read the account. tasklock logs a warning; no exception.
                    raise_on_release_error=False,
                    owner_info={"worker": worker},
                ) as lock:
                    fence = lock.fence
                    assert fence is not None
                    if job["kind"] == "credit":
                        result = await self.credit(job, fence)
                    else:
                        result = await self.audit(job, lock, fence)
            except StaleFence as error:
                stale += 1
                log.warning("%s: %s; running job %s again", worker, error, job["id"])
                continue
            except LockError:
                log.info(
                    "%s: account %s still locked after %g s, job %s back to the queue",
                    worker,
                    account,
                    self.blocking_timeout,
                    job["id"],
                )
                return None
            return {
                **result,
                "id": job["id"],
                "kind": job["kind"],
                "account": account,
                "fence": fence,
                "worker": worker,
                "requeued": job.get("requeued", 0),
                "stale": stale,
            }

    async def credit(self, job: dict[str, Any], fence: int) -> dict[str, Any]:
        account = job["account"]
        balance = await self.ledger.read_for_update(account, fence)
        # The work between the read and the write (a call to a fraud check, say). Without the
        # lock, another worker would read the same balance here and one of the credits would be
        # lost.
        await asyncio.sleep(random.uniform(0, 0.003))
        balance += job["cents"]
        await self.ledger.write(account, fence, balance, job["id"])
        log.info(
            "%s: credit account %s +%d -> %d (fence %d)",
            job["id"],
            account,
            job["cents"],
            balance,
            fence,
        )
        return {"balance": balance}

    async def audit(self, job: dict[str, Any], lock: Lock, fence: int) -> dict[str, Any]:
        """Hold the account for ``job["seconds"]``: no credit may land in the meantime."""
        account = job["account"]
        opening = await self.ledger.read_for_update(account, fence)
        loop = asyncio.get_running_loop()
        end = loop.time() + job["seconds"]
        while (left := end - loop.time()) > 0:
            if lock.lost:  # the watchdog could not renew the lock: someone else may have it
                log.error("%s: lost the lock on account %s, audit abandoned", job["id"], account)
                return {"balance": opening, "lost": True, "stable": None}
            await asyncio.sleep(min(left, 0.1))  # one step of the long job
        closing = await self.ledger.balance(account)
        log.info(
            "%s: audit of account %s: %d at the start, %d after %g s (fence %d)",
            job["id"],
            account,
            opening,
            closing,
            job["seconds"],
            fence,
        )
        return {"balance": closing, "lost": bool(lock.lost), "stable": closing == opening}


async def main(args: argparse.Namespace) -> None:
    # Each worker uses at most one connection at a time, and its lock's watchdog another.
    redis = aioredis.Redis.from_url(args.url, max_connections=2 * args.workers + 10)
    try:
        service = Service(redis, args.name, args.workers, args.blocking_timeout, args.lock_ttl)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, service.stopping.set)
        await service.run()
    finally:
        await redis.aclose()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"), help="Redis URL"
    )
    parser.add_argument("--workers", type=int, default=8, help="asyncio worker tasks (8)")
    parser.add_argument(
        "--blocking-timeout",
        type=float,
        default=2.0,
        help="seconds to wait for an account's lock before requeueing the job (2)",
    )
    parser.add_argument(
        "--lock-ttl",
        type=float,
        default=None,
        help="lock TTL in seconds, renewed by the watchdog (default: 30 s)",
    )
    parser.add_argument(
        "--name", default=f"{socket.gethostname()}:{os.getpid()}", help="this service's name"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    asyncio.run(main(parse_args()))
