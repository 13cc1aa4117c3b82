"""Redlock benchmarks, side by side in one run against five real redis-server processes.

(a) Lock cycle (acquire + release, uncontended) over 5 masters: tasklock.Redlock with fencing
    (always on: round 1, round 2, release = three parallel fan-outs), with an explicit timeout
    (watchdog off) and by default (30 s TTL, watchdog on); pottery's Redlock on the same five
    servers; and the single-node floor of two bare round trips with redis-py (``SET NX PX`` then
    ``DEL`` on one server). Rounds interleave the variants so that machine noise hits them all
    alike; reported are the median and best microseconds per cycle, CPU microseconds per cycle in
    this process, and ratios. Target: tasklock's rate >= 3x pottery's.
(b) Anatomy, to explain (a): one fan-out of a PING to 5 masters the way tasklock does it (write
    all, then poll all sockets), the same 5 PINGs one after another, and the same through a
    thread pool (one task per master, as a thread-based fan-out would do).

    python tests/benchmarks/bench_redlock.py [--cycles 200] [--rounds 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from pottery import Redlock as PotteryRedlock  # noqa: E402

from tasklock.core.fanout import Op, fan_out, node_for  # noqa: E402
from tasklock.core.redlock import Redlock  # noqa: E402
from tests.benchmarks.interleave import floor_cycle, lock_cycle, measure, print_ratios  # noqa: E402
from tests.support.servers import start_servers  # noqa: E402

FLOOR = "floor: SET NX PX + DEL, 1 node"
EXPLICIT = "tasklock.Redlock(timeout=30)"
DEFAULT = "tasklock.Redlock() watchdog"
POTTERY = "pottery.Redlock(30 s)"


def cycle_variants(clients: list[redis.Redis]) -> dict[str, Callable[[], None]]:
    explicit = Redlock(clients, "bench:explicit", timeout=30)
    default = Redlock(clients, "bench:default")
    pottery = PotteryRedlock(key="bench:pottery", masters=set(clients), auto_release_time=30)

    return {
        FLOOR: floor_cycle(clients[0]),
        EXPLICIT: lock_cycle(explicit),
        DEFAULT: lock_cycle(default),
        POTTERY: lock_cycle(pottery),
    }


def anatomy_variants(clients: list[redis.Redis]) -> dict[str, Callable[[], None]]:
    nodes = [node_for(client) for client in clients]
    ping = Op(("PING",))
    pool = ThreadPoolExecutor(len(clients))

    def multiplexed() -> None:
        fan_out(nodes, [ping] * len(nodes), 1.0).settle()

    def sequential() -> None:
        for client in clients:
            client.ping()

    def threads() -> None:
        for future in [pool.submit(client.ping) for client in clients]:
            future.result()

    return {
        "1 PING, 1 node (one round trip)": lambda: clients[0].ping(),
        "5 PINGs: tasklock fan-out": multiplexed,
        "5 PINGs: one after another": sequential,
        "5 PINGs: thread pool": threads,
    }


def report(title: str, results: dict[str, dict[str, float]], base: str) -> None:
    print_ratios(title, results, base, "x base", 34)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200, help="tasklock cycles per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with start_servers(5) as servers:
        clients = [redis.Redis(host="127.0.0.1", port=server.port) for server in servers]
        # pottery is an order of magnitude slower: fewer cycles per round, same number of rounds.
        counts = {FLOOR: args.cycles, EXPLICIT: args.cycles, DEFAULT: args.cycles}
        counts[POTTERY] = max(10, args.cycles // 8)
        warmup = {name: max(20, count // 2) for name, count in counts.items()}
        cycle = measure(cycle_variants(clients), counts, args.rounds, warmup)
        report(
            f"(a) acquire + release over 5 masters: {args.rounds} interleaved rounds "
            f"(base: the single-node floor)",
            cycle,
            FLOOR,
        )
        anatomy_variants_ = anatomy_variants(clients)
        anatomy_counts = dict.fromkeys(anatomy_variants_, args.cycles)
        anatomy = measure(
            anatomy_variants_, anatomy_counts, 7, dict.fromkeys(anatomy_variants_, args.cycles // 2)
        )
        report(
            "(b) anatomy: one fan-out to 5 masters (base: one round trip)",
            anatomy,
            "1 PING, 1 node (one round trip)",
        )
        for client in clients:
            client.close()
    pottery_us = cycle[POTTERY]["median"]
    ratios = {name: pottery_us / cycle[name]["median"] for name in (EXPLICIT, DEFAULT)}
    print("\nrate against pottery (pottery's time per cycle / ours)")
    for name, ratio in ratios.items():
        print(f"    {name:<34} {ratio:6.2f}x")
    print(
        f"    pottery against the floor:         {pottery_us / cycle[FLOOR]['median']:6.2f}x slower"
    )
    checks = {f"{name} >= 3x pottery's rate": ratio >= 3.0 for name, ratio in ratios.items()}
    print("\ntargets")
    for label, ok in checks.items():
        print(f"    {'met ' if ok else 'MISS'}  {label}")
    results.update(cycle_us=cycle, anatomy_us=anatomy, x_pottery=ratios, targets=checks)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
