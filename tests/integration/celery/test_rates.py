"""Fleet-wide rate limits (``rate=``) under real ``celery worker --pool=prefork`` subprocesses: a
burst is spread at the rate (never more than the rate in a rolling second) with no backoff tail and
without holding the pool (an unlimited task sent after the whole burst starts before its middle),
deferrals cost no ``max_retries``, ``skip`` / ``raise``, a chain whose first link is deferred, and
a deferral longer than the broker keeps a message (split into hops, run once).

Starts are recorded on the server's clock (``TIME``), the clock the limit counts on. Two workers
serve the module (``rates_app.app``; ``rates_app.hop_app`` for the hops); every test uses its own
batch, so nothing is flushed between tests (kombu keeps its bindings in the same Redis).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import chain

from tasklock.celery import RATE_LIMITED
from tasklock.errors import RateLimited
from tests.integration.celery import rates_app
from tests.integration.celery.support import WorkerProcess
from tests.support.polling import eventually, holds_for
from tests.support.servers import RedisServer
from tests.support.starts import most_in_a_second, starts

pytestmark = pytest.mark.slow

app, hop_app = rates_app.app, rates_app.hop_app

#: The burst: this many calls of a "5/s" task, sent at once.
BURST, PER_SECOND = 15, 5
#: A recorded start lags its slot by the time from the rate script to the body's TIME call: the
#: first start of a burst may be this late, so the spread of a burst may be this much shorter.
START_LAG = 0.1


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rates")


def start_worker(
    redis_server: RedisServer, directory: Path, app_: Any, name: str
) -> Iterator[WorkerProcess]:
    app_.conf.update(broker_url=redis_server.url, result_backend=redis_server.url)
    process = WorkerProcess(
        f"tests.integration.celery.rates_app:{name}",
        {"TL_RATES_URL": redis_server.url},
        directory / f"{name}.log",
        concurrency=2,
    )
    try:
        yield process.start(app_)
    finally:
        process.stop()


@pytest.fixture(scope="module")
def worker(redis_server: RedisServer, directory: Path) -> Iterator[WorkerProcess]:
    yield from start_worker(redis_server, directory, app, "app")


@pytest.fixture(scope="module")
def hop_worker(redis_server: RedisServer, directory: Path) -> Iterator[WorkerProcess]:
    yield from start_worker(redis_server, directory, hop_app, "hop_app")


@pytest.fixture
def rc(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def batch() -> str:
    return uuid.uuid4().hex[:10]


def deferrals(worker: WorkerProcess, task_id: str) -> int:
    """How many times the call was re-sent through the broker (Celery logs each retry)."""
    return worker.log().count(f"[{task_id}] retry:")


@pytest.mark.parametrize(
    ("task", "count", "per_second"),
    [(rates_app.burst, BURST, PER_SECOND), (rates_app.fast_burst, 40, 20)],
    ids=["15-at-5-per-s", "40-at-20-per-s"],
)
def test_a_burst_runs_at_the_rate_without_a_tail_nor_holding_the_pool(
    rc: redis.Redis, worker: WorkerProcess, batch: str, task: Any, count: int, per_second: int
) -> None:
    calls = [task.delay(batch, index) for index in range(count)]
    unlimited = rates_app.free.delay(batch, "after-the-burst")
    assert [call.get(timeout=30) for call in calls]
    unlimited.get(timeout=30)

    runs = starts(rc, task.name, batch)
    assert sorted(int(label) for label, _, _ in runs) == list(range(count))  # each exactly once
    times = sorted(at for _, at, _ in runs)
    # Spread from the first start: it cannot be faster than the rate (a slower machine only
    # widens it). And no backoff tail: each call comes back once, for the slot it reserved, however
    # late the machine brings it back (a bound on the spread would measure the machine instead).
    spread = times[-1] - times[0]
    least = (count - 1) / per_second
    assert least - START_LAG <= spread, times
    resent = {call.id: deferrals(worker, call.id) for call in calls}
    assert all(times_resent <= 1 for times_resent in resent.values()), resent
    # The calls waited for their slots in the broker, not in the pool: most were re-sent, and the
    # unlimited call sent after the whole burst started before the burst's last call, indeed
    # before its middle one (a pool whose children sleep for the slots would take it only after
    # all but the last call of the burst).
    assert sum(deferrals(worker, call.id) > 0 for call in calls) >= count // 2
    [(_, free_start, _)] = starts(rc, "r.free", batch)
    assert free_start < times[count // 2], (free_start, times)
    # Never more than the rate in a rolling second (one more where a window meets a boundary),
    # also when re-sent calls come back after their slots (they queue behind the burst's first
    # pass): a late call must not start alongside the calls that are on time.
    relative = [round(t - times[0], 3) for t in times]
    assert most_in_a_second(times) <= per_second + 1, f"starts (s after the first): {relative}"


def test_a_deferral_costs_none_of_max_retries(
    rc: redis.Redis, worker: WorkerProcess, batch: str
) -> None:
    first = rates_app.no_retries.delay(batch, 0)
    assert first.get(timeout=30) == 0
    deferred = rates_app.no_retries.delay(batch, 1)  # a second within the same second: deferred
    # max_retries=0, yet the deferred call runs, and with the retry count it had.
    assert deferred.get(timeout=30) == 0
    assert deferred.state == "SUCCESS"
    assert deferrals(worker, deferred.id) >= 1
    assert [label for label, _, _ in starts(rc, "r.no_retries", batch)] == ["0", "1"]


def test_skip_gives_state_rate_limited(rc: redis.Redis, worker: WorkerProcess, batch: str) -> None:
    rates_app.skip.delay(batch, 0).get(timeout=30)
    skipped = rates_app.skip.delay(batch, 1)
    eventually(lambda: skipped.state == RATE_LIMITED, timeout=30, what="the call skipped")
    info = skipped.info
    assert info["policy"] == "skip"
    assert info["rate"] == "1/m"
    assert 0 < info["retry_after"] <= 60
    assert [label for label, _, _ in starts(rc, "r.skip", batch)] == ["0"]


def test_raise_fails_the_call_with_rate_limited(
    rc: redis.Redis, worker: WorkerProcess, batch: str
) -> None:
    rates_app.refuse.delay(batch, 0).get(timeout=30)
    refused = rates_app.refuse.delay(batch, 1)
    with pytest.raises(RateLimited) as raised:
        refused.get(timeout=30)
    assert refused.state == "FAILURE"
    assert 0 < raised.value.retry_after <= 60
    assert str(raised.value.key).startswith("tasklock:{rate:r.raise:")
    assert [label for label, _, _ in starts(rc, "r.raise", batch)] == ["0"]


def test_a_chain_whose_first_link_is_deferred_runs_the_rest_after_it(
    rc: redis.Redis, worker: WorkerProcess, batch: str
) -> None:
    assert rates_app.first_link.delay(batch, 0).get(timeout=30) == batch  # takes this second
    workflow = chain(rates_app.first_link.s(batch, 1), rates_app.next_link.s("tail"))
    result = workflow.apply_async()
    assert result.get(timeout=30) == f"{batch}:tail:done"
    assert deferrals(worker, result.parent.id) >= 1  # the first link did wait for its slot
    first = {label: at for label, at, _ in starts(rc, "r.first_link", batch)}
    [(_, tail_start, _)] = starts(rc, "r.next_link", batch)
    assert first["1"] - first["0"] >= 1.0 - START_LAG  # one per second
    assert tail_start >= first["1"]


def test_a_deferral_longer_than_the_visibility_timeout_hops_and_runs_once(
    rc: redis.Redis, hop_worker: WorkerProcess, batch: str
) -> None:
    """``rate="1/4s"`` on a broker that redelivers a message unacknowledged for 2 s: the second
    call's four seconds are split into hops of at most 1 s, and it runs once, at its slot. An eta
    of four seconds would be swept back into the queue and delivered twice: the second copy,
    finding no reservation, would be deferred as a new call and run a second time."""
    first = rates_app.hops.delay(batch, 0)
    first.get(timeout=30)
    second = rates_app.hops.delay(batch, 1)
    second.get(timeout=30)

    runs = starts(rc, "r.hops", batch)
    assert [label for label, _, _ in runs] == ["0", "1"]
    gap = runs[1][1] - runs[0][1]
    assert 4.0 - START_LAG <= gap < 4.0 + 1.5, gap  # at its slot
    # Never twice: no copy of the call is left anywhere, and none runs while we look.
    slots = list(rc.scan_iter(match=f"*:slot:{second.id}"))
    assert not slots, "a copy of the call was deferred again after it ran"
    holds_for(lambda: rc.llen(f"starts:r.hops:{batch}") == 2, 1.0, what="no second run")
    scheduled = hop_app.control.inspect([hop_worker.hostname], timeout=2).scheduled()
    assert scheduled == {hop_worker.hostname: []}
    assert deferrals(hop_worker, second.id) >= 2  # more than one hop
