"""Add some payments, ask to settle each account ten times at once, and show what happened.

Run it with ``python send.py`` while a worker runs (``celery -A payments worker --concurrency 4``).
"""

from __future__ import annotations

import time

import ledger
from celery.result import AsyncResult
from payments import DB, settle

from tasklock.celery import DUPLICATE

ACCOUNTS = (1, 2, 3)


def wait(results: list[AsyncResult], timeout: float = 30) -> None:
    # A skipped duplicate ends in tasklock's DUPLICATE state. It is not one of Celery's "ready"
    # states, so result.get() would wait for it: poll the states instead.
    deadline = time.monotonic() + timeout
    while any(r.state not in ("SUCCESS", "FAILURE", DUPLICATE) for r in results):
        if time.monotonic() > deadline:
            raise SystemExit("timed out: is a worker running? celery -A payments worker")
        time.sleep(0.1)


def main() -> None:
    for account in ACCOUNTS:
        for cents in (1250, 4000, 99):
            ledger.add_payment(DB, account, cents)

    results = [
        settle.delay(account, requested_by=f"client-{n}") for n in range(10) for account in ACCOUNTS
    ]
    wait(results)

    ran = [r.result for r in results if r.state == "SUCCESS"]
    for done in ran:
        if done["cents"]:
            print(f"ran      settle({done['account_id']}) fence {done['fence']}: paid out")
    if any(not done["cents"] for done in ran):
        # A duplicate that arrives after the first run finished runs too: nothing left to pay.
        print(f"ran      {sum(not done['cents'] for done in ran)} more, found nothing pending")
    skipped = [r for r in results if r.state == DUPLICATE]
    if skipped:
        holder = skipped[0].info["holder"]
        print(f"skipped  {len(skipped)} duplicates (state {DUPLICATE}); one met holder {holder}")
    for result in results:
        if result.state == "FAILURE":
            print(f"FAILED   {result.id}: {result.result!r}")
    for account, cents, fence in ledger.transfers(DB):
        print(f"transfer account {account}: {cents} cents, written with fence {fence}")


if __name__ == "__main__":
    main()
