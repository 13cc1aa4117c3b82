"""The guard with ``rate=`` against a real redis-server: what each ``on_rate_limit`` policy does,
where the rate is counted (after the lock, so a skipped duplicate costs nothing), reservations of
deferred calls, ``rate_key`` / ``rate_group``, ``limit=None``, and the enqueue marker of a
deferred "until_start" run. The adapters' re-sending is tested with real workers in
``tests/integration/celery/test_rates.py`` and ``tests/integration/rq/test_rq_rates.py``."""

from __future__ import annotations

import itertools
import pickle
import threading
from typing import Any

import pytest
import redis

from tasklock.errors import BackendUnavailable, DuplicateTask, RateLimited
from tasklock.guard import Guard, Throttle
from tasklock.rating import KEEP
from tests.support.servers import RedisServer, free_port

HOUR = "1/h"


def charge(tenant_id: int, invoice_id: int = 0) -> None: ...


def make_guard(server: RedisServer | str, name: str = "app.charge", **options: Any) -> Guard:
    url = server if isinstance(server, str) else server.url
    return Guard(charge, name, {"url": url, **options})


def run(
    guard: Guard,
    args: tuple[Any, ...],
    task_id: str | None,
    *,
    near: float | None = 0.05,
    adapter: bool = True,
    body: Any = None,
) -> Any:
    return guard.run(
        args,
        {},
        body or (lambda extra: "ran"),
        task_id=task_id,
        on_skip=lambda d: ("duplicate", d),
        on_retry=lambda d: ("duplicate retry", d),
        duplicate_error=DuplicateTask,
        on_rate_limit=(lambda t: t) if adapter else None,
        rate_near=near,
    )


def tats(r: redis.Redis, guard: Guard, args: tuple[Any, ...]) -> dict[bytes, float]:
    key = guard.rate_gate.key(guard.options, args, {})
    return {k: float(v) for k, v in r.hgetall(key).items() if not k.endswith(b":starts")}


def test_retry_reserves_the_calls_slot_and_the_call_comes_back_to_it(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(redis_server, rate="20/s", key=["invoice_id"], rate_key=[])
    assert run(guard, (1, 1), "t1") == "ran"
    throttle = run(guard, (1, 2), "t2", near=0.0)
    assert isinstance(throttle, Throttle)
    assert throttle.policy == "retry"
    assert 0 < throttle.retry_after <= 0.05
    slot = f"{throttle.key}:slot:t2"
    assert r.exists(slot)
    assert r.pttl(slot) > (KEEP - 1) * 1000
    before = tats(r, guard, (1, 2))
    # Back at (or near) its slot: admitted on its reservation, which is used up; not counted again.
    assert run(guard, (1, 2), "t2", near=0.0) == "ran"
    assert not r.exists(slot)
    assert tats(r, guard, (1, 2)) == before


def test_a_call_back_too_early_is_deferred_again_keeping_its_place(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(redis_server, rate=HOUR, key=["invoice_id"], rate_key=[])
    assert run(guard, (1, 1), "t1") == "ran"
    first = run(guard, (1, 2), "t2")
    state = tats(r, guard, (1, 2))
    again = run(guard, (1, 2), "t2")
    assert again.policy == "retry"
    assert again.retry_after <= first.retry_after
    assert tats(r, guard, (1, 2)) == state  # no second slot taken
    third = run(guard, (1, 3), "t3")
    assert third.retry_after > first.retry_after + 3599  # the next slot, an hour later


def test_deferred_calls_get_slots_in_arrival_order(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(redis_server, rate="10/m", key=["invoice_id"], rate_key=[])
    assert run(guard, (1, 0), "t0") == "ran"
    delays = [run(guard, (1, n), f"t{n}").retry_after for n in range(1, 5)]
    assert delays == sorted(delays)
    gaps = [b - a for a, b in itertools.pairwise(delays)]
    assert all(5.9 < gap < 6.1 for gap in gaps), gaps  # one emission interval (60 s / 10) apart


def test_skip_consumes_nothing(r: redis.Redis, redis_server: RedisServer) -> None:
    guard = make_guard(
        redis_server, rate=HOUR, on_rate_limit="skip", key=["invoice_id"], rate_key=[]
    )
    assert run(guard, (1, 1), "t1") == "ran"
    state = tats(r, guard, (1, 1))
    throttle = run(guard, (1, 2), "t2")
    assert (throttle.policy, throttle.rate) == ("skip", "1/h")
    assert 3590 < throttle.retry_after <= 3600
    assert tats(r, guard, (1, 1)) == state
    assert r.keys("*:slot:*") == []


def test_raise_fails_with_rate_limited_that_survives_pickling(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(
        redis_server, rate=HOUR, on_rate_limit="raise", key=["invoice_id"], rate_key=[]
    )
    assert run(guard, (1, 1), "t1") == "ran"
    with pytest.raises(RateLimited) as error:
        run(guard, (1, 2), "t2")
    copy = pickle.loads(pickle.dumps(error.value))
    assert (copy.key, copy.retry_after) == (error.value.key, error.value.retry_after)
    assert 3590 < copy.retry_after <= 3600
    assert "app.charge: rate limited (1/h" in str(copy)


def test_wait_sleeps_to_its_slot_within_wait_timeout(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(
        redis_server, rate="2/s", on_rate_limit="wait", key=["invoice_id"], rate_key=[]
    )
    seconds, micros = r.time()
    start = seconds * 1_000_000 + micros
    assert [run(guard, (1, n), f"t{n}") for n in range(3)] == ["ran"] * 3
    seconds, micros = r.time()
    # Each call slept to its slot (0, 0.5 and 1 s after the first), so by the server's clock the
    # third ended at least a second after the first began; the TAT stands at the fourth slot.
    assert seconds * 1_000_000 + micros - start >= 1_000_000
    [tat] = tats(r, guard, (1, 0)).values()
    assert tat - start >= 1_500_000
    assert r.keys("*:slot:*") == []


@pytest.mark.parametrize(
    ("on_wait_timeout", "outcome"), [("retry", "retry"), ("skip", "skip"), ("raise", None)]
)
def test_wait_past_wait_timeout_applies_on_wait_timeout(
    r: redis.Redis, redis_server: RedisServer, on_wait_timeout: str, outcome: str | None
) -> None:
    guard = make_guard(
        redis_server,
        rate=HOUR,
        on_rate_limit="wait",
        wait_timeout=1,
        on_wait_timeout=on_wait_timeout,
        key=["invoice_id"],
        rate_key=[],
    )
    assert run(guard, (1, 1), "t1") == "ran"
    if outcome is None:
        with pytest.raises(RateLimited):
            run(guard, (1, 2), "t2")
        return
    throttle = run(guard, (1, 2), "t2")
    assert (throttle.policy, throttle.waited) == (outcome, True)
    assert bool(r.keys("*:slot:t2")) == (outcome == "retry")


def test_a_skipped_duplicate_uses_no_capacity(r: redis.Redis, redis_server: RedisServer) -> None:
    guard = make_guard(redis_server, rate=HOUR, key=["invoice_id"], rate_key=[])
    holder = guard.lock_for(guard.lock_key((1, 1), {}))
    assert holder.acquire(blocking=False)
    try:
        outcome, _ = run(guard, (1, 1), "t1")
        assert outcome == "duplicate"
        assert tats(r, guard, (1, 1)) == {}  # the rate was never asked
    finally:
        holder.release()
    assert run(guard, (1, 1), "t2") == "ran"


def test_rate_key_counts_per_tenant_while_the_lock_is_per_invoice(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(redis_server, rate=HOUR, key=["invoice_id"], rate_key=["tenant_id"])
    assert run(guard, (1, 1), "a") == "ran"
    assert run(guard, (1, 2), "b").policy == "retry"  # same tenant, other invoice
    assert run(guard, (2, 3), "c") == "ran"  # another tenant


def test_rate_group_shares_one_limit_between_tasks(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    refund = make_guard(redis_server, "app.refund", rate=HOUR, rate_group="stripe", rate_key=[])
    charge_ = make_guard(redis_server, "app.charge", rate=HOUR, rate_group="stripe", rate_key=[])
    assert run(refund, (1,), "a") == "ran"
    throttle = run(charge_, (2,), "b")
    assert throttle.policy == "retry"
    assert throttle.key == refund.rate_gate.key(refund.options, (9,), {})
    assert "{rate:stripe:" in throttle.key


def test_limit_none_runs_bodies_of_one_key_at_once_under_the_rate(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(redis_server, rate="5/h", burst=5, limit=None, rate_key=[])
    entered, finish = threading.Event(), threading.Event()

    def held(extra: dict[str, Any]) -> str:
        entered.set()
        assert finish.wait(10)
        return "held"

    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(run(guard, (1, 1), "a", body=held)))
    thread.start()
    try:
        assert entered.wait(10)
        assert run(guard, (1, 1), "b") == "ran"  # same key, no lock: runs beside the first
        assert r.keys("*:lock:*") == []
    finally:
        finish.set()
        thread.join(10)
    assert results == ["held"]


def test_a_deferred_until_start_run_keeps_its_marker(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(
        redis_server,
        rate=HOUR,
        key=["invoice_id"],
        rate_key=[],
        dedupe_enqueue="until_start",
        on_duplicate="retry",
    )
    assert guard.claim_pending((1, 1), {}, "t1") is None
    assert run(guard, (1, 1), "t1") == "ran"
    assert guard.claim_pending((1, 2), {}, "t2") is None
    throttle = run(guard, (1, 2), "t2")
    assert throttle.policy == "retry"
    marker = guard.pending_key((1, 2), {})
    assert r.get(marker) == b"t2"
    # Kept for pending_ttl past the slot, so it cannot expire while the run waits for it.
    assert r.pttl(marker) > (3600 + throttle.retry_after - 60) * 1000


def test_a_call_that_cannot_be_re_sent_sleeps_until_its_slot(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(redis_server, rate="20/s", rate_key=[])
    assert [run(guard, (1, n), None, near=None) for n in range(3)] == ["ran"] * 3
    guard = make_guard(redis_server, "app.skip", rate=HOUR, rate_key=[], on_rate_limit="skip")
    assert run(guard, (1,), None, near=None, adapter=False) == "ran"
    with pytest.raises(RateLimited):  # no adapter callback: the refusal is raised
        run(guard, (1,), None, near=None, adapter=False)


@pytest.mark.parametrize("on_backend_error", ["raise", "run"])
def test_an_unreachable_redis_for_a_rate_only_task(on_backend_error: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?socket_connect_timeout=0.5"
    guard = make_guard(url, rate="5/s", limit=None, on_backend_error=on_backend_error)
    if on_backend_error == "raise":
        with pytest.raises(BackendUnavailable):
            run(guard, (1,), "t1")
    else:
        assert run(guard, (1,), "t1") == "ran"
