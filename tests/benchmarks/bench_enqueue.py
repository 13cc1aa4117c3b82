"""The enqueue side alone: how fast a producer sends deduplicated calls, against the libraries users
migrate from, side by side in one process and one run, on one real redis-server.

Variants: a plain ``delay()`` (no deduplication: the ceiling), tasklock's
``@singleton_task(dedupe_enqueue=True)``, tasklock's celery-once and celery-singleton drop-ins
(``tasklock.compat``), and the originals, celery-once's ``QueueOnce`` and celery-singleton's
``Singleton``. Each round enqueues N distinct calls of every variant into a queue that no worker
consumes (so every call claims a new marker and is sent), in an order that rotates per round;
the queues and markers are emptied between rounds. Rounds are short and many, so that the
machine's drift falls between rounds rather than between variants. The faster original is the
one with the higher median rate over the run; each tasklock variant is paired per round with it
(target: >= 1.0x). (Not "the faster of the two in each round": the minimum of two noisy times is
biased low, against whoever is compared with it.) The server's own counters say what each
variant costs it: connections opened and commands run per call.

    python tests/benchmarks/bench_enqueue.py [--n 400] [--rounds 15] [--protocol 2|3|default]

``--protocol`` is what the URLs ask for (``default``: nothing, redis-py's own choice: RESP3 from
redis-py 8 on); the broker (kombu) always takes the plain URL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery_once import QueueOnce as OriginalQueueOnce
from celery_singleton import Singleton as OriginalSingleton

from tasklock.celery import singleton_task
from tasklock.compat.celery_once import QueueOnce
from tasklock.compat.celery_singleton import Singleton

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PLAIN = "plain delay()"
DEDUPE = "tasklock dedupe_enqueue"
ONCE_DROP_IN = "tasklock celery-once drop-in"
SINGLETON_DROP_IN = "tasklock celery-singleton drop-in"
ONCE = "celery-once"
SINGLETON = "celery-singleton"
ORIGINALS = (ONCE, SINGLETON)
OURS = (DEDUPE, ONCE_DROP_IN, SINGLETON_DROP_IN)


def make_app(broker_url: str, lock_url: str) -> tuple[Celery, dict[str, Any]]:
    """The app and its variants: every task on ``lock_url`` for its markers."""
    app = Celery("bench_enqueue", broker=broker_url, backend=broker_url, set_as_current=False)
    app.conf.update(
        broker_connection_retry_on_startup=True,
        singleton_backend_url=lock_url,
        ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": lock_url}},
        task_default_queue="bench_enqueue_idle",
    )

    @app.task(name="enqueue.plain")
    def plain(i: int) -> int:
        return i

    @singleton_task(app=app, name="enqueue.dedupe", dedupe_enqueue=True, url=lock_url)
    def dedupe(i: int) -> int:
        return i

    @app.task(name="enqueue.once_drop_in", base=QueueOnce)
    def once_drop_in(i: int) -> int:
        return i

    @app.task(name="enqueue.singleton_drop_in", base=Singleton)
    def singleton_drop_in(i: int) -> int:
        return i

    @app.task(name="enqueue.once", base=OriginalQueueOnce)
    def once(i: int) -> int:
        return i

    @app.task(name="enqueue.singleton", base=OriginalSingleton)
    def singleton(i: int) -> int:
        return i

    variants = {
        PLAIN: plain,
        DEDUPE: dedupe,
        ONCE_DROP_IN: once_drop_in,
        SINGLETON_DROP_IN: singleton_drop_in,
        ONCE: once,
        SINGLETON: singleton,
    }
    return app, variants


def _queue(name: str) -> str:
    return "bench_enqueue_" + "".join(c if c.isalnum() else "_" for c in name)


def _counters(admin: redis.Redis) -> tuple[int, int]:
    """(connections received, commands run) by the server so far."""
    connections = int(admin.info("stats")["total_connections_received"])
    commands = sum(int(v["calls"]) for v in admin.info("commandstats").values())
    return connections, commands


def one_round(
    admin: redis.Redis, name: str, task: Any, n: int, offset: int
) -> tuple[float, int, int]:
    """(seconds to enqueue n distinct calls, connections opened, commands run)."""
    queue = _queue(name)
    before = _counters(admin)
    t0 = time.perf_counter()
    for i in range(offset, offset + n):
        task.apply_async((i,), queue=queue)
    seconds = time.perf_counter() - t0
    after = _counters(admin)
    return seconds, after[0] - before[0], after[1] - before[1] - 2  # (less the two INFOs)


def _empty(admin: redis.Redis) -> None:
    """Queues and markers of the round gone (nothing consumes them)."""
    admin.flushdb()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=400, help="calls per variant per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--protocol", choices=("2", "3", "default"), default="default")
    options = parser.parse_args()

    from tests.support.servers import start_servers

    with start_servers(1) as (server,):
        query = "" if options.protocol == "default" else f"?protocol={options.protocol}"
        _app, variants = make_app(server.url, server.url + query)
        admin = server.client(protocol=2)
        names = list(variants)
        for offset, name in enumerate(names):  # warm-up: imports, scripts, connections
            one_round(admin, name, variants[name], 200, 10_000_000 * (offset + 1))
        _empty(admin)
        timings: dict[str, list[tuple[float, int, int]]] = {name: [] for name in names}
        for round_no in range(options.rounds):
            order = names[round_no % len(names) :] + names[: round_no % len(names)]
            for name in order:
                timings[name].append(
                    one_round(admin, name, variants[name], options.n, round_no * options.n)
                )
            _empty(admin)
    report(timings, options.n, options.rounds, options.protocol)


def report(
    timings: dict[str, list[tuple[float, int, int]]], n: int, rounds: int, protocol: str
) -> None:
    print(
        f"\nEnqueue side, {n} distinct calls x {rounds} rounds, one process, protocol {protocol} "
        "(median rate; ratio to the plain delay(); the server's counters per call)\n"
    )
    plain = statistics.median(n / s for s, _, _ in timings[PLAIN])
    print(f"{'variant':34} {'calls/s':>9} {'x plain':>8} {'connections':>12} {'commands/call':>14}")
    for name, runs in timings.items():
        rate = statistics.median(n / s for s, _, _ in runs)
        connections = sum(c for _, c, _ in runs)
        commands = statistics.median(k / n for _, _, k in runs)
        print(f"{name:34} {rate:9.0f} {rate / plain:7.2f}x {connections:12d} {commands:14.2f}")
    faster = max(ORIGINALS, key=lambda name: statistics.median(n / s for s, _, _ in timings[name]))
    print(f"\nagainst the faster original ({faster}), paired per round:")
    for name in OURS:
        ratios = sorted(
            original[0] / ours[0]
            for ours, original in zip(timings[name], timings[faster], strict=True)
        )
        median = statistics.median(ratios)
        mark = "met " if median >= 1.0 else "MISS"
        print(
            f"    {mark}  {name:34} {median:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})  "
            "target >= 1.0x"
        )


if __name__ == "__main__":
    main()
