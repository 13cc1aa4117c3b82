"""Side-by-side timing shared by the benchmarks: interleaved rounds, medians, ratio tables.

Variants run in rotating order within each round, so a busy or drifting machine hits them all
alike; each reports the median and best wall-clock microseconds per call, and the median CPU
microseconds per call in this process (less sensitive to the machine's scheduling).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lock_cycle", "measure", "print_ratios"]


def lock_cycle(lock: Any) -> Callable[[], None]:
    """One uncontended acquire + release of ``lock`` (any library's), as a variant to time."""
    acquire, release = lock.acquire, lock.release

    def run() -> None:
        assert acquire()
        release()

    return run


def measure(
    variants: Mapping[str, Callable[[], None]],
    counts: Mapping[str, int],
    rounds: int,
    warmup: Mapping[str, int],
) -> dict[str, dict[str, float]]:
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
    return {
        name: {
            "median": statistics.median(wall[name]),
            "best": min(wall[name]),
            "cpu": statistics.median(cpu[name]),
        }
        for name in variants
    }


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
