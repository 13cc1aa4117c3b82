"""Semaphore benchmarks, side by side in one run against one real redis-server.

(a) Semaphore cycle (acquire + release, uncontended, limit 5), against the floor of two bare
    round trips with redis-py (``SET NX PX`` then ``DEL``, the lock benchmark's floor):
    tasklock.Semaphore with an explicit timeout (watchdog off), by default (30 s TTL, watchdog
    on), and with 4 of its 5 permits held by others; tasklock.Lock (timeout=30) for reference;
    and the Python Redis semaphores that install beside tasklock and work with redis-py 8:
    py-redis-semaphore (one script to acquire; a script and a notify pipeline to release; a
    heartbeat thread per hold, always on) and concurrency-limit (HLEN, then HSET + EXPIRE + HLEN
    in MULTI, then HDEL). redis-semaphore-eval (one script each way, like tasklock, but no fence,
    TTLs in whole seconds) is timed when it can be imported: its metadata pins redis<4, so it is
    not in the ``bench`` extra (``pip install --no-deps redis-semaphore-eval==0.3.0``).
    Rounds interleave the variants so that machine noise hits them all alike; reported are the
    median and best microseconds per cycle, the CPU microseconds per cycle in this process, their
    ratios, and the paired ratios (the median over rounds of a variant's time / the floor's in the
    same round: steadier here, where the machine's speed moves for seconds at a time). A new
    tasklock.Semaphore made per cycle (``with Semaphore(...):``) is timed beside the reused one.
    Target: tasklock.Semaphore <= 1.2x the floor (paired), reused or made per cycle.
(b) Contended, briefly: 8 threads, each with a semaphore object of its own, share 5 permits;
    each holds its permit for 2 ms (a sleep). Reported: holds per second, against the ideal of
    5 / 2 ms, and the most holders seen at once in this process (never more than 5). tasklock
    waiters are woken by the release's PUBLISH, py-redis-semaphore's by a BLPOP on a list the
    release pushes to, concurrency-limit's poll every 0.1 s.

A competitor that cannot be imported is left out with a printed reason; the rest still run.

    python tests/benchmarks/bench_semaphore.py [--cycles 200] [--rounds 21] [--seconds 1]
        [--parts ab] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

import tasklock  # noqa: E402
from tests.benchmarks.interleave import (  # noqa: E402
    floor_cycle,
    fresh_cycle,
    lock_cycle,
    measure,
    paired_ratio,
    print_ratios,
)
from tests.support.servers import start_servers  # noqa: E402

LIMIT = 5
TTL = 30
FLOOR = "floor: SET NX PX + DEL"
EXPLICIT = "tasklock.Semaphore(timeout=30)"
DEFAULT = "tasklock.Semaphore() watchdog"
BUSY = "tasklock.Semaphore(timeout=30), 4/5 held"
LOCK = "tasklock.Lock(timeout=30) (reference)"
FRESH = "tasklock.Semaphore(timeout=30) per cycle"
PRS = "py-redis-semaphore (heartbeat thread)"
CL = "concurrency-limit limit()"
RSE = "redis-semaphore-eval"
WIDTH = 40
MISSING: dict[str, str] = {}

try:
    from redis_semaphore import Semaphore as PrsSemaphore
    from redis_semaphore import SemaphoreConfig as PrsConfig
except ImportError as exc:  # Redis-Semaphore (2016) has the same import name and no config
    PrsSemaphore = PrsConfig = None  # type: ignore[assignment,misc]
    MISSING[PRS] = f"py-redis-semaphore cannot be imported ({exc})"
try:
    from concurrency_limit import LimitConfiguration, RedisConfiguration
    from concurrency_limit import limit as cl_limit
except ImportError as exc:
    cl_limit = None  # type: ignore[assignment]
    MISSING[CL] = f"concurrency-limit cannot be imported ({exc})"
try:
    from redis_semaphore_eval import acquire_lock as rse_acquire
    from redis_semaphore_eval import clear_lock as rse_clear
except ImportError as exc:
    rse_acquire = rse_clear = None  # type: ignore[assignment]
    MISSING[RSE] = (
        f"redis-semaphore-eval cannot be imported ({exc}); it pins redis<4, so it is not in the "
        "bench extra: pip install --no-deps redis-semaphore-eval==0.3.0 to time it"
    )


def client_for(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port)


# -- the competitors, as objects with acquire() and release() -------------------------------------


def prs_semaphore(r: redis.Redis, name: str) -> Any:
    """py-redis-semaphore with a 30 s TTL (its heartbeat renews every 10 s; it cannot be off)."""
    assert PrsSemaphore is not None
    assert PrsConfig is not None
    # blpop_timeout under the client's socket timeout, or it logs a warning per object
    config = PrsConfig(name=name, limit=LIMIT, lock_timeout=TTL, blpop_timeout=1.0)
    return PrsSemaphore(r, config)


class PrsCycle:
    """py-redis-semaphore's acquire() answers a result object that is always truthy."""

    def __init__(self, sem: Any) -> None:
        self.sem = sem

    def acquire(self) -> bool:
        return bool(self.sem.acquire().success)

    def release(self) -> None:
        self.sem.release()


class ClCycle:
    """concurrency-limit is a context manager only: acquire enters it, release leaves it."""

    def __init__(self, r: redis.Redis, key: str, wait: float) -> None:
        assert cl_limit is not None
        self.redis_config = RedisConfiguration(connection_pool=r.connection_pool)
        self.limit_config = LimitConfiguration(
            key=key, limit=LIMIT, limit_timeout=wait, limit_expire=TTL
        )
        self.held: contextlib.AbstractContextManager[int] | None = None

    def acquire(self) -> bool:
        held = cl_limit(self.redis_config, self.limit_config)
        held.__enter__()
        self.held = held
        return True

    def release(self) -> None:
        assert self.held is not None
        held, self.held = self.held, None
        held.__exit__(None, None, None)


class RseCycle:
    """redis-semaphore-eval's functions: a new uuid4 owner per acquire, as its semaphore() does."""

    def __init__(self, r: redis.Redis, key: str) -> None:
        self.redis, self.key = r, key
        self.lock_id: Any = None

    def acquire(self) -> bool:
        assert rse_acquire is not None
        self.lock_id = rse_acquire(self.redis, self.key, LIMIT, expire_in=TTL)
        return self.lock_id is not None

    def release(self) -> None:
        assert rse_clear is not None
        rse_clear(self.redis, self.key, self.lock_id)


# -- (a) cycle ------------------------------------------------------------------------------------


@contextlib.contextmanager
def cycle_variants(r: redis.Redis) -> Iterator[dict[str, Callable[[], None]]]:
    others = [tasklock.Semaphore(r, "bench:sem:busy", LIMIT, timeout=600) for _ in range(4)]
    for other in others:  # four other owners hold a permit each for the whole run
        assert other.acquire(blocking=False)
    variants: dict[str, Callable[[], None]] = {
        FLOOR: floor_cycle(r),
        EXPLICIT: lock_cycle(tasklock.Semaphore(r, "bench:sem:explicit", LIMIT, timeout=TTL)),
        DEFAULT: lock_cycle(tasklock.Semaphore(r, "bench:sem:default", LIMIT)),
        BUSY: lock_cycle(tasklock.Semaphore(r, "bench:sem:busy", LIMIT, timeout=TTL)),
        LOCK: lock_cycle(tasklock.Lock(r, "bench:lock", timeout=TTL)),
        FRESH: fresh_cycle(lambda: tasklock.Semaphore(r, "bench:sem:fresh", LIMIT, timeout=TTL)),
    }
    if PRS not in MISSING:
        variants[PRS] = lock_cycle(PrsCycle(prs_semaphore(r, "bench:sem:prs")))
    if CL not in MISSING:
        variants[CL] = lock_cycle(ClCycle(r, "bench:sem:cl", wait=0))
    if RSE not in MISSING:
        variants[RSE] = lock_cycle(RseCycle(r, "bench:sem:rse"))
    try:
        yield variants
    finally:
        for other in others:
            other.release()


def bench_cycle(port: int, cycles: int, rounds: int) -> dict[str, dict[str, float]]:
    """Per variant: median/best wall-clock and median CPU microseconds per cycle, and the
    median of its per-round ratios to the floor and to tasklock.Semaphore(timeout=30)."""
    r = client_for(port)
    samples: dict[str, list[float]] = {}
    try:
        with cycle_variants(r) as variants:
            counts, warmup = dict.fromkeys(variants, cycles), dict.fromkeys(variants, 200)
            results = measure(variants, counts, rounds, warmup, samples=samples)
    finally:
        r.close()
    for name, us in results.items():
        us["paired_x_floor"] = paired_ratio(samples, name, FLOOR)
        us["paired_x_semaphore"] = paired_ratio(samples, name, EXPLICIT)
    return results


# -- (b) contended --------------------------------------------------------------------------------

THREADS = 8
HOLD = 0.002


def contended_kinds() -> list[str]:
    return [kind for kind in ("tasklock", PRS, CL) if kind not in MISSING]


def make_holder(kind: str, r: redis.Redis, name: str) -> Any:
    if kind == "tasklock":
        return tasklock.Semaphore(r, name, LIMIT, timeout=TTL)
    if kind == PRS:
        return PrsCycle(prs_semaphore(r, name))
    return ClCycle(r, name, wait=60)


def bench_contended(port: int, kind: str, seconds: float) -> dict[str, float]:
    """THREADS threads, LIMIT permits, each hold HOLD seconds, for ``seconds``."""
    r = client_for(port)
    name = f"bench:sem:contended:{kind}"
    guard = threading.Lock()
    holding = [0, 0]  # now, most at once
    counts = [0] * THREADS
    start = threading.Barrier(THREADS + 1)
    stop = threading.Event()

    errors: list[BaseException] = []

    def worker(index: int) -> None:
        holder = make_holder(kind, r, name)
        start.wait()
        try:
            while not stop.is_set():
                assert holder.acquire()
                with guard:
                    holding[0] += 1
                    holding[1] = max(holding)
                time.sleep(HOLD)
                with guard:
                    holding[0] -= 1
                holder.release()
                counts[index] += 1
        except BaseException as exc:  # reported below, not lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(30)
    elapsed = time.perf_counter() - began
    r.close()
    assert not any(thread.is_alive() for thread in threads), f"{kind}: a thread never finished"
    assert not errors, f"{kind}: {errors[0]!r}"
    return {"holds_per_s": sum(counts) / elapsed, "most_at_once": holding[1]}


# -- report ---------------------------------------------------------------------------------------


def report_cycle(cycle: dict[str, dict[str, float]], checks: dict[str, bool]) -> None:
    print("\n    paired ratios (median over rounds of this round's time / the other's)")
    print(f"    {'variant':<{WIDTH}} {'x floor':>8} {'x tasklock.Semaphore(timeout=30)':>33}")
    for name, us in cycle.items():
        print(f"    {name:<{WIDTH}} {us['paired_x_floor']:8.2f} {us['paired_x_semaphore']:33.2f}")
    for name in (EXPLICIT, DEFAULT, FRESH):
        checks[f"{name} cycle <= 1.2x floor"] = cycle[name]["paired_x_floor"] <= 1.2
    for name in (PRS, CL, RSE):
        if name in cycle:
            theirs = cycle[name]
            checks[f"faster than {name}"] = (
                theirs["paired_x_semaphore"] > 1.0
                and theirs["paired_x_floor"] > cycle[DEFAULT]["paired_x_floor"]
            )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200, help="cycles per round in (a)")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--seconds", type=float, default=1.0, help="per round in (b); 2 rounds")
    parser.add_argument("--parts", default="ab", help="which benchmarks to run (default: ab)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    for name, reason in MISSING.items():
        print(f"SKIPPED {name}: {reason}")
    with start_servers(1) as (server,):
        if "a" in args.parts:
            cycle = bench_cycle(server.port, args.cycles, args.rounds)
            title = (
                f"(a) acquire + release cycle, limit {LIMIT}: {args.rounds} interleaved rounds "
                f"of {args.cycles}"
            )
            print_ratios(title, cycle, FLOOR, "x floor", WIDTH)
            report_cycle(cycle, checks)
            results["cycle_us"] = cycle

        if "b" in args.parts:
            print(
                f"\n(b) contended: {THREADS} threads, {LIMIT} permits, each hold {HOLD * 1000:g} ms"
                f" (ideal {LIMIT / HOLD:.0f} holds/s), 2 rounds of {args.seconds:g} s"
            )
            print(f"    {'library':<{WIDTH}} {'holds/s':>9} {'x ideal':>8} {'most at once':>13}")
            kinds = contended_kinds()
            runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
            for round_ in range(2):
                for kind in kinds[round_:] + kinds[:round_]:
                    runs[kind].append(bench_contended(server.port, kind, args.seconds))
            results["contended"] = {}
            for kind, rows in runs.items():
                rate = statistics.median(row["holds_per_s"] for row in rows)
                most = int(max(row["most_at_once"] for row in rows))
                print(f"    {kind:<{WIDTH}} {rate:9.0f} {rate * HOLD / LIMIT:8.2f} {most:13d}")
                results["contended"][kind] = {"holds_per_s": rate, "most_at_once": most}
                checks[f"{kind}: never more than {LIMIT} holders"] = most <= LIMIT

    print("\ntargets")
    for label, ok in checks.items():
        print(f"    {'met ' if ok else 'MISS'}  {label}")
    results["targets"] = checks
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
