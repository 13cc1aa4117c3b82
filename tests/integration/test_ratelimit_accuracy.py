"""How accurate tasklock.RateLimit is under real contention: four processes (``spawn``, each its
own interpreter, like four worker machines) hammer ``try_acquire()`` on one "50/s" limit for two
seconds, recording each call with ``time.monotonic()`` just before and just after it.

The server ran each call at some instant inside its [before, after] bracket (the host's
monotonic clock and the server's clock run at the same rate: one machine, and NTP slews both).
From the brackets alone, two bounds follow that hold however loaded this box is:

* **never too many**: GCRA with burst 1 admits calls at least one interval T apart on the
  server's clock, so no window of one period (N * T) holds more than N admissions. Admitted
  calls whose whole bracket lies inside a window a little shorter than the period certainly
  happened inside it: there may never be more than N of them. (A slow call only has a wider
  bracket, which makes it count in fewer windows; it can never make the check fail.)
* **never too few**: after an admission, the limit's TAT is one interval later; the first call
  that reaches the server at or after the TAT is admitted. A call that *started* at or after
  the TAT reached the server after it, and was answered by its *end*: so the next admission
  happened no later than the earliest end among calls started at or after the TAT. Replaying
  that rule over the recorded calls, always taking the latest instant it allows, gives a number
  of admissions that the real limit must reach (it is at every step at least as early). This is
  "rate x duration" counted only over the time the workers were really calling: were the
  workers starved (a busy 2-core box), they called less, and the replay expects less; a limit
  that refuses calls it should admit, or spaces them too far, falls below it.

The plain "rate x duration" figure is in the failure message, for information: it depends on
how much CPU the workers got, so it is not asserted.
"""

from __future__ import annotations

import bisect
import json
import time
from multiprocessing import get_context
from pathlib import Path

import pytest
import redis

import tasklock
from tests.support.polling import eventually
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

RATE, COUNT, PERIOD = "50/s", 50, 1.0
INTERVAL = PERIOD / COUNT
WORKERS, DURATION = 4, 2.0
#: Clock slack: the host's monotonic clock against the server's (same machine: a few ppm; 1e-3
#: to be safe), and the script's microseconds.
RATE_SLACK, US = 1e-3, 1e-6


def _hammer(port: int, out: str) -> None:
    """One worker: wait for the go, then call try_acquire() back to back for DURATION seconds."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
    limit = tasklock.RateLimit(client, "accuracy", RATE)
    client.incr("accuracy:ready")
    assert client.blpop(["accuracy:go"], timeout=60), "no go within 60 s"
    calls: list[tuple[float, float, bool]] = []
    start = time.monotonic()
    while True:
        before = time.monotonic()
        if before - start >= DURATION:
            break
        admitted = bool(limit.try_acquire())
        calls.append((before, time.monotonic(), admitted))
    Path(out).write_text(json.dumps(calls))
    client.close()


def most_in_one_period(admitted: list[tuple[float, float]]) -> int:
    """The most admissions certainly inside one window a little shorter than the period."""
    window = PERIOD * (1 - RATE_SLACK) - 2 * US
    most = 0
    for start, _ in admitted:
        inside = sum(1 for b, a in admitted if b >= start and a < start + window)
        most = max(most, inside)
    return most


def admissions_owed(calls: list[tuple[float, float]]) -> int:
    """The admissions a correct limit must have made, given when the calls were made (see the
    module's docstring): the next admission is at the latest the earliest end among calls that
    started at or after the TAT, and the TAT is then one interval later."""
    calls = sorted(calls)
    starts = [b for b, _ in calls]
    earliest_end = [0.0] * len(calls)  # the earliest end among calls[i:]
    running = float("inf")
    for i in range(len(calls) - 1, -1, -1):
        running = min(running, calls[i][1])
        earliest_end[i] = running
    owed, due = 0, float("-inf")
    while True:
        i = bisect.bisect_left(starts, due)
        if i == len(calls):
            return owed
        owed += 1
        due = earliest_end[i] + INTERVAL * (1 + RATE_SLACK) + 5 * US


def test_processes_hammering_one_limit_get_exactly_the_rate(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    ctx = get_context("spawn")
    outs = [tmp_path / f"worker-{i}.json" for i in range(WORKERS)]
    workers = [
        ctx.Process(target=_hammer, args=(redis_server.port, str(out)), daemon=True) for out in outs
    ]
    for worker in workers:
        worker.start()
    try:
        eventually(
            lambda: int(r.get("accuracy:ready") or 0) == WORKERS,
            timeout=60,
            what="every worker is ready",
        )
        r.rpush("accuracy:go", *["go"] * WORKERS)
        for worker in workers:
            worker.join(60)
            assert worker.exitcode == 0, f"worker {worker.pid} exited with {worker.exitcode}"
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join(5)
    calls = [tuple(call) for out in outs for call in json.loads(out.read_text())]
    admitted = sorted((b, a) for b, a, ok in calls if ok)
    refused = len(calls) - len(admitted)
    owed = admissions_owed([(b, a) for b, a, _ in calls])
    first, last = min(b for b, _, _ in calls), max(a for _, a, _ in calls)
    figures = (
        f"{len(admitted)} admitted, {refused} refused, {owed} owed by the calls made; "
        f"{COUNT * (last - first) + 1:.0f} at {RATE} over the run's {last - first:.2f} s"
    )
    assert refused > len(admitted), f"the workers did not contend: {figures}"
    assert owed >= 10, f"the workers hardly ran (a starved box): {figures}"
    assert most_in_one_period(admitted) <= COUNT, f"over {COUNT} in one period: {figures}"
    assert len(admitted) >= owed, f"fewer admissions than the calls made were owed: {figures}"
