"""End-to-end Celery throughput: a plain task, tasklock's singleton task, celery-singleton and
celery-once, side by side in one run, against one real redis-server (broker, results and locks).

Two floors show what any execution lock costs at least: taking it before the body and releasing it
after are two round trips to Redis that the worker must wait for. "plain + 2 redis-py round trips"
is a plain task whose body makes them with redis-py (two PINGs); "plain + 2 socket round trips"
makes them on a socket held open, with no client library at all: no lock that takes and releases
in the worker can be faster than that row, however it is written.

For each variant and round: enqueue N distinct calls into the variant's own queue while no worker
consumes it (timed: the producer's cost), then tell one worker subprocess (``--pool solo``, or
``--pool prefork`` with one child) to consume that queue and time until the last result is
stored (the worker's cost). The worker is the same process for every variant; rounds rotate the
order so that no variant always runs first. Reported: the median rate of each phase, end to end
(N / (enqueue + drain)), the ratio to the plain task, the worker's CPU per call (with its pool's
children), and tasklock's singleton against the floor task: targets >= 0.95x its rate, and at
most 40 us of worker CPU per call beyond its CPU.

    python tests/benchmarks/bench_celery.py [--n 2000] [--rounds 5] [--pool solo|prefork]

The script is also the worker's app module (``celery -A tests.benchmarks.bench_celery worker``),
configured from ``BENCH_REDIS_URL``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery
from celery_once import QueueOnce
from celery_singleton import Singleton

from tasklock.celery import singleton_task
from tasklock.compat.celery_once import QueueOnce as QueueOnceDropIn
from tasklock.compat.celery_singleton import Singleton as SingletonDropIn
from tasklock.core.connection import client_for_url

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.floors import two_socket_pings  # noqa: E402


def _python_path() -> str:
    """The worker's PYTHONPATH: this checkout first (the app module lives in it), then the
    caller's (another source tree of tasklock to compare, or packages installed to the side)."""
    return os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))


URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0")

app = Celery("bench_celery", broker=URL, backend=URL, set_as_current=False)
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    singleton_backend_url=URL,
    ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": URL}},
    task_default_queue="bench_idle",
)


@app.task(name="bench.plain")
def plain(i: int) -> int:
    return i


@app.task(name="bench.floor")
def floor(i: int) -> int:
    """A plain task plus two bare Redis round trips: what any execution lock costs at least."""
    client = client_for_url(URL)
    client.ping()
    client.ping()
    return i


@app.task(name="bench.floor_socket")
def floor_socket(i: int) -> int:
    """A plain task plus two bare round trips on a held socket: no client library's cost."""
    two_socket_pings(client_for_url(URL).connection_pool.connection_kwargs)
    return i


@singleton_task(app=app, name="bench.tasklock")
def locked(i: int) -> int:
    return i


@singleton_task(app=app, name="bench.tasklock_dedupe", dedupe_enqueue=True)
def locked_dedupe(i: int) -> int:
    return i


@app.task(name="bench.celery_singleton", base=Singleton)
def celery_singleton(i: int) -> int:
    return i


@app.task(name="bench.celery_once", base=QueueOnce)
def celery_once(i: int) -> int:
    return i


@app.task(name="bench.celery_singleton_drop_in", base=SingletonDropIn)
def celery_singleton_drop_in(i: int) -> int:
    return i


@app.task(name="bench.celery_once_drop_in", base=QueueOnceDropIn)
def celery_once_drop_in(i: int) -> int:
    return i


VARIANTS: dict[str, Any] = {
    "plain task": plain,
    "plain + 2 socket round trips": floor_socket,
    "plain + 2 redis-py round trips": floor,
    "tasklock singleton": locked,
    "tasklock + dedupe_enqueue": locked_dedupe,
    "celery-singleton": celery_singleton,
    "celery-once": celery_once,
    "tasklock celery-singleton drop-in": celery_singleton_drop_in,
    "tasklock celery-once drop-in": celery_once_drop_in,
}


def _queue(name: str) -> str:
    return "bench_" + "".join(c if c.isalnum() else "_" for c in name)


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a worker (all its threads) and of its pool's child processes
    (prefork), from /proc."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # (a process that ended while we looked)
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):  # the worker, or its child
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def one_round(
    name: str, task: Any, n: int, worker: str, offset: int, pid: int
) -> tuple[float, float, float]:
    """(enqueue seconds, drain seconds, worker CPU seconds during the drain)."""
    queue = _queue(name)
    t0 = time.perf_counter()
    results = [task.apply_async((offset + i,), queue=queue) for i in range(n)]
    enqueue = time.perf_counter() - t0
    cpu = _cpu_seconds(pid)
    t1 = time.perf_counter()
    app.control.add_consumer(queue, destination=[worker], reply=True, timeout=10)
    # The solo worker takes one queue's messages in order; the last result is the last done.
    results[-1].get(timeout=600)
    drain = time.perf_counter() - t1
    cpu = _cpu_seconds(pid) - cpu
    app.control.cancel_consumer(queue, destination=[worker], reply=True, timeout=10)
    failed = [r.id for r in results if r.state != "SUCCESS"]
    if failed:
        raise RuntimeError(f"{name}: {len(failed)} of {n} calls did not succeed")
    return enqueue, drain, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="calls per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--pool", choices=("solo", "prefork"), default="solo", help="the worker's pool"
    )
    parser.add_argument("--json", help="also write the results to this file (docs/plots.py)")
    parser.add_argument(
        "--only",
        help="comma-separated variants to time (default: all); the plain task is always timed",
    )
    options = parser.parse_args()
    chosen = _chosen(options.only)

    sys.path.insert(0, str(ROOT))
    from tests.support.servers import start_servers

    with start_servers(1) as (server,):
        env = {
            **os.environ,
            "BENCH_REDIS_URL": server.url,
            "PYTHONPATH": _python_path(),
        }
        app.conf.update(
            broker_url=server.url, result_backend=server.url, singleton_backend_url=server.url
        )
        app.conf.ONCE = {"backend": "celery_once.backends.Redis", "settings": {"url": server.url}}
        hostname = f"bench-{os.getpid()}@localhost"
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.benchmarks.bench_celery", "worker",
             f"--pool={options.pool}", "-c", "1", "-Q", "bench_idle", "-n", hostname,
             "-l", "warning", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            env=env, cwd=ROOT,
        )  # fmt: skip
        try:
            _wait(lambda: bool(app.control.ping([hostname], timeout=0.5)), 60, "the worker")
            # Warm up every variant (imports, script loading, connections) before measuring.
            for offset, (name, task) in enumerate(VARIANTS.items()):
                if name in chosen:
                    one_round(name, task, 50, hostname, 10_000_000 * (offset + 1), worker.pid)
            timings: dict[str, list[tuple[float, float, float]]] = {name: [] for name in chosen}
            names = list(chosen)
            for round_no in range(options.rounds):
                order = names[round_no % len(names) :] + names[: round_no % len(names)]
                for name in order:
                    timings[name].append(
                        one_round(
                            name, VARIANTS[name], options.n, hostname, round_no * options.n,
                            worker.pid,
                        )
                    )  # fmt: skip
        finally:
            worker.terminate()
            worker.wait(30)

    n = options.n
    rows = []
    for name, runs in timings.items():
        enqueue = statistics.median(n / e for e, _, _ in runs)
        drain = statistics.median(n / d for _, d, _ in runs)
        total = statistics.median(n / (e + d) for e, d, _ in runs)
        cpu = statistics.median(c / n * 1e6 for _, _, c in runs)
        rows.append((name, enqueue, drain, total, cpu))
    base = rows[0]
    print(
        f"\nCelery end-to-end throughput, {n} distinct calls x {options.rounds} rounds, "
        f"one {options.pool} worker, Redis broker + results (median rates, calls/s; ratio to "
        "plain; worker CPU per call while draining)\n"
    )
    print(
        f"{'variant':28} {'enqueue':>16} {'drain (worker)':>18} {'end to end':>18} "
        f"{'worker CPU/call':>16}"
    )
    for name, enqueue, drain, total, cpu in rows:
        print(
            f"{name:28} {enqueue:9.0f} {enqueue / base[1]:5.2f}x "
            f"{drain:11.0f} {drain / base[2]:5.2f}x {total:11.0f} {total / base[3]:5.2f}x "
            f"{cpu:10.0f} us"
        )
    if {OURS, FLOOR_TASK, SOCKET_FLOOR} <= set(timings):
        report_targets(rows, timings, n)
    report_against_originals(timings)
    if options.json:
        Path(options.json).write_text(
            json.dumps(
                {
                    "n": n,
                    "rounds": options.rounds,
                    "variants": {
                        name: {
                            "enqueue_per_s": enqueue,
                            "drain_per_s": drain,
                            "end_to_end_per_s": total,
                            "worker_cpu_us_per_call": cpu,
                            "drain_x_plain": drain / base[2],
                            "end_to_end_x_plain": total / base[3],
                        }
                        for name, enqueue, drain, total, cpu in rows
                    },
                },
                indent=2,
            )
        )


FLOOR_TASK = "plain + 2 redis-py round trips"
SOCKET_FLOOR = "plain + 2 socket round trips"
OURS = "tasklock singleton"


def _chosen(only: str | None) -> list[str]:
    """The variants to time, in VARIANTS' order: all, or the plain task and those named."""
    if not only:
        return list(VARIANTS)
    named = {name.strip() for name in only.split(",")}
    unknown = named - set(VARIANTS)
    if unknown:
        raise SystemExit(f"--only: no variant {sorted(unknown)}; variants: {list(VARIANTS)}")
    return [name for name in VARIANTS if name in named or name == "plain task"]


def report_targets(
    rows: list[tuple[str, float, float, float, float]],
    timings: dict[str, list[tuple[float, float, float]]],
    n: int,
) -> None:
    """tasklock's singleton against the floor task (the same two round trips, made by the body
    with redis-py), and the worker CPU per call it adds: beyond that task's, and beyond the
    socket floor's (two round trips and no client library: what is left is tasklock's own
    work, its key, token, scripts, watchdog, counts and logging, and its replies' parsing).

    Paired per round (the two variants ran one after the other in it), median and range over
    the rounds: the machine's drift between rounds is larger than what is measured here."""
    by_name = {name: row for name, *row in rows}
    cpu, floor_cpu, socket_cpu = (by_name[name][3] for name in (OURS, FLOOR_TASK, SOCKET_FLOOR))
    ours, floor = timings[OURS], timings[FLOOR_TASK]
    drains = sorted(f[1] / o[1] for o, f in zip(ours, floor, strict=True))
    totals = sorted((f[0] + f[1]) / (o[0] + o[1]) for o, f in zip(ours, floor, strict=True))
    cpus = sorted((o[2] - f[2]) / n * 1e6 for o, f in zip(ours, floor, strict=True))
    print(f"\n{OURS} against the floor task ({FLOOR_TASK}), paired per round:")
    print(
        f"    drain {statistics.median(drains):.2f}x ({drains[0]:.2f}-{drains[-1]:.2f}), "
        f"end to end {statistics.median(totals):.2f}x ({totals[0]:.2f}-{totals[-1]:.2f})"
    )
    print(
        f"    worker CPU per call added: {statistics.median(cpus):.0f} us beyond the floor "
        f"task's ({cpus[0]:.0f} to {cpus[-1]:.0f}); medians of the rounds: "
        f"{cpu - floor_cpu:.0f} us beyond it, {cpu - socket_cpu:.0f} us beyond the socket floor's"
    )
    print("targets (paired medians)")
    for label, ok in (
        ("drain >= 0.95x the floor task", statistics.median(drains) >= 0.95),
        ("end to end >= 0.95x the floor task", statistics.median(totals) >= 0.95),
        ("CPU per call beyond the floor task's <= 40 us", statistics.median(cpus) <= 40),
    ):
        print(f"    {'met ' if ok else 'MISS'}  {label}")


ORIGINALS = ("celery-once", "celery-singleton")
#: tasklock's variants judged against the originals end to end (issue 39: >= 1.0x each).
AGAINST_ORIGINALS = (
    OURS,
    "tasklock + dedupe_enqueue",
    "tasklock celery-singleton drop-in",
    "tasklock celery-once drop-in",
)


def report_against_originals(timings: dict[str, list[tuple[float, float, float]]]) -> None:
    """Each of tasklock's variants end to end (enqueue + drain) against each original, paired
    per round: median and range over the rounds. Target: >= 1.0x each."""
    originals = [name for name in ORIGINALS if name in timings]
    ours = [name for name in AGAINST_ORIGINALS if name in timings]
    if not originals or not ours:
        return
    print("\nend to end against the originals, paired per round (target >= 1.00x each):")
    for name in ours:
        cells = []
        for original in originals:
            ratios = sorted(
                (o[0] + o[1]) / (t[0] + t[1])
                for t, o in zip(timings[name], timings[original], strict=True)
            )
            median = statistics.median(ratios)
            mark = "" if median >= 1.0 else " MISS"
            cells.append(f"{median:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) vs {original}{mark}")
        print(f"    {name:34} " + ";  ".join(cells))


if __name__ == "__main__":
    main()
