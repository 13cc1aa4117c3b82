"""asyncio lock benchmarks, side by side in one run against real redis-server processes.

(a) Lock cycle (acquire + release, uncontended, one name) on a ``redis.asyncio`` client, against
    the floor of two bare round trips (``SET NX PX`` then ``DEL``): tasklock.asyncio.Lock with an
    explicit timeout (watchdog off), by default (30 s TTL, watchdog on) and made anew per cycle
    (``async with Lock(r, name):``, and tried once with ``acquire(blocking=False)``),
    tasklock.asyncio.Semaphore (limit 5, reused and made per cycle), redis-py's asyncio Lock, and
    pottery's AIORedlock with one master. Rounds interleave the variants so that machine
    noise hits them all alike; reported are the median and best microseconds per cycle, the CPU
    microseconds per cycle in this process, ratios, and the paired ratios to the floor (the
    median over rounds of a variant's time / the floor's in the same round). Targets: tasklock
    <= 1.1x the floor reused, a new object per cycle <= 1.0x (paired; issue 28), and faster
    than redis-py's asyncio Lock and than AIORedlock.
(b) Hand-off latency: a waiter task (same event loop, a client of its own) blocked in
    ``await lock.acquire()``; time from just before the holder's ``release()`` to the waiter's
    ``acquire()`` returning, p50/p95 for tasklock (woken by the release's PUBLISH), redis-py's
    asyncio Lock (polls every ``sleep=0.1`` s) and AIORedlock (retries after a random 0-0.2 s).
    The holder releases after a random pause, so a polling waiter is caught at a random point of
    its sleep. Target: p50 <= 1 ms.
(c) Redlock cycle over 5 masters: tasklock.asyncio.Redlock (explicit timeout, and by default)
    against pottery's AIORedlock on the same five servers and the single-node floor; then the
    anatomy of one fan-out (a PING to 5 masters with ``asyncio.gather``, and one after another).
    Target: tasklock's rate >= 3x AIORedlock's.

Every part runs on one event loop: asyncio's own, or uvloop's with ``--uvloop``. While
``tasklock.asyncio`` (or its ``Redlock``) cannot be imported, its variants are left out with a
printed message and the baselines still run.

    python tests/benchmarks/bench_asyncio.py [--cycles 500] [--rounds 21] [--handoffs 200]
        [--redlock-cycles 200] [--parts abc] [--uvloop] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis.asyncio as aioredis  # noqa: E402
from pottery import AIORedlock  # noqa: E402

from tasklock.core.keys import wake_channel  # noqa: E402
from tests.benchmarks.interleave import paired_ratio, print_ratios  # noqa: E402
from tests.support.servers import start_servers  # noqa: E402

try:
    from tasklock.asyncio import Lock as AsyncLock
    from tasklock.asyncio import Semaphore as AsyncSemaphore
except ImportError as exc:  # not written yet: the baselines still run
    AsyncLock = AsyncSemaphore = None  # type: ignore[assignment,misc]
    LOCK_MISSING = f"tasklock.asyncio.Lock cannot be imported ({exc})"
else:
    LOCK_MISSING = ""
try:
    from tasklock.asyncio import Redlock as AsyncRedlock
except ImportError as exc:
    AsyncRedlock = None  # type: ignore[assignment,misc]
    REDLOCK_MISSING = f"tasklock.asyncio.Redlock cannot be imported ({exc})"
else:
    REDLOCK_MISSING = ""

AsyncRun = Callable[[], Awaitable[None]]

TTL = 10
FLOOR = "floor: SET NX PX + DEL"
EXPLICIT = "tasklock.asyncio.Lock(timeout=10)"
DEFAULT = "tasklock.asyncio.Lock() watchdog"
REDIS_PY = "redis.asyncio Lock(timeout=10)"
POTTERY = "pottery AIORedlock, 1 master"
FRESH = "tasklock.asyncio.Lock(timeout=10) per cycle"
FRESH_NB = "... per cycle, acquire(blocking=False)"
SEMAPHORE = "tasklock.asyncio.Semaphore(5, timeout=10)"
FRESH_SEMAPHORE = "tasklock.asyncio.Semaphore(5, ...) per cycle"
RL_FLOOR = "floor: SET NX PX + DEL, 1 node"
RL_EXPLICIT = "tasklock.asyncio.Redlock(timeout=10)"
RL_DEFAULT = "tasklock.asyncio.Redlock() watchdog"
RL_POTTERY = "pottery AIORedlock, 5 masters"
WIDTH = 44  # the variant column


def client_for(port: int) -> aioredis.Redis:
    return aioredis.Redis(host="127.0.0.1", port=port)


# -- timing: interleave.measure for coroutines ----------------------------------------------------


def lock_cycle(lock: Any) -> AsyncRun:
    """One uncontended ``await acquire()`` + ``await release()`` of ``lock`` (any library's)."""
    acquire, release = lock.acquire, lock.release

    async def run() -> None:
        assert await acquire()
        await release()

    return run


def fresh_cycle(make: Callable[[], Any]) -> AsyncRun:
    """A lock object made, acquired and released per cycle, as ``async with make():`` does."""

    async def run() -> None:
        async with make():
            pass

    return run


def fresh_try_cycle(make: Callable[[], Any]) -> AsyncRun:
    """A lock object made per cycle, tried once (``acquire(blocking=False)``) and released."""

    async def run() -> None:
        lock = make()
        assert await lock.acquire(blocking=False)
        await lock.release()

    return run


async def measure(
    variants: Mapping[str, AsyncRun],
    counts: Mapping[str, int],
    rounds: int,
    warmup: Mapping[str, int],
    *,
    samples: dict[str, list[float]] | None = None,
) -> dict[str, dict[str, float]]:
    """As :func:`tests.benchmarks.interleave.measure`, each call awaited on the running loop."""
    for name, run in variants.items():  # warm up: connections, script loads, caches
        for _ in range(warmup[name]):
            await run()
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            run, count = variants[name], counts[name]
            gc.collect()
            cpu_start, start = time.process_time_ns(), time.perf_counter_ns()
            for _ in range(count):
                await run()
            wall[name].append((time.perf_counter_ns() - start) / count / 1000)
            cpu[name].append((time.process_time_ns() - cpu_start) / count / 1000)
    if samples is not None:
        samples.update(wall)
    return {
        name: {
            "median": statistics.median(wall[name]),
            "best": min(wall[name]),
            "cpu": statistics.median(cpu[name]),
        }
        for name in variants
    }


# -- (a) cycle ------------------------------------------------------------------------------------


def cycle_variants(r: aioredis.Redis) -> dict[str, AsyncRun]:
    token = uuid.uuid4().hex

    async def floor() -> None:
        await r.set("bench:floor", token, nx=True, px=TTL * 1000)
        await r.delete("bench:floor")

    variants: dict[str, AsyncRun] = {FLOOR: floor}
    if AsyncLock is not None:
        variants[EXPLICIT] = lock_cycle(AsyncLock(r, "bench:explicit", timeout=TTL))
        variants[DEFAULT] = lock_cycle(AsyncLock(r, "bench:default"))
        variants[FRESH] = fresh_cycle(lambda: AsyncLock(r, "bench:fresh", timeout=TTL))
        variants[FRESH_NB] = fresh_try_cycle(lambda: AsyncLock(r, "bench:fresh-nb", timeout=TTL))
        semaphore = AsyncSemaphore(r, "bench:semaphore", 5, timeout=TTL)
        variants[SEMAPHORE] = lock_cycle(semaphore)
        variants[FRESH_SEMAPHORE] = fresh_cycle(
            lambda: AsyncSemaphore(r, "bench:fresh-semaphore", 5, timeout=TTL)
        )
    variants[REDIS_PY] = lock_cycle(r.lock("bench:redis-py", timeout=TTL))
    pottery = AIORedlock(key="bench:pottery", masters={r}, auto_release_time=TTL)
    variants[POTTERY] = lock_cycle(pottery)
    return variants


async def bench_cycle(port: int, cycles: int, rounds: int) -> dict[str, dict[str, float]]:
    """Per variant: median/best wall-clock and median CPU microseconds per cycle."""
    r = client_for(port)
    samples: dict[str, list[float]] = {}
    try:
        variants = cycle_variants(r)
        counts = dict.fromkeys(variants, cycles)
        results = await measure(
            variants, counts, rounds, dict.fromkeys(variants, 300), samples=samples
        )
    finally:
        await r.aclose()
    for name, us in results.items():
        us["paired_x_floor"] = paired_ratio(samples, name, FLOOR)
    return results


# -- (b) hand-off ---------------------------------------------------------------------------------

HANDOFF_KINDS = ("tasklock", "redis.asyncio", "pottery AIORedlock")


def make_lock(kind: str, r: aioredis.Redis, name: str) -> Any:
    if kind == "tasklock":
        assert AsyncLock is not None
        return AsyncLock(r, name, timeout=TTL)
    if kind == "redis.asyncio":
        return r.lock(name, timeout=TTL, sleep=0.1)
    return AIORedlock(key=name, masters={r}, auto_release_time=TTL)


async def waiter_task(
    kind: str, port: int, name: str, orders: asyncio.Queue[str], answers: asyncio.Queue[Any]
) -> None:
    """Block on the lock whenever told; report when it was acquired."""
    r = client_for(port)
    lock = make_lock(kind, r, name)
    try:
        while await orders.get() == "wait":
            answers.put_nowait("waiting")
            assert await lock.acquire()
            acquired_at = time.monotonic()
            await lock.release()
            answers.put_nowait(acquired_at)
    finally:
        await r.aclose()


async def bench_handoff(port: int, kind: str, handoffs: int) -> list[float]:
    r = client_for(port)
    name = f"bench:handoff:{kind}"
    holder = make_lock(kind, r, name)
    orders: asyncio.Queue[str] = asyncio.Queue()
    answers: asyncio.Queue[Any] = asyncio.Queue()
    task = asyncio.create_task(waiter_task(kind, port, name, orders, answers))
    latencies: list[float] = []
    rng = random.Random(1)
    try:
        for _ in range(handoffs + 5):
            assert await holder.acquire()
            orders.put_nowait("wait")
            assert await answers.get() == "waiting"
            if kind == "tasklock":  # the waiter is asleep once it subscribed and tried twice
                deadline = time.monotonic() + 5
                channel = wake_channel(name).encode()
                while dict(await r.pubsub_numsub(channel)).get(channel, 0) < 1:
                    assert time.monotonic() < deadline, "the waiter never subscribed"
                    await asyncio.sleep(0.0005)
            await asyncio.sleep(0.02 + rng.random() * 0.03)  # a random point of a poller's sleep
            released_at = time.monotonic()
            await holder.release()
            acquired_at = await asyncio.wait_for(answers.get(), 10)
            latencies.append((acquired_at - released_at) * 1000)
        orders.put_nowait("stop")
        await asyncio.wait_for(task, 10)
    finally:
        if not task.done():
            task.cancel()
        await r.aclose()
    return latencies[5:]  # the first hand-offs include the waiter's connection set-up


async def contend_round(r: aioredis.Redis, name: str, tasks: int = 3) -> float:
    """One round of ``tasks`` tasks that each hold ``name`` for 5 ms: its duration in ms."""
    assert AsyncLock is not None

    async def one() -> None:
        async with AsyncLock(r, name, timeout=TTL):
            await asyncio.sleep(0.005)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(tasks)))
    return (time.perf_counter() - started) * 1000


async def bench_after_idle(port: int, repeats: int, idle: float) -> dict[str, list[float]]:
    """Contention right after an idle spell (the wake-up listener closed its connection, so the
    first waiters open a new one), against the same round warm, ``repeats`` times."""
    r = client_for(port)
    found: dict[str, list[float]] = {"after idle": [], "warm": []}
    try:
        await contend_round(r, "bench:idle")  # the client's own connections, made
        for _ in range(repeats):
            await asyncio.sleep(idle)
            found["after idle"].append(await contend_round(r, "bench:idle"))
            found["warm"].append(await contend_round(r, "bench:idle"))
    finally:
        await r.aclose()
    return found


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# -- (c) Redlock over 5 masters -------------------------------------------------------------------


def redlock_variants(clients: list[aioredis.Redis]) -> dict[str, AsyncRun]:
    token = uuid.uuid4().hex
    first = clients[0]

    async def floor() -> None:
        await first.set("bench:rl:floor", token, nx=True, px=TTL * 1000)
        await first.delete("bench:rl:floor")

    variants: dict[str, AsyncRun] = {RL_FLOOR: floor}
    if AsyncRedlock is not None:
        variants[RL_EXPLICIT] = lock_cycle(AsyncRedlock(clients, "bench:rl:explicit", timeout=TTL))
        variants[RL_DEFAULT] = lock_cycle(AsyncRedlock(clients, "bench:rl:default"))
    pottery = AIORedlock(key="bench:rl:pottery", masters=set(clients), auto_release_time=TTL)
    variants[RL_POTTERY] = lock_cycle(pottery)
    return variants


def anatomy_variants(clients: list[aioredis.Redis]) -> dict[str, AsyncRun]:
    async def one() -> None:
        await clients[0].ping()

    async def gathered() -> None:
        await asyncio.gather(*(client.ping() for client in clients))

    async def sequential() -> None:
        for client in clients:
            await client.ping()

    return {
        "1 PING, 1 node (one round trip)": one,
        "5 PINGs: asyncio.gather": gathered,
        "5 PINGs: one after another": sequential,
    }


async def bench_redlock(
    ports: list[int], cycles: int, rounds: int
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    clients = [client_for(port) for port in ports]
    try:
        variants = redlock_variants(clients)
        # pottery is far slower: fewer cycles per round, same number of rounds.
        counts = dict.fromkeys(variants, cycles)
        counts[RL_POTTERY] = max(10, cycles // 8)
        warmup = {name: max(20, count // 2) for name, count in counts.items()}
        cycle = await measure(variants, counts, rounds, warmup)
        anatomy_ = anatomy_variants(clients)
        anatomy = await measure(
            anatomy_, dict.fromkeys(anatomy_, cycles), 7, dict.fromkeys(anatomy_, cycles // 2)
        )
    finally:
        for client in clients:
            await client.aclose()
    return cycle, anatomy


# -- report ---------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, ports: list[int]) -> tuple[dict[str, Any], dict[str, bool]]:
    results: dict[str, Any] = {"loop": type(asyncio.get_running_loop()).__module__}
    checks: dict[str, bool] = {}
    print(f"event loop: {type(asyncio.get_running_loop()).__module__}")
    for missing in (LOCK_MISSING, REDLOCK_MISSING):
        if missing:
            print(f"SKIPPED: {missing}; its variants are left out")

    if "a" in args.parts:
        cycle = await bench_cycle(ports[0], args.cycles, args.rounds)
        title = f"(a) acquire + release cycle: {args.rounds} interleaved rounds of {args.cycles}"
        print_ratios(title, cycle, FLOOR, "x floor", WIDTH)
        results["cycle_us"] = cycle
        print("\n    paired ratios (median over rounds of this round's time / the floor's)")
        for name, us in cycle.items():
            print(f"    {name:<{WIDTH}} {us['paired_x_floor']:6.2f}x")
        if EXPLICIT in cycle:
            ours = cycle[EXPLICIT]["median"]
            print("\n    ratios (medians)")
            print(f"    {'tasklock / floor':<{WIDTH}} {ours / cycle[FLOOR]['median']:6.2f}x")
            for other, label in ((REDIS_PY, "redis.asyncio Lock"), (POTTERY, "AIORedlock")):
                print(f"    {label + ' / tasklock':<{WIDTH}} {cycle[other]['median'] / ours:6.2f}x")
            slowest = max(cycle[EXPLICIT]["median"], cycle[DEFAULT]["median"])
            checks["cycle (timeout=10) <= 1.1x floor"] = ours / cycle[FLOOR]["median"] <= 1.1
            checks["cycle (default, watchdog) <= 1.1x floor"] = (
                cycle[DEFAULT]["median"] / cycle[FLOOR]["median"] <= 1.1
            )
            # Issue 28: a new object per cycle at the floor (paired ratios).
            for name, label in (
                (FRESH, "a new Lock per cycle (async with)"),
                (FRESH_NB, "a new Lock per cycle, acquire(blocking=False)"),
                (FRESH_SEMAPHORE, "a new Semaphore per cycle (async with)"),
            ):
                checks[f"{label} <= 1.0x floor (paired)"] = cycle[name]["paired_x_floor"] <= 1.0
            checks["faster than redis.asyncio Lock"] = slowest < cycle[REDIS_PY]["median"]
            checks["faster than AIORedlock (1 master)"] = slowest < cycle[POTTERY]["median"]

    if "b" in args.parts:
        print(f"\n(b) hand-off to a waiter task on the same loop, {args.handoffs} hand-offs")
        print(f"    {'library':<{WIDTH}} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9}")
        results["handoff_ms"] = {}
        for kind in HANDOFF_KINDS:
            if kind == "tasklock" and AsyncLock is None:
                print(f"    {kind:<{WIDTH}} skipped: {LOCK_MISSING}")
                continue
            n = args.handoffs if kind == "tasklock" else max(20, args.handoffs // 2)
            latencies = await bench_handoff(ports[0], kind, n)
            p50, p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
            print(f"    {kind:<{WIDTH}} {p50:9.2f} {p95:9.2f} {max(latencies):9.2f}")
            results["handoff_ms"][kind] = {"p50": p50, "p95": p95, "max": max(latencies)}
        if "tasklock" in results["handoff_ms"]:
            checks["hand-off p50 <= 1 ms"] = results["handoff_ms"]["tasklock"]["p50"] <= 1.0

    if "d" in args.parts and AsyncLock is not None:
        idle = 3.0  # past the listener's linger and its sweep: it has closed its connection
        print(
            f"\n(d) 3 tasks, 5 ms holds, one name: the first round after {idle:g} s idle "
            f"against a warm round, {args.idle_repeats} times"
        )
        rounds = await bench_after_idle(ports[0], args.idle_repeats, idle)
        for label, values in rounds.items():
            print(f"    {label:<{WIDTH}} median {statistics.median(values):7.1f} ms   "
                  f"max {max(values):7.1f} ms")  # fmt: skip
        ratio = statistics.median(rounds["after idle"]) / statistics.median(rounds["warm"])
        print(f"    {'after idle / warm':<{WIDTH}} {ratio:6.2f}x")
        results["after_idle_ms"] = rounds
        checks["first round after idle <= 2x a warm round"] = ratio <= 2.0

    if "c" in args.parts:
        cycle, anatomy = await bench_redlock(ports, args.redlock_cycles, args.rounds)
        print_ratios(
            f"(c) Redlock acquire + release over 5 masters: {args.rounds} interleaved rounds "
            "(base: the single-node floor)",
            cycle,
            RL_FLOOR,
            "x base",
            WIDTH,
        )
        print_ratios(
            "    anatomy: one fan-out to 5 masters (base: one round trip)",
            anatomy,
            "1 PING, 1 node (one round trip)",
            "x base",
            WIDTH,
        )
        results.update(redlock_cycle_us=cycle, redlock_anatomy_us=anatomy)
        pottery_us = cycle[RL_POTTERY]["median"]
        print("\n    rate against AIORedlock (its time per cycle / ours)")
        if AsyncRedlock is None:
            print(f"    skipped: {REDLOCK_MISSING}")
        for name in (RL_EXPLICIT, RL_DEFAULT):
            if name in cycle:
                ratio = pottery_us / cycle[name]["median"]
                print(f"    {name:<{WIDTH}} {ratio:6.2f}x")
                results.setdefault("x_pottery", {})[name] = ratio
                # Decided: >= 1.1x with two-round fencing (three rounds a cycle against two).
                checks[f"{name} >= 1.1x AIORedlock's rate"] = ratio >= 1.1
        against_floor = pottery_us / cycle[RL_FLOOR]["median"]
        print(f"    {'AIORedlock against the floor':<{WIDTH}} {against_floor:6.2f}x slower")
    return results, checks


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=500, help="lock cycles per round in (a)")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--handoffs", type=int, default=200)
    parser.add_argument(
        "--redlock-cycles", type=int, default=200, help="tasklock cycles per round in (c)"
    )
    parser.add_argument(
        "--idle-repeats", type=int, default=5, help="idle spells then contention in (d)"
    )
    parser.add_argument("--parts", default="abcd", help="which benchmarks to run (default: abcd)")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop's event loop")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    loop_factory = None
    if args.uvloop:
        import uvloop

        loop_factory = uvloop.new_event_loop
    with start_servers(5 if "c" in args.parts else 1) as servers:
        ports = [server.port for server in servers]
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            results, checks = runner.run(run(args, ports))

    print("\ntargets")
    for label, ok in checks.items():
        print(f"    {'met ' if ok else 'MISS'}  {label}")
    if LOCK_MISSING or REDLOCK_MISSING:
        print("    (some targets not checked: tasklock.asyncio is incomplete)")
    results["targets"] = checks
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
