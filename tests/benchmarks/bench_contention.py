"""Contention on one key (issue 13), side by side in one run against one real redis-server.

Waiters 1, 4, 16, 64 and 256 on one key, as processes x threads (1x1, 1x4, 2x8, 8x8, 32x8; the
processes are spawned once and reused for every point), each thread with a lock object of its
own, looping acquire / hold 2 ms (a sleep) / release. Per point and library: a warm-up, then a
fixed measured window (``--seconds``); the acquire calls still blocked when the window ends
finish (the drain), and no new one starts. Compared, in rotating order at each point:
tasklock.Lock() (the default), tasklock.Lock(fair=False) (only where the build has ``fair``),
redis-py's Lock (timeout=30; polls every ``sleep``, its default 0.1 s) and python-redis-lock
(expire=30; a release wakes one waiter through a BLPOP on a signal list).

Per point:

* acquisitions/s: holds that began in the window, over the window; and its ratio to the same
  library's 1-waiter point;
* Redis commands per acquisition: the server's ``INFO commandstats`` calls in the window (reset
  with ``CONFIG RESETSTAT`` as it opens; commands run by scripts count, and so do SUBSCRIBE and
  BLPOP; the benchmark's own INFO and CONFIG do not) over those acquisitions, and its ratio to the
  1-waiter point;
* wait (the acquire call to acquired, ``time.monotonic_ns`` around it) p50 and p99 of every
  acquire call that overlapped the window (begun in the warm-up or ending in the drain included,
  so a waiter starved for the whole window counts with its whole wait), against the fair share:
  waiters x the mean hold cycle (window / acquisitions), how long each waiter would wait if they
  were served round-robin; printed as p99 / fair share. Also the longest wait: the percentiles
  are over calls, and a starved waiter makes one call, so starvation shows in the max (and in
  the per-waiter spread) first;
* per waiter: the fewest and the most acquisitions of one waiter in the window (0 = starved);
* redis-server CPU (user + sys, ``INFO cpu``) over the window, in % of one core;
* overlaps: every hold is recorded as (start, end) with ``time.monotonic_ns`` (one clock for all
  processes); two holds that overlap mean the lock was not held, and fail the run.

Targets (issue 13), for tasklock.Lock(): at 64 waiters, commands per acquisition <= 2x the
1-waiter figure, throughput >= 0.9x the 1-waiter figure, p99 wait <= 3x the fair share; the same
at 256 waiters.

The machine's cores are shared by the waiters' processes and redis-server: a library whose
waiters burn CPU slows everyone, which is part of what is measured here. ``--quick`` (short
windows) is a smoke run that the figures should not be quoted from.

    python tests/benchmarks/bench_contention.py [--seconds 4] [--warmup 1] [--waiters 1,4,...]
        [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import multiprocessing
import os
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import redis_lock  # noqa: E402

import tasklock  # noqa: E402
from tests.support.servers import start_servers  # noqa: E402

HOLD = 0.002
TTL = 30
#: waiters -> (processes, threads per process)
LAYOUTS: dict[int, tuple[int, int]] = {1: (1, 1), 4: (1, 4), 16: (2, 8), 64: (8, 8), 256: (32, 8)}
DEFAULT = "tasklock.Lock()"
UNFAIR = "tasklock.Lock(fair=False)"
REDIS_PY = "redis-py Lock (sleep=0.1)"
PRL = "python-redis-lock"
WIDTH = 27
#: The benchmark's own commands, left out of the count.
OWN_COMMANDS = ("cmdstat_info", "cmdstat_config")


def has_fair() -> bool:
    """Whether this build's tasklock.Lock takes ``fair=`` (issue 13's FIFO waiting)."""
    return "fair" in inspect.signature(tasklock.Lock.__init__).parameters


def variants() -> list[str]:
    return [DEFAULT, *([UNFAIR] if has_fair() else []), REDIS_PY, PRL]


def make_lock(variant: str, r: redis.Redis, key: str) -> Any:
    if variant == DEFAULT:
        return tasklock.Lock(r, key)
    if variant == UNFAIR:
        return tasklock.Lock(r, key, fair=False)  # type: ignore[call-arg]
    if variant == REDIS_PY:
        return r.lock(key, timeout=TTL)  # sleep: its default, 0.1 s
    if variant == PRL:
        return redis_lock.Lock(r, key, expire=TTL)
    raise ValueError(variant)


# -- worker processes -----------------------------------------------------------------------------


def waiter_thread(
    variant: str,
    r: redis.Redis,
    key: str,
    go: threading.Event,
    times: dict[str, int],
    mine: list[tuple[int, int, int]],
    errors: list[str],
) -> None:
    """One waiter: from ``times["go"]``, acquire / hold / release until ``times["end"]``."""
    try:
        lock = make_lock(variant, r, key)
        go.wait()
        sleep_until(times["go"])
        end = times["end"]
        while True:
            called = time.monotonic_ns()
            if called >= end:
                break
            assert lock.acquire()
            acquired = time.monotonic_ns()
            time.sleep(HOLD)
            released = time.monotonic_ns()
            lock.release()
            mine.append((called, acquired, released))
    except BaseException as exc:  # reported to the parent, not lost in a thread
        errors.append(f"{variant}: {exc!r}")


def worker_process(port: int, conn: Connection) -> None:
    """Run points when told: ("setup", variant, key, threads), then ("go", t_go, t_end) in
    monotonic ns; answer "ready", then each thread's records (t_call, t_acquired, t_released)."""
    while True:
        message = conn.recv()
        if message is None:
            break
        _, variant, key, count = message
        r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)
        go = threading.Event()
        times: dict[str, int] = {}
        records: list[list[tuple[int, int, int]]] = [[] for _ in range(count)]
        errors: list[str] = []
        threads = [
            threading.Thread(
                target=waiter_thread,
                args=(variant, r, key, go, times, records[i], errors),
                daemon=True,
            )
            for i in range(count)
        ]
        for thread in threads:
            thread.start()
        conn.send("ready")
        _, times["go"], times["end"] = conn.recv()
        go.set()
        for thread in threads:
            thread.join(120)
        if any(thread.is_alive() for thread in threads):
            errors.append(f"{variant}: a thread was still blocked 120 s after the window")
        r.close()
        conn.send({"records": records, "errors": errors})


class Workers:
    """Spawned worker processes, reused for every point."""

    def __init__(self, port: int, count: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns: list[Connection] = []
        self.processes: list[Any] = []
        for _ in range(count):
            parent_end, child_end = ctx.Pipe()
            process = ctx.Process(target=worker_process, args=(port, child_end), daemon=True)
            process.start()
            self.conns.append(parent_end)
            self.processes.append(process)

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()


# -- one point ------------------------------------------------------------------------------------


def commandstats_calls(r: redis.Redis) -> dict[str, int]:
    """Calls per command since the last ``CONFIG RESETSTAT``, the benchmark's own left out."""
    stats = r.info("commandstats")
    return {
        key.removeprefix("cmdstat_"): int(value["calls"])
        for key, value in stats.items()
        if key not in OWN_COMMANDS
    }


def server_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def sleep_until(deadline_ns: int) -> None:
    pause = (deadline_ns - time.monotonic_ns()) / 1e9
    if pause > 0:
        time.sleep(pause)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def count_overlaps(holds: list[tuple[int, int]]) -> int:
    """Holds that began before an earlier-begun hold had ended."""
    overlaps, last_end = 0, 0
    for start, end in sorted(holds):
        if start < last_end:
            overlaps += 1
        last_end = max(last_end, end)
    return overlaps


def run_point(
    workers: Workers,
    admin: redis.Redis,
    variant: str,
    waiters: int,
    warmup: float,
    seconds: float,
) -> dict[str, Any]:
    processes, threads = LAYOUTS[waiters]
    slug = variant.split()[0].split("(")[0].replace(".", "-")
    key = f"bench:contention:{slug}:{'unfair' if variant == UNFAIR else 'x'}:{waiters}"
    conns = workers.conns[:processes]
    for conn in conns:
        conn.send(("setup", variant, key, threads))
    for conn in conns:
        assert conn.recv() == "ready"
    t_go = time.monotonic_ns() + 50_000_000
    t_measure = t_go + int(warmup * 1e9)
    t_end = t_measure + int(seconds * 1e9)
    for conn in conns:
        conn.send(("go", t_go, t_end))
    sleep_until(t_measure)
    admin.config_resetstat()
    opened = time.monotonic_ns()
    cpu_before = server_cpu(admin)
    sleep_until(t_end)
    by_command = commandstats_calls(admin)
    calls = sum(by_command.values())
    cpu = server_cpu(admin) - cpu_before
    closed = time.monotonic_ns()
    replies = [conn.recv() for conn in conns]
    drained = (time.monotonic_ns() - closed) / 1e9
    errors = [error for reply in replies for error in reply["errors"]]
    if errors:
        raise RuntimeError(f"{variant} at {waiters} waiters: {errors[0]}")
    records = [record for reply in replies for mine in reply["records"] for record in mine]
    window = (closed - opened) / 1e9
    acquired = sum(1 for _, got, _ in records if opened <= got < closed)
    # Every acquire call that overlapped the window, begun before it or ending in the drain: a
    # waiter starved for the whole window counts with its whole wait.
    waits = [
        (got - called) / 1e6 for called, got, _ in records if called < closed and got >= opened
    ]
    per_waiter = [
        sum(1 for _, got, _ in mine if opened <= got < closed)
        for reply in replies
        for mine in reply["records"]
    ]
    if not acquired or not waits:
        raise RuntimeError(f"{variant} at {waiters} waiters: no acquisition in the window")
    cycle_ms = window / acquired * 1000
    return {
        "waiters": waiters,
        "layout": f"{processes}x{threads}",
        "window_s": window,
        "acquisitions": acquired,
        "acquisitions_per_s": acquired / window,
        "commands": calls,
        "commands_per_acquisition": calls / acquired,
        "commands_by_name": by_command,
        # calls that ran a script: every tasklock call; the release of redis-py's and of
        # python-redis-lock's locks
        "scripts_per_acquisition": (by_command.get("evalsha", 0) + by_command.get("eval", 0))
        / acquired,
        "wait_ms_p50": percentile(waits, 0.5),
        "wait_ms_p99": percentile(waits, 0.99),
        "wait_ms_max": max(waits),
        "cycle_ms": cycle_ms,
        "fair_share_ms": waiters * cycle_ms,
        "p99_x_fair_share": percentile(waits, 0.99) / (waiters * cycle_ms),
        "redis_cpu_percent": cpu / window * 100,
        "per_waiter_min": min(per_waiter),
        "per_waiter_max": max(per_waiter),
        "drain_s": drained,
        "holds": len(records),
        "overlaps": count_overlaps([(got, released) for _, got, released in records]),
    }


# -- report ---------------------------------------------------------------------------------------


def print_header() -> None:
    print(
        f"    {'library':<{WIDTH}} {'acq/s':>7} {'x 1w':>5} {'cmd/acq':>8} {'x 1w':>6}"
        f" {'p50 ms':>8} {'p99 ms':>8} {'max ms':>7} {'fair ms':>8} {'p99/fair':>8}"
        f" {'redis cpu':>9}"
        f" {'per waiter':>11} {'overlaps':>8}"
    )


def print_row(variant: str, row: dict[str, Any], base: dict[str, Any]) -> None:
    spread = f"{row['per_waiter_min']}-{row['per_waiter_max']}"
    print(
        f"    {variant:<{WIDTH}} {row['acquisitions_per_s']:7.0f}"
        f" {row['acquisitions_per_s'] / base['acquisitions_per_s']:5.2f}"
        f" {row['commands_per_acquisition']:8.1f}"
        f" {row['commands_per_acquisition'] / base['commands_per_acquisition']:6.1f}"
        f" {row['wait_ms_p50']:8.2f} {row['wait_ms_p99']:8.1f} {row['wait_ms_max']:7.0f}"
        f" {row['fair_share_ms']:8.1f}"
        f" {row['p99_x_fair_share']:8.2f} {row['redis_cpu_percent']:8.0f}%"
        f" {spread:>11} {row['overlaps']:8d}",
        flush=True,
    )


def print_summary(results: dict[str, dict[int, dict[str, Any]]], points: list[int]) -> None:
    names = list(results)
    columns = "".join(f" {name[:WIDTH]:>{WIDTH}}" for name in names)
    for title, field in (
        ("acquisitions/s (x the 1-waiter point)", "acquisitions_per_s"),
        ("commands per acquisition (x the 1-waiter point)", "commands_per_acquisition"),
        ("p99 wait / fair share", "p99_x_fair_share"),
    ):
        print(f"\n    {title}")
        print(f"    {'waiters':>7}{columns}")
        for waiters in points:
            cells = []
            for name in names:
                row, base = results[name][waiters], results[name][points[0]]
                value = row[field]
                if field == "p99_x_fair_share":
                    cells.append(f"{value:.2f}")
                else:
                    shown = f"{value:.0f}" if field == "acquisitions_per_s" else f"{value:.1f}"
                    cells.append(f"{shown} ({value / base[field]:.2f}x)")
            print(f"    {waiters:>7}" + "".join(f" {cell:>{WIDTH}}" for cell in cells))


def target_checks(
    results: dict[str, dict[int, dict[str, Any]]], points: list[int]
) -> dict[str, bool]:
    checks: dict[str, bool] = {}
    ours, one = results[DEFAULT], results[DEFAULT][points[0]]
    for waiters in (64, 256):
        if waiters not in ours or points[0] != 1:
            continue
        row = ours[waiters]
        cmd_x = row["commands_per_acquisition"] / one["commands_per_acquisition"]
        rate_x = row["acquisitions_per_s"] / one["acquisitions_per_s"]
        fair_x = row["p99_x_fair_share"]
        checks[f"{waiters} waiters: commands/acquisition {cmd_x:.1f}x the 1-waiter (<= 2x)"] = (
            cmd_x <= 2.0
        )
        checks[f"{waiters} waiters: throughput {rate_x:.2f}x the 1-waiter (>= 0.9x)"] = (
            rate_x >= 0.9
        )
        caveat = ""
        if row["fair_share_ms"] > row["window_s"] * 500:  # waits are capped by the run's length
            caveat = (
                f" (but the fair share, {row['fair_share_ms'] / 1000:.1f} s, is over half the"
                f" {row['window_s']:.0f} s window: waits this long are cut short by the run)"
            )
        checks[f"{waiters} waiters: p99 wait {fair_x:.2f}x the fair share (<= 3x){caveat}"] = (
            fair_x <= 3.0
        )
    for name, rows in results.items():
        overlapped = sum(row["overlaps"] for row in rows.values())
        checks[f"{name}: no two holds overlapped ({overlapped} did)"] = overlapped == 0
    return checks


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured window per point")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up before each window")
    parser.add_argument("--waiters", default="1,4,16,64,256", help="points, from: 1,4,16,64,256")
    parser.add_argument("--quick", action="store_true", help="0.6 s windows, 0.2 s warm-up")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup = 0.6, 0.2
    points = [int(w) for w in args.waiters.split(",")]
    if any(w not in LAYOUTS for w in points):
        parser.error(f"--waiters: choose from {','.join(map(str, LAYOUTS))}")
    names = variants()
    print(f"tasklock from {Path(tasklock.__file__).parent}")
    if has_fair():
        default = inspect.signature(tasklock.Lock.__init__).parameters["fair"].default
        print(f"fair= available on this build; {DEFAULT} is fair={default!r}")
    else:
        print("fair= not available on this build: tasklock.Lock(fair=False) is not timed")
    print(
        f"(a) contention on one key: each waiter loops acquire / hold {HOLD * 1000:g} ms /"
        f" release; per point {args.warmup:g} s warm-up, {args.seconds:g} s measured;"
        f" x 1w = ratio to the same library's 1-waiter point"
    )
    results: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in names}
    started = time.monotonic()
    with start_servers(1) as (server,):
        workers = Workers(server.port, max(LAYOUTS[w][0] for w in points))
        admin = server.client(socket_timeout=30)
        try:
            for index, waiters in enumerate(points):
                processes, threads = LAYOUTS[waiters]
                print(f"\n    {waiters} waiter(s): {processes} process(es) x {threads} thread(s)")
                print_header()
                shift = index % len(names)
                order = names[shift:] + names[:shift]
                for name in order:
                    results[name][waiters] = run_point(
                        workers, admin, name, waiters, args.warmup, args.seconds
                    )
                for name in names:  # printed in the same order at every point
                    print_row(name, results[name][waiters], results[name][points[0]])
        finally:
            admin.close()
            workers.close()
    print_summary(results, points)
    checks = target_checks(results, points)
    print(f"\ntargets (issue 13, for {DEFAULT}; total {time.monotonic() - started:.0f} s)")
    for label, ok in checks.items():
        print(f"    {'met ' if ok else 'MISS'}  {label}")
    output = {
        "fair_available": has_fair(),
        "seconds": args.seconds,
        "warmup": args.warmup,
        "hold_ms": HOLD * 1000,
        "points": {
            name: {str(w): row for w, row in rows.items()} for name, rows in results.items()
        },
        "targets": checks,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(output, indent=2))
    overlapped = [
        name for name, rows in results.items() if any(r["overlaps"] for r in rows.values())
    ]
    if overlapped:
        print(f"\nFAILED: holds overlapped for {', '.join(overlapped)}", file=sys.stderr)
        sys.exit(1)
    return output


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
