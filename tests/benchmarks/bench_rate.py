"""Rate limit benchmarks, side by side in one run against one real redis-server.

(a) Latency of one rate-limit call, in two regimes: every call admitted (a limit of 100,000 per
    second, far above what one thread can ask for) and every call refused (1 per hour, its one
    call used up first). Against the floor of one bare round trip on the same client: redis-py's
    ``EVALSHA`` of a no-op script (``return {1, 0, 0}``) with the same key and arguments as
    tasklock's call. Also shown: the same no-op sent the way tasklock sends its scripts (a
    per-thread connection, no pool: see ``tasklock.core.lanes``), which leaves only the rate
    script's own cost and its Python around it; a prototype, timed here only, of what the general
    multi-limit script costs over a lean one-limit GCRA script with the same answers; and the
    Redis rate limiters that install beside tasklock: ``limits`` 5
    (its Redis storage, ``MovingWindowRateLimiter`` and ``SlidingWindowCounterRateLimiter``,
    ``hit()``) and pyrate-limiter 4 (a ``Limiter`` over its ``RedisBucket``, a sorted-set log of
    calls, and over a ``StateBucket`` with its GCRA on a ``RedisStateStore``; ``try_acquire(
    blocking=False)``). Every variant makes the same number of calls per round, rounds rotate the
    order; reported are the median, best and CPU microseconds per call, their ratios, and the
    paired ratios (the median over rounds of a variant's time / the other's in the same round),
    with tasklock's per-round ratios to the floor. Targets: ``try_acquire()`` <= 1.2x the floor
    (paired, calls admitted), and faster than each competitor (paired, both regimes).
(b) Server time per call: ``INFO commandstats`` after ``CONFIG RESETSTAT`` and a run of calls of
    one variant (the median of 3 runs): the server microseconds in its scripts per call (the usec
    of ``EVALSHA``, which include the commands the script runs) and how many commands its script
    runs per call. The same variants as (a), in the same two regimes.
(c) Accuracy: 4 processes x 2 threads hammer one key with ``try_acquire()`` at "200/s" for 3 s,
    with burst 1 (the default: calls spaced 5 ms apart) and burst 10; ``limits``' moving and
    sliding-window-counter limiters at 200 per second likewise. Each call's time on the server is
    bracketed by ``time.time()`` before it is sent and after its answer (one machine: the
    server's ``TIME`` and the clients' clock are the same clock, checked first). Reported per run:
    calls made, admitted, admitted / admissible, and the most admissions in any rolling 1 s
    window (half-open), three ways: of the brackets' midpoints (the estimate); of the calls whose
    whole bracket lies in the window (a lower bound of the true count: above the limit means the
    limit was broken, whatever the clocks did); of the calls whose bracket touches it (an upper
    bound, loose by the brackets' widths). Admissible: GCRA admits ``rate x span + burst`` over
    a span, and at most ``rate + burst - 1`` in a rolling period; ``limits``' windows admit at
    most ``limit`` in each period the span touches (``limit x ceil(span)``: its bursts of a whole
    limit at once count as admissible), and claim at most ``limit`` in a rolling period (the
    sliding window counter only approximates that). Targets for tasklock: the lower bound <=
    rate + burst - 1; the estimate at most one more (a midpoint is off by at most half its
    bracket, and most brackets are far shorter than the 5 ms between admissions: a call at a
    window's edge can be counted on the wrong side of it); admitted >= 95% of admissible.

A competitor that cannot be imported is left out with a printed reason; the rest still run.

    python tests/benchmarks/bench_rate.py [--calls 100] [--rounds 21] [--seconds 3]
        [--cost-calls 300] [--processes 4] [--threads 2] [--parts abc] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
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
from tasklock.core.rates import Admission  # noqa: E402
from tasklock.core.scripting import Script  # noqa: E402
from tests.benchmarks.interleave import (  # noqa: E402
    measure,
    paired_ratio,
    print_ratios,
    report_targets,
)
from tests.support.servers import HOST, start_servers  # noqa: E402

FLOOR = "floor: EVALSHA no-op (redis-py)"
NOOP = "no-op script, tasklock's send path"
TL = "tasklock RateLimit.try_acquire()"
LEAN = "proto: lean 1-limit Lua, args once"
MW = "limits MovingWindow hit()"
SWC = "limits SlidingWindowCounter hit()"
PYLOG = "pyrate-limiter RedisBucket (log)"
PYGCRA = "pyrate-limiter GCRA RedisStateStore"
WIDTH = 38
COMPETITORS = (MW, SWC, PYLOG, PYGCRA)
MISSING: dict[str, str] = {}

try:
    from limits import RateLimitItemPerHour, RateLimitItemPerSecond
    from limits.storage import RedisStorage
    from limits.strategies import MovingWindowRateLimiter, SlidingWindowCounterRateLimiter
except ImportError as exc:
    MISSING[MW] = MISSING[SWC] = f"limits cannot be imported ({exc})"
try:
    from pyrate_limiter import (
        GCRA,
        Duration,
        Limiter,
        Rate,
        RedisBucket,
        RedisStateStore,
        StateBucket,
    )
except ImportError as exc:
    MISSING[PYLOG] = MISSING[PYGCRA] = f"pyrate-limiter 4 cannot be imported ({exc})"

#: The two regimes of (a): a rate no single thread reaches (every call admitted), and one whose
#: only call is used up before the timing (every call refused).
REGIMES = {"admitted": (100_000, 1), "refused": (1, 3600)}

#: The no-op of the floors: one EVALSHA whose script does nothing but answer.
NOOP_SCRIPT = Script("bench-noop", "return {1, 0, 0}")

#: A prototype, timed here only: tasklock's GCRA for one limit without what several limits and
#: reservations need (no closure, no tables, no unpack; HGET for HMGET). The same answers as the
#: real script for one limit and no reservation. ARGV: max wait in us (-1: any), field, emission
#: interval in us, burst.
LEAN_SCRIPT = Script(
    "bench-lean-rate",
    """
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local max_wait = tonumber(ARGV[1])
local interval = tonumber(ARGV[3])
local burst = tonumber(ARGV[4])
local tat = tonumber(redis.call('HGET', KEYS[1], ARGV[2])) or now
if tat < now then tat = now end
local wait = tat + (1 - burst) * interval - now
if wait < 0 then wait = 0 end
if max_wait >= 0 and wait > max_wait then return {0, math.ceil(wait), 0} end
local new = tat + interval
redis.call('HSET', KEYS[1], ARGV[2], string.format('%.3f', new))
redis.call('PEXPIRE', KEYS[1], math.ceil((new - now) / 1000) + 1)
return {1, math.ceil(wait), math.floor((now + burst * interval - new) / interval)}
""",
)


def client_for(port: int) -> redis.Redis:
    return redis.Redis(host=HOST, port=port)


def rate_text(count: int, period: int) -> str:
    return f"{count}/s" if period == 1 else f"{count}/{period}s"


# -- (a) and (b): the variants --------------------------------------------------------------------


@contextlib.contextmanager
def regime_variants(
    r: redis.Redis, port: int, regime: str, notes: list[str]
) -> Iterator[tuple[dict[str, Callable[[], Any]], dict[str, bool | None]]]:
    """Each variant as a call that answers truthy when admitted, and what it must answer in this
    regime (None: a floor, which answers anything). Refused regime: every limit's one call is used
    up here, before the timing."""
    count, period = REGIMES[regime]
    expect = regime == "admitted"
    prefix = f"bench:rate:{regime}"
    closers: list[Callable[[], None]] = []
    variants: dict[str, Callable[[], Any]] = {}
    expected: dict[str, bool | None] = {}

    limiter = tasklock.RateLimit(r, f"{prefix}:tasklock", rate=rate_text(count, period))
    assert limiter.try_acquire(), f"{regime}: tasklock's first call was refused"
    # What try_acquire sends: no wait, no reservation, then the limits' arguments.
    keys, args = [limiter.name], [0, 0, 0, *limiter.plan.args]

    floor_sha = r.script_load(NOOP_SCRIPT.source)
    variants[FLOOR] = lambda: r.evalsha(floor_sha, len(keys), *keys, *args)
    variants[NOOP] = lambda: NOOP_SCRIPT(r, keys, args)
    variants[TL] = limiter.try_acquire
    if len(limiter.plan.args) == 3:
        lean_keys = [f"{prefix}:lean"]
        lean_args = [0, *limiter.plan.args]
        assert Admission.from_reply(LEAN_SCRIPT(r, lean_keys, lean_args))
        variants[LEAN] = lambda: Admission.from_reply(LEAN_SCRIPT(r, lean_keys, lean_args))

    if MW not in MISSING:
        storage = RedisStorage(f"redis://{HOST}:{port}", connection_pool=r.connection_pool)
        item = RateLimitItemPerSecond(count) if period == 1 else RateLimitItemPerHour(count)
        mw = MovingWindowRateLimiter(storage)
        swc = SlidingWindowCounterRateLimiter(storage)
        assert mw.hit(item, prefix, "mw")
        assert swc.hit(item, prefix, "swc")
        variants[MW] = lambda: mw.hit(item, prefix, "mw")
        variants[SWC] = lambda: swc.hit(item, prefix, "swc")
    if PYLOG not in MISSING:
        interval = Duration.SECOND if period == 1 else Duration.HOUR
        log_limiter = Limiter(RedisBucket.init([Rate(count, interval)], r, f"{prefix}:pyrate-log"))
        gcra_store = RedisStateStore(r, f"{prefix}:pyrate-gcra")
        gcra_limiter = Limiter(StateBucket([Rate(count, interval)], GCRA(), gcra_store))
        closers += [log_limiter.close, gcra_limiter.close]
        assert log_limiter.try_acquire("bench", blocking=False)
        assert gcra_limiter.try_acquire("bench", blocking=False)
        variants[PYLOG] = lambda: log_limiter.try_acquire("bench", blocking=False)
        variants[PYGCRA] = lambda: gcra_limiter.try_acquire("bench", blocking=False)

    for name in variants:
        expected[name] = None if name in (FLOOR, NOOP) else expect
    try:
        yield variants, expected
    finally:
        for close in closers:
            close()


def tallied(
    variants: dict[str, Callable[[], Any]], expected: dict[str, bool | None], wrong: dict[str, int]
) -> dict[str, Callable[[], None]]:
    """The variants as measure() runs them, each counting the answers its regime rules out (the
    same test of the answer for every variant, floors included)."""

    def wrap(name: str) -> Callable[[], None]:
        call, want = variants[name], expected[name]
        wrong[name] = 0

        def run() -> None:
            if bool(call()) is not want and want is not None:
                wrong[name] += 1

        return run

    return {name: wrap(name) for name in variants}


def server_cost(
    r: redis.Redis, variants: dict[str, Callable[[], Any]], calls: int, reps: int
) -> dict[str, dict[str, float]]:
    """Per variant, the median over ``reps`` runs of ``calls`` calls: server microseconds in
    EVALSHA per call, EVALSHAs per call, and the commands run inside them per call."""
    skip = {"cmdstat_evalsha", "cmdstat_config", "cmdstat_info", "cmdstat_script"}
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    for _ in range(reps):
        for name, call in variants.items():
            r.config_resetstat()
            for _ in range(calls):
                call()
            stats = r.info("commandstats")
            evalsha = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
            inner = sum(v["calls"] for k, v in stats.items() if k not in skip)
            runs[name].append((evalsha["usec"] / calls, evalsha["calls"] / calls, inner / calls))
    return {
        name: {
            "usec_per_call": statistics.median(run[0] for run in rows),
            "evalsha_per_call": statistics.median(run[1] for run in rows),
            "inner_per_call": statistics.median(run[2] for run in rows),
        }
        for name, rows in runs.items()
    }


def bench_regime(
    port: int, regime: str, calls: int, rounds: int, cost_calls: int, notes: list[str]
) -> dict[str, Any]:
    r = client_for(port)
    samples: dict[str, list[float]] = {}
    wrong: dict[str, int] = {}
    try:
        with regime_variants(r, port, regime, notes) as (variants, expected):
            runs = tallied(variants, expected, wrong)
            counts, warmup = dict.fromkeys(runs, calls), dict.fromkeys(runs, 100)
            results = measure(runs, counts, rounds, warmup, samples=samples)
            cost = server_cost(r, variants, cost_calls, 3) if cost_calls else {}
    finally:
        r.close()
    for name, us in results.items():
        us["paired_x_floor"] = paired_ratio(samples, name, FLOOR)
        us["paired_x_noop"] = paired_ratio(samples, name, NOOP)
        us["paired_x_tasklock"] = paired_ratio(samples, name, TL)
        us["wrong_answers"] = wrong[name]
    return {"latency": results, "samples": samples, "server": cost}


def report_regime(
    regime: str, out: dict[str, Any], calls: int, rounds: int, checks: dict[str, bool]
) -> None:
    count, period = REGIMES[regime]
    latency, samples = out["latency"], out["samples"]
    title = (
        f"(a) {regime}: every call {regime} (limit {rate_text(count, period)}), {rounds} "
        f"interleaved rounds of {calls} calls per variant"
    )
    print_ratios(title, latency, FLOOR, "x floor", WIDTH)
    print("\n    paired ratios (median over rounds of this round's time / the other's)")
    print(f"    {'variant':<{WIDTH}} {'x floor':>8} {'x no-op':>8} {'x tasklock':>11} {'wrong':>6}")
    for name, us in latency.items():
        print(
            f"    {name:<{WIDTH}} {us['paired_x_floor']:8.2f} {us['paired_x_noop']:8.2f}"
            f" {us['paired_x_tasklock']:11.2f} {us['wrong_answers']:6d}"
        )
    for base in (FLOOR, NOOP):
        ratios = [a / b for a, b in zip(samples[TL], samples[base], strict=True)]
        print(
            f"\n    try_acquire() / {base}, per round: median {statistics.median(ratios):.2f}, "
            f"range {min(ratios):.2f}-{max(ratios):.2f}\n      "
            + " ".join(f"{x:.2f}" for x in ratios)
        )
    wrong = {name: us["wrong_answers"] for name, us in latency.items() if us["wrong_answers"]}
    checks[f"(a) {regime}: every limiter answered as its regime requires"] = not wrong
    if wrong:
        print(f"    WRONG ANSWERS (the figures above are not comparable): {wrong}")
    if regime == "admitted":
        checks["(a) try_acquire() admitted <= 1.2x floor (paired)"] = (
            latency[TL]["paired_x_floor"] <= 1.2
        )
    for name in COMPETITORS:
        if name in latency:
            checks[f"(a) {regime}: faster than {name}"] = latency[name]["paired_x_tasklock"] > 1.0

    cost = out["server"]
    if cost:
        print(f"\n(b) {regime}: server time per call (INFO commandstats, median of 3 runs)")
        print(f"    {'variant':<{WIDTH}} {'server us':>9} {'EVALSHAs':>9} {'cmds inside':>12}")
        for name, row in cost.items():
            print(
                f"    {name:<{WIDTH}} {row['usec_per_call']:9.2f} {row['evalsha_per_call']:9.2f}"
                f" {row['inner_per_call']:12.2f}"
            )


# -- (c) accuracy ---------------------------------------------------------------------------------

ACCURACY_RATE = 200
#: (label, kind, burst)
ACCURACY_RUNS = [
    ("tasklock burst=1", "tasklock", 1),
    ("tasklock burst=10", "tasklock", 10),
    ("limits MovingWindow", "mw", 0),
    ("limits SlidingWindowCounter", "swc", 0),
]


def hammer_call(kind: str, r: redis.Redis, port: int, key: str, burst: int) -> Callable[[], Any]:
    if kind == "tasklock":
        return tasklock.RateLimit(r, key, rate=f"{ACCURACY_RATE}/s", burst=burst).try_acquire
    storage = RedisStorage(f"redis://{HOST}:{port}", connection_pool=r.connection_pool)
    item = RateLimitItemPerSecond(ACCURACY_RATE)
    strategy = MovingWindowRateLimiter if kind == "mw" else SlidingWindowCounterRateLimiter
    limiter = strategy(storage)
    return lambda: limiter.hit(item, key)


def hammer(
    call: Callable[[], Any],
    seconds: float,
    barrier: Any,
    r: redis.Redis,
    out: list[Any],
    index: int,
) -> None:
    """One hammering thread: from the moment every thread of every process has reached
    ``barrier``, call as fast as it can for ``seconds``; ``out[index]``: the (sent, answered)
    times of its admitted calls, how many calls it made, when it started and ended."""
    r.ping()  # this thread's pooled connection, before the start
    admitted: list[tuple[float, float]] = []
    attempts = 0
    barrier.wait(60)
    first = time.time()
    deadline = first + seconds
    last = first
    while True:
        sent = time.time()
        if sent >= deadline:
            break
        ok = call()
        last = time.time()
        attempts += 1
        if ok:
            admitted.append((sent, last))
    out[index] = (admitted, attempts, first, last)


def accuracy_worker(port: int, threads: int, barrier: Any, conn: Any) -> None:
    """One hammering process: for each task from ``conn``, ``threads`` threads of :func:`hammer`
    on one client; sends back what each recorded."""
    r = client_for(port)
    while True:
        task = conn.recv()
        if task is None:
            break
        kind, key, burst, seconds = task
        call = hammer_call(kind, r, port, key, burst)
        out: list[Any] = [None] * threads
        workers = [
            threading.Thread(target=hammer, args=(call, seconds, barrier, r, out, i))
            for i in range(threads)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        conn.send(out)
    r.close()


def most_in_window(points: list[float], period: float) -> int:
    """The most of ``points`` in any half-open window [a, a + period)."""
    points = sorted(points)
    best, j = 0, 0
    for i, start in enumerate(points):
        while j < len(points) and points[j] < start + period:
            j += 1
        best = max(best, j - i)
    return best


def bracket_bounds(brackets: list[tuple[float, float]], period: float) -> tuple[int, int]:
    """(lower, upper): the most calls whose whole bracket lies in one window [a, a + period),
    and the most whose bracket touches one. A window with the most of either kind can be moved
    to start at the earliest send (lower) or earliest answer (upper) among its calls."""
    lower = max(
        (sum(1 for s, e in brackets if s >= a and e < a + period) for a, _ in brackets), default=0
    )
    upper = max(
        (sum(1 for s, e in brackets if e >= a and s < a + period) for _, a in brackets), default=0
    )
    return lower, upper


def analyse(label: str, kind: str, burst: int, results: list[Any]) -> dict[str, Any]:
    brackets = [b for proc in results for thread in proc for b in thread[0]]
    attempts = sum(thread[1] for proc in results for thread in proc)
    span = max(t[3] for proc in results for t in proc) - min(t[2] for proc in results for t in proc)
    if kind == "tasklock":
        admissible = ACCURACY_RATE * span + burst
        bound = ACCURACY_RATE + burst - 1
    else:  # a window of `limit` per second: at most `limit` in each second the run touches
        admissible = ACCURACY_RATE * math.ceil(span)
        bound = ACCURACY_RATE
    widths = sorted(e - s for s, e in brackets)
    lower, upper = bracket_bounds(brackets, 1.0)
    return {
        "label": label,
        "kind": kind,
        "attempts": attempts,
        "calls_per_s": attempts / span,
        "span_s": span,
        "admitted": len(brackets),
        "admissible": admissible,
        "x_admissible": len(brackets) / admissible,
        "bound": bound,
        "most_estimate": most_in_window([(s + e) / 2 for s, e in brackets], 1.0),
        "most_lower": lower,
        "most_upper": upper,
        "bracket_p50_ms": statistics.median(widths) * 1000 if widths else 0.0,
        "bracket_p99_ms": widths[int(0.99 * (len(widths) - 1))] * 1000 if widths else 0.0,
        "bracket_max_ms": widths[-1] * 1000 if widths else 0.0,
    }


def clock_check(port: int) -> tuple[float, float]:
    """(server TIME minus the midpoint of the client's bracket around it, the bracket), both in
    microseconds, best of 20: the server's clock and time.time() are one clock when the offset is
    within half the bracket."""
    r = client_for(port)
    try:
        best: tuple[float, float] | None = None
        for _ in range(20):
            before = time.time()
            seconds, micros = r.time()
            after = time.time()
            offset = (seconds + micros / 1e6 - (before + after) / 2) * 1e6
            width = (after - before) * 1e6
            if best is None or width < best[1]:
                best = (offset, width)
        assert best is not None
        return best
    finally:
        r.close()


def bench_accuracy(port: int, seconds: float, processes: int, threads: int) -> list[dict[str, Any]]:
    runs = [run for run in ACCURACY_RUNS if run[1] == "tasklock" or MW not in MISSING]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes * threads)
    pipes = [context.Pipe() for _ in range(processes)]
    procs = [
        context.Process(target=accuracy_worker, args=(port, threads, barrier, child), daemon=True)
        for _, child in pipes
    ]
    for proc in procs:
        proc.start()
    out = []
    try:
        for index, (label, kind, burst) in enumerate(runs):
            key = f"bench:rate:accuracy:{index}:{kind}"
            for parent, _ in pipes:
                parent.send((kind, key, burst, seconds))
            results = [parent.recv() for parent, _ in pipes]
            out.append(analyse(label, kind, burst, results))
    finally:
        for parent, _ in pipes:
            with contextlib.suppress(OSError):
                parent.send(None)
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    return out


def report_accuracy(
    rows: list[dict[str, Any]], clock: tuple[float, float], args: Any, checks: dict[str, bool]
) -> None:
    print(
        f"\n(c) accuracy: {args.processes} processes x {args.threads} threads, one key, "
        f"{ACCURACY_RATE}/s, {args.seconds:g} s per limiter"
    )
    print(
        f"    clocks: server TIME - client midpoint = {clock[0]:+.0f} us, bracket {clock[1]:.0f} us"
        f" ({'one clock' if abs(clock[0]) <= clock[1] / 2 + 1 else 'CLOCKS DIFFER'})"
    )
    print(
        f"    {'limiter':<28} {'calls/s':>8} {'span s':>7} {'admitted':>8} {'admissible':>10}"
        f" {'x adm.':>7} {'max in 1 s: est':>15} {'lower':>6} {'upper':>6} {'bound':>6}"
        f" {'bracket ms p50/p99/max':>23}"
    )
    for row in rows:
        print(
            f"    {row['label']:<28} {row['calls_per_s']:8.0f} {row['span_s']:7.3f}"
            f" {row['admitted']:8d} {row['admissible']:10.1f} {row['x_admissible']:7.3f}"
            f" {row['most_estimate']:15d} {row['most_lower']:6d} {row['most_upper']:6d}"
            f" {row['bound']:6d}   {row['bracket_p50_ms']:5.2f}/{row['bracket_p99_ms']:5.2f}/"
            f"{row['bracket_max_ms']:6.2f}"
        )
        if row["kind"] == "tasklock":
            name = f"(c) {row['label']}"
            checks[f"{name}: never over {row['bound']} in a rolling 1 s (lower bound)"] = (
                row["most_lower"] <= row["bound"]
            )
            checks[f"{name}: estimate <= {row['bound'] + 1} in a rolling 1 s"] = (
                row["most_estimate"] <= row["bound"] + 1
            )
            checks[f"{name}: admitted >= 95% of admissible"] = row["x_admissible"] >= 0.95


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per variant per round in (a)")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--cost-calls", type=int, default=300, help="calls per variant in (b)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per limiter in (c)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="per process in (c)")
    parser.add_argument("--parts", default="abc", help="which benchmarks to run (default: abc)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    results: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    notes: list[str] = []
    for name, reason in MISSING.items():
        print(f"SKIPPED {name}: {reason}")
    load = os.getloadavg()
    print(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with start_servers(1) as (server,):
        if "a" in args.parts or "b" in args.parts:
            cost_calls = args.cost_calls if "b" in args.parts else 0
            for regime in REGIMES:
                began = time.perf_counter()
                out = bench_regime(server.port, regime, args.calls, args.rounds, cost_calls, notes)
                report_regime(regime, out, args.calls, args.rounds, checks)
                print(f"    ({regime}: {time.perf_counter() - began:.0f} s)")
                results[regime] = {"latency_us": out["latency"], "server": out["server"]}
        if "c" in args.parts:
            began = time.perf_counter()
            clock = clock_check(server.port)
            rows = bench_accuracy(server.port, args.seconds, args.processes, args.threads)
            report_accuracy(rows, clock, args, checks)
            print(f"    ({time.perf_counter() - began:.0f} s)")
            results["accuracy"] = rows
    for note in dict.fromkeys(notes):
        print(f"NOTE {note}")
    return report_targets(checks, results, started, args.json)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
