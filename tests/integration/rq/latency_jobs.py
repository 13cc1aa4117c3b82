"""Job functions for the RQ retry-latency test (importable: a forking worker imports them by
their dotted path).

The holder blocks on ``go:<account>`` until the test has seen its duplicate meet it, then works
``hold`` seconds more; the duplicate only records what it saw.
"""

from __future__ import annotations

import time
from typing import Any

from rq.job import get_current_job

from tasklock.rq import singleton_job

TTL = 60  # the old rule rescheduled a duplicate 40-66 s later; the test times out after 25 s


@singleton_job(key=["account"], on_duplicate="retry", ttl=TTL, fencing=True)
def settle(
    account: int, role: str, hold: float = 0.0, fence_token: int | None = None
) -> dict[str, Any]:
    job = get_current_job()
    assert job is not None, "not running as an RQ job"
    start = time.time()  # one host: the test compares the two jobs' wall clocks
    if role == "holder":
        job.connection.rpush(f"entered:{account}", 1)
        assert job.connection.blpop([f"go:{account}"], timeout=20), "the test never said go"
        time.sleep(hold)  # the rest of the holder's work
    return {"role": role, "fence": fence_token, "start": start, "end": time.time()}
