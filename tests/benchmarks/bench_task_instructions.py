"""tasklock's own work per task call, in instructions: steadier than a worker's CPU time, which
moves by hundreds of microseconds between rounds on a shared 2-core machine.

Each variant's calls go through Celery's tracer in this process (``build_tracer``: what a worker
runs per task, result stored in Redis), under ``valgrind --tool=callgrind`` with
``PYTHONHASHSEED=0``: a run of N calls less a run of none, over N, is the client's instructions
per call (the redis-server is outside valgrind). Variants: the floor task (a plain task whose body
makes two bare redis-py round trips, as ``bench_celery.py``'s) and tasklock's singleton.
Printed: each variant's instructions per call and the singleton's beyond the floor task's, and
beside them the same calls' CPU time in this process (``time.process_time``, all threads; rounds
alternating between the variants, medians), which converts instructions to microseconds on the
machine at hand.

    python tests/benchmarks/bench_task_instructions.py [--calls 2000]

(The script re-runs itself under valgrind; ``--variant`` and ``--url`` are for those runs.)
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VARIANTS = ("floor", "singleton")


def tracers(url: str) -> dict[str, Any]:
    """For each variant, a function making one call of it through Celery's tracer, in this
    process (one app for both, as a worker has)."""
    from celery import Celery
    from celery.app.trace import build_tracer

    from tasklock.celery import singleton_task
    from tasklock.core.connection import client_for_url

    app = Celery("instructions", broker=url, backend=url, set_as_current=False)

    @app.task(name="instructions.floor")
    def floor(i: int) -> int:
        client = client_for_url(url)
        client.ping()
        client.ping()
        return i

    @singleton_task(app=app, name="instructions.singleton")
    def locked(i: int) -> int:
        return i

    request = {"delivery_info": {"routing_key": "celery"}}

    def caller(task: Any) -> Any:
        tracer = build_tracer(task.name, task, app=app)
        return lambda i: tracer(f"id-{task.name}-{i}", (i,), {}, request)

    return {"floor": caller(floor), "singleton": caller(locked)}


def run_calls(url: str, variant: str, calls: int) -> None:
    """In this process: ``calls`` calls of ``variant`` through Celery's tracer, after a warm-up
    (imports, connections, scripts loaded: paid by the runs of N calls and of none alike)."""
    call = tracers(url)[variant]
    for i in range(50 + calls):
        call(i)


def cpu_per_call(url: str, calls: int, rounds: int = 7) -> dict[str, float]:
    """Each variant's CPU time per call in this process (us), medians of alternating rounds."""
    calls_of = tracers(url)
    for call in calls_of.values():
        for i in range(50):
            call(-i - 1)
    seconds: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_no in range(rounds):
        for variant, call in calls_of.items():
            start = time.process_time()
            for i in range(calls):
                call(round_no * calls + i)
            seconds[variant].append((time.process_time() - start) / calls * 1e6)
    return {variant: statistics.median(values) for variant, values in seconds.items()}


def instructions(url: str, variant: str, calls: int) -> int:
    """The client's instructions for a run of ``calls`` calls (callgrind's total)."""
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, __file__, "--variant", variant, "--url", url,
             "--calls", str(calls)],
            check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"},
        )  # fmt: skip
        match = re.search(rb"^summary: (\d+)", out.read_bytes(), re.M)
        if match is None:
            raise RuntimeError(f"no summary in {out}")
        return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--variant", choices=VARIANTS, help="(a run under valgrind)")
    parser.add_argument("--url", help="(a run under valgrind)")
    options = parser.parse_args()
    if options.variant:
        run_calls(options.url, options.variant, options.calls)
        return

    from tests.support.servers import start_servers

    with start_servers(1) as (server,):
        per_call = {}
        for variant in VARIANTS:
            none = instructions(server.url, variant, 0)
            some = instructions(server.url, variant, options.calls)
            per_call[variant] = (some - none) / options.calls
        cpu = cpu_per_call(server.url, options.calls)
        from tasklock import fleet

        fleet.forget()  # (the counts' writer would retry against the stopped server)
    print(f"\nper task call through Celery's tracer ({options.calls} calls; CPU: medians)")
    for variant, count in per_call.items():
        print(f"    {variant:10} {count / 1000:8.0f}k instructions {cpu[variant]:8.0f} us CPU")
    extra, extra_cpu = per_call["singleton"] - per_call["floor"], cpu["singleton"] - cpu["floor"]
    rate = per_call["floor"] / cpu["floor"]  # instructions per us, kernel time included
    print(
        f"    singleton beyond the floor task: {extra / 1000:+.0f}k instructions "
        f"({extra / per_call['floor']:+.0%}; about {extra / rate:+.0f} us at the floor task's "
        f"{rate / 1000:.1f}k instructions per us of CPU), measured CPU {extra_cpu:+.0f} us"
    )
    # The instruction count is the steady figure (CPU time at this scale moves with the
    # process's state: docs/benchmarks.md); the measured CPU is shown beside it.
    for label, value in (("by instructions", extra / rate), ("by measured CPU", extra_cpu)):
        verdict = "met " if value <= 40 else "MISS"
        print(f"    {verdict}  beyond the floor task's <= 40 us, {label}")


if __name__ == "__main__":
    main()
