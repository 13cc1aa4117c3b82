"""Side-by-side timing shared by the benchmarks: interleaved rounds, medians, ratio tables.

Variants run in rotating order within each round, so a busy or drifting machine hits them all
alike; each reports the median and best wall-clock microseconds per call, and the median CPU
microseconds per call in this process (less sensitive to the machine's scheduling).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "floor_cycle",
    "fresh_cycle",
    "lock_cycle",
    "measure",
    "paired_ratio",
    "print_ratios",
    "report_targets",
]


def floor_cycle(client: Any, key: str = "bench:floor", ttl_ms: int = 30_000) -> Callable[[], None]:
    """The floor of a lock cycle: two bare round trips on ``client`` (``SET NX PX``, ``DEL``)."""
    token = uuid.uuid4().hex

    def run() -> None:
        client.set(key, token, nx=True, px=ttl_ms)
        client.delete(key)

    return run


def lock_cycle(lock: Any) -> Callable[[], None]:
    """One uncontended acquire + release of ``lock`` (any library's), as a variant to time."""
    acquire, release = lock.acquire, lock.release

    def run() -> None:
        assert acquire()
        release()

    return run


def fresh_cycle(make: Callable[[], Any]) -> Callable[[], None]:
    """A lock object made, acquired and released per cycle, as ``with make():`` does: what most
    programs write (``with tasklock.Lock(r, name):``), so the object's making is timed too."""

    def run() -> None:
        with make():
            pass

    return run


def measure(
    variants: Mapping[str, Callable[[], None]],
    counts: Mapping[str, int],
    rounds: int,
    warmup: Mapping[str, int],
    *,
    samples: dict[str, list[float]] | None = None,
) -> dict[str, dict[str, float]]:
    """Per variant: median and best wall-clock and median CPU microseconds per call. With
    ``samples``, also fill it with each variant's wall-clock microseconds of every round, in
    round order (see :func:`paired_ratio`)."""
    for name, run in variants.items():  # warm up: connections, script loads, caches
        for _ in range(warmup[name]):
            run()
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            run, count = variants[name], counts[name]
            gc.collect()
            cpu_start, start = time.process_time_ns(), time.perf_counter_ns()
            for _ in range(count):
                run()
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


def paired_ratio(samples: Mapping[str, list[float]], name: str, base: str) -> float:
    """The median over rounds of ``name``'s time / ``base``'s time in the same round.

    Steadier than the ratio of the two medians on a machine whose speed moves for seconds at a
    time (each round runs every variant back to back, so both sides of a round share it)."""
    return statistics.median(a / b for a, b in zip(samples[name], samples[base], strict=True))


def print_ratios(
    title: str, results: Mapping[str, Mapping[str, float]], base: str, label: str, width: int
) -> None:
    """One line per variant: median, best and CPU microseconds, each with its ratio to ``base``."""
    ref = results[base]
    print(f"\n{title}")
    print(
        f"    {'variant':<{width}} {'median us':>9} {label:>7} {'best us':>8} {label:>7}"
        f" {'cpu us':>7} {label:>7}"
    )
    for name, us in results.items():
        print(
            f"    {name:<{width}} {us['median']:9.1f} {us['median'] / ref['median']:7.2f}"
            f" {us['best']:8.1f} {us['best'] / ref['best']:7.2f}"
            f" {us['cpu']:7.1f} {us['cpu'] / ref['cpu']:7.2f}"
        )


def report_targets(
    checks: Mapping[str, bool],
    results: dict[str, Any],
    started: float,
    json_path: str | None,
) -> dict[str, Any]:
    """The end of a benchmark run: each target met or missed, how long it took and the load
    average then (figures on a shared machine mean little without it), and the results as JSON
    where asked."""
    print("\ntargets")
    for label, ok in checks.items():
        print(f"    {'met ' if ok else 'MISS'}  {label}")
    load = os.getloadavg()
    print(
        f"\n({time.perf_counter() - started:.0f} s; load average at the end: {load[0]:.2f} "
        f"{load[1]:.2f} {load[2]:.2f})"
    )
    results["targets"] = dict(checks)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2))
    return results
