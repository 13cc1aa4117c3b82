"""RQ throughput: N distinct plain jobs vs N distinct @singleton_job jobs, side by side in one run,
against one real redis-server started for the run (the RQ queue and the locks share it, which is
tasklock's default for RQ: the job's own connection).

Variants: a plain function, the same function under ``@singleton_job`` (defaults: ttl 30 s,
watchdog on, key = every argument), and the same with ``dedupe_enqueue=True`` enqueued through
``settle.enqueue(queue, ...)`` (its marker is claimed at enqueue and cleared when the job ends).
Two floors show what any execution lock costs at least (taking it before the body and releasing
it after are two round trips the job must wait for): the plain function plus two redis-py PINGs
on the job's connection, and plus two PINGs on a socket held open, with no client library.

Workers, the same class for every variant:
* ``SimpleWorker`` in this process, burst mode (no fork: the most sensitive to per-job overhead);
  timed from the start to the end of ``work()``.
* ``rq worker --burst`` subprocess (forks a work horse per job, as production does); timed from
  the first job's start to the last job's end (RQ's own timestamps), so interpreter start-up is
  not counted.

For each round, enqueue N jobs (timed: the producer's cost), then drain them with one worker.
Each round runs every variant back to back (rotating the order); reported are the median rates
and the median of the per-round ratios to the plain job. A last run per worker interleaves plain
and singleton jobs in one queue and compares their median per-job cycle (the most robust figure on
a shared, busy machine: load drift hits both variants alike).

    python tests/benchmarks/bench_rq.py [--n 1000] [--rounds 7] [--fork-n 150]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _python_path() -> str:
    """The worker's PYTHONPATH: this checkout first (the app module lives in it), then the
    caller's (another source tree of tasklock to compare, or packages installed to the side)."""
    return os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))


if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from rq import Queue, SimpleWorker  # noqa: E402
from rq.job import Job, JobStatus  # noqa: E402

from tests.benchmarks import rq_jobs  # noqa: E402
from tests.support.servers import redis_server_binary, start_servers  # noqa: E402

QUEUE = "bench"


class BenchWorker(SimpleWorker):
    """SimpleWorker without the pub/sub command channel, whose teardown joins a thread for up to
    a second per burst (the same for every variant, but noise in the timing)."""

    def subscribe(self) -> None:
        pass

    def unsubscribe(self) -> None:
        pass


def enqueue_plain(queue: Queue, n: int) -> list[str]:
    return [queue.enqueue(rq_jobs.plain_noop, i).id for i in range(n)]


def enqueue_floor(queue: Queue, n: int) -> list[str]:
    return [queue.enqueue(rq_jobs.floor_noop, i).id for i in range(n)]


def enqueue_socket_floor(queue: Queue, n: int) -> list[str]:
    return [queue.enqueue(rq_jobs.socket_floor_noop, i).id for i in range(n)]


def enqueue_singleton(queue: Queue, n: int) -> list[str]:
    return [queue.enqueue(rq_jobs.singleton_noop, i).id for i in range(n)]


def enqueue_dedupe(queue: Queue, n: int) -> list[str]:
    return [rq_jobs.dedupe_noop.enqueue(queue, i).id for i in range(n)]


SOCKET_FLOOR = "plain + 2 socket round trips"
FLOOR_JOB = "plain + 2 redis-py round trips"

VARIANTS: dict[str, Callable[[Queue, int], list[str]]] = {
    "plain job": enqueue_plain,
    SOCKET_FLOOR: enqueue_socket_floor,
    FLOOR_JOB: enqueue_floor,
    "tasklock singleton": enqueue_singleton,
    "singleton + dedupe_enqueue": enqueue_dedupe,
}


def drain_in_process(queue: Queue, ids: list[str]) -> float:
    worker = BenchWorker([queue], connection=queue.connection)
    started = time.perf_counter()
    worker.work(burst=True, logging_level="WARNING")
    return time.perf_counter() - started


def drain_forking(queue: Queue, ids: list[str], url: str) -> float:
    env = {
        **os.environ,
        "PYTHONPATH": _python_path(),
    }
    rq_cli = str(Path(sys.executable).with_name("rq"))
    subprocess.run(
        [rq_cli, "worker", "--burst", "--url", url, "--logging_level", "WARNING", QUEUE],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    jobs = [j for j in Job.fetch_many(ids, connection=queue.connection) if j is not None]
    starts = [j.started_at for j in jobs if j.started_at]
    ends = [j.ended_at for j in jobs if j.ended_at]
    return (max(ends) - min(starts)).total_seconds()


def run_round(
    client: redis.Redis, name: str, n: int, drain: Callable[[Queue, list[str]], float]
) -> tuple[float, float]:
    client.flushall()
    queue = Queue(QUEUE, connection=client)
    started = time.perf_counter()
    ids = VARIANTS[name](queue, n)
    enqueue_s = time.perf_counter() - started
    drain_s = drain(queue, ids)
    statuses = {j.get_status(refresh=False) for j in Job.fetch_many(ids, connection=client) if j}
    if statuses != {JobStatus.FINISHED} or len(ids) != n:
        raise RuntimeError(f"{name}: not every job finished: {statuses}")
    return enqueue_s, drain_s


def bench(
    client: redis.Redis, title: str, n: int, rounds: int, drain: Callable[..., float]
) -> dict[str, tuple[float, float, float]]:
    """Rounds run every variant back to back (rotating the order), so each round's ratio to the
    plain job compares runs made under the same machine load; the median of those ratios is
    what is reported (shared machines drift more between rounds than within one)."""
    names = list(VARIANTS)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    run_round(client, names[0], min(n, 200), drain)  # warm up imports, scripts, connections
    for index in range(rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            samples[name].append(run_round(client, name, n, drain))
    plain = samples["plain job"]
    results = {
        name: (
            n / statistics.median(s[0] for s in values),
            n / statistics.median(s[1] for s in values),
            statistics.median(p[1] / s[1] for p, s in zip(plain, values, strict=True)),
        )
        for name, values in samples.items()
    }
    print(f"\n{title}: N={n} jobs per round, {rounds} rounds (medians)")
    print(f"{'variant':30} {'enqueue jobs/s':>15} {'drain jobs/s':>13} {'drain ratio':>12}")
    for name, (enqueue_rate, drain_rate, ratio) in results.items():
        print(f"{name:30} {enqueue_rate:15.0f} {drain_rate:13.0f} {ratio:11.3f}x")
    return results


def interleaved(
    client: redis.Redis, title: str, n: int, drain: Callable[[Queue, list[str]], float]
) -> float:
    """Plain and singleton jobs alternating in one queue, drained by one worker: each job's cycle
    (its start to the next job's start, RQ's timestamps) is attributed to its variant. Load
    drift on a shared machine hits both alike, which separate rounds cannot guarantee."""
    client.flushall()
    queue = Queue(QUEUE, connection=client)
    funcs = (rq_jobs.plain_noop, rq_jobs.singleton_noop)
    ids = [queue.enqueue(funcs[i % 2], i).id for i in range(2 * n)]
    drain(queue, ids)
    jobs = sorted(
        (j for j in Job.fetch_many(ids, connection=client) if j is not None and j.started_at),
        key=lambda j: j.started_at,
    )
    cycles: dict[str, list[float]] = {"plain": [], "singleton": []}
    for job, following in itertools.pairwise(jobs):
        kind = "plain" if job.func_name.endswith("plain_noop") else "singleton"
        cycles[kind].append((following.started_at - job.started_at).total_seconds())
    plain, single = (statistics.median(cycles[k]) for k in ("plain", "singleton"))
    ratio = plain / single
    print(f"\n{title}, interleaved: {2 * n} jobs alternating plain/singleton (median cycle)")
    print(f"plain job {1 / plain:8.0f} jobs/s   tasklock singleton {1 / single:8.0f} jobs/s")
    print(f"ratio {ratio:.3f}x")
    return ratio


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="jobs per round, in-process worker")
    parser.add_argument("--fork-n", type=int, default=150, help="jobs per round, forking worker")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="also write the results to this file (docs/plots.py)")
    args = parser.parse_args(argv)
    with start_servers(1) as (server,):
        client = server.client()
        version = client.info("server")["redis_version"]
        print(f"redis-server {version} ({redis_server_binary()}), Python {sys.version.split()[0]}")
        results = {
            "simple": bench(
                client, "SimpleWorker in-process, burst", args.n, args.rounds, drain_in_process
            ),
            "fork": bench(
                client,
                "rq worker --burst subprocess (a forked work horse per job)",
                args.fork_n,
                args.rounds,
                lambda queue, ids: drain_forking(queue, ids, server.url),
            ),
        }
        mixed = {
            "simple": interleaved(client, "SimpleWorker", args.n, drain_in_process),
            "fork": interleaved(
                client,
                "rq worker --burst",
                args.fork_n,
                lambda queue, ids: drain_forking(queue, ids, server.url),
            ),
        }
        client.close()
    print(
        "\ntarget: singleton >= 0.95x plain (the socket floor's ratio: what any lock making two "
        "round trips could reach at best on this machine)"
    )
    for worker, label in (("simple", "SimpleWorker"), ("fork", "rq worker")):
        rows = results[worker]
        ratio = rows["tasklock singleton"][2]
        print(
            f"{label:13} separate rounds {ratio:.3f}x   interleaved {mixed[worker]:.3f}x   "
            f"socket floor {rows[SOCKET_FLOOR][2]:.3f}x   redis-py floor {rows[FLOOR_JOB][2]:.3f}x"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rounds": args.rounds,
                    "workers": {
                        worker: {
                            "variants": {
                                name: {"enqueue_per_s": e, "drain_per_s": d, "drain_x_plain": x}
                                for name, (e, d, x) in rows.items()
                            },
                            "interleaved_x_plain": mixed[worker],
                        }
                        for worker, rows in results.items()
                    },
                },
                indent=2,
            )
        )
    return results


if __name__ == "__main__":
    main()
