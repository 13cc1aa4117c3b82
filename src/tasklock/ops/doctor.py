"""``tasklock doctor``: what on a Redis server can break locks, and how to fix each thing.

Two steps, kept apart so the verdicts can be tested on any input and the probing on real servers:

* :func:`probe` reads one server's facts (INFO, a few CONFIG values, PING round trips, TIME);
* :func:`judge` turns the facts of all nodes into :class:`Check` verdicts, ``ok`` / ``warn`` /
  ``fail``, each with a one-line fix.

What is checked, and why it matters for a lock:

* eviction: under memory pressure ``allkeys-*`` policies evict any key and ``volatile-*`` policies
  evict keys that have a TTL, which every lock key has: an evicted lock is a second holder.
* persistence: a node that restarts without AOF forgets its locks (a second holder while the first
  still runs); fence tokens still go up (they follow the server's clock), which is what lets a
  fenced store reject the first holder's late writes.
* replication: a replica is read-only (lock writes fail); a master's replicas are updated
  asynchronously, so a failover can promote one that never saw a lock.
* version: SET NX PX needs 2.6.12; tasklock is tested on 6.2 and later.
* latency: every acquire, release and renewal is a round trip.
* clocks (several nodes): Redlock allows ``ttl * 0.01 + 2 ms`` of clock drift; nodes whose clocks
  disagree by more are not kept in sync, and a correcting clock step moves their expiry times.
* the same server listed twice: Redlock would count it as two votes.
* permissions (ACL users): the doctor takes and releases a probe lock and subscribes to its wake
  channel as the configured user (see :mod:`tasklock.ops.permissions`): no EVALSHA / SCRIPT LOAD
  or no access to the key prefix fails (no lock can be taken); no PUBLISH / SUBSCRIBE on the wake
  channels warns (waiters fall back to polling).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import redis.exceptions as redis_errors

from tasklock.core.base import DEFAULT_TTL
from tasklock.core.connection import backend_errors, client_for_url
from tasklock.core.quorum import DEFAULT_DRIFT_EXTRA_MS, DEFAULT_DRIFT_FACTOR, drift_for
from tasklock.core.scripts import ACL_RULES
from tasklock.core.urls import redacted as redact_url
from tasklock.errors import BackendUnavailable
from tasklock.ops.permissions import Permissions, probe_permissions

__all__ = [
    "Check",
    "NodeFacts",
    "Report",
    "Status",
    "drift_allowance",
    "judge",
    "probe",
    "redact_url",
    "run_doctor",
]

PING_COUNT = 5
LATENCY_WARN = 0.050
LATENCY_FAIL = 1.0
MIN_VERSION = (2, 6, 12)
TESTED_VERSION = (6, 2)
_SAFE_POLICIES = ("noeviction",)


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    """One verdict; ``node`` is the (password-free) URL it is about, None for cross-node ones."""

    name: str
    status: Status
    message: str
    fix: str | None = None
    node: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data


@dataclass
class NodeFacts:
    """What :func:`probe` learned about one server; None where it could not be read."""

    url: str
    error: str | None = None
    version: str | None = None
    run_id: str | None = None
    role: str | None = None
    connected_replicas: int | None = None
    maxmemory: int | None = None
    maxmemory_policy: str | None = None
    aof_enabled: bool | None = None
    appendfsync: str | None = None
    rdb_save: str | None = None
    config_error: str | None = None
    round_trips: list[float] = field(default_factory=list)
    clock_offset: float | None = None  # server TIME minus this host's clock, seconds
    clock_uncertainty: float | None = None  # half the round trip of that TIME call
    permissions: Permissions | None = None


@dataclass(frozen=True)
class Report:
    """All verdicts of one doctor run."""

    urls: list[str]
    checks: list[Check]

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status is Status.FAIL]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status is Status.WARN]

    def exit_code(self, strict: bool = False) -> int:
        """1 when a check failed (or, with ``strict``, warned), else 0."""
        return 1 if self.failures or (strict and self.warnings) else 0

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        return {
            "urls": self.urls,
            "ok": self.exit_code(strict) == 0,
            "failures": len(self.failures),
            "warnings": len(self.warnings),
            "checks": [c.to_json() for c in self.checks],
        }


def drift_allowance(ttl: float = DEFAULT_TTL) -> float:
    """Redlock's clock drift allowance for a TTL, in seconds (0.302 for the default 30 s)."""
    return drift_for(ttl, DEFAULT_DRIFT_FACTOR, DEFAULT_DRIFT_EXTRA_MS)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _config_get(client: Any, name: str) -> str | None:
    answer = client.config_get(name)
    for key, value in answer.items():
        if _text(key) == name:
            return _text(value)
    return None


def probe(url: str) -> NodeFacts:
    """Read what :func:`judge` needs from the server at ``url``; an unreachable one sets ``error``.

    Clocks are read with ``time.time`` on purpose (not the core's clock seam): this measures the
    real clocks of real machines.
    """
    facts = NodeFacts(url=redact_url(url))
    try:
        client = client_for_url(url)
        with backend_errors(client, "running doctor checks"):
            _probe_into(client, facts)
    except BackendUnavailable as exc:
        facts.error = str(exc)
    except redis_errors.RedisError as exc:
        facts.error = f"Redis at {facts.url} refused a doctor query: {exc}"
    return facts


def _probe_into(client: Any, facts: NodeFacts) -> None:
    # First, and whatever else the user may not read: can it lock at all?
    facts.permissions = probe_permissions(
        client, os.environ.get("TASKLOCK_KEY_PREFIX") or "tasklock"
    )
    try:
        info = client.info()  # server, clients, memory, persistence, replication... in one call
    except redis_errors.NoPermissionError as exc:  # an ACL user without INFO: judged as unknown
        facts.config_error = str(exc)
        info = {}
    facts.version = str(info.get("redis_version")) if "redis_version" in info else None
    facts.run_id = str(info.get("run_id")) if "run_id" in info else None
    facts.role = str(info.get("role")) if "role" in info else None
    if "connected_slaves" in info:
        facts.connected_replicas = int(info["connected_slaves"])
    if "maxmemory" in info:
        facts.maxmemory = int(info["maxmemory"])
    if "maxmemory_policy" in info:
        facts.maxmemory_policy = str(info["maxmemory_policy"])
    if "aof_enabled" in info:
        facts.aof_enabled = bool(int(info["aof_enabled"]))
    try:
        facts.appendfsync = _config_get(client, "appendfsync")
        facts.rdb_save = _config_get(client, "save")
        if facts.maxmemory_policy is None:  # INFO memory has it since Redis 4
            facts.maxmemory_policy = _config_get(client, "maxmemory-policy")
    except redis_errors.ResponseError as exc:  # CONFIG renamed or denied (managed Redis, ACLs)
        facts.config_error = str(exc)
    try:
        _measure_round_trips(client, facts)
    except redis_errors.NoPermissionError as exc:  # PING / TIME refused: judged as unknown
        facts.config_error = facts.config_error or str(exc)


def _measure_round_trips(client: Any, facts: NodeFacts) -> None:
    for _ in range(PING_COUNT):
        start = time.perf_counter()
        client.ping()
        facts.round_trips.append(time.perf_counter() - start)
    best: tuple[float, float] | None = None  # (uncertainty, offset) of the quickest TIME call
    for _ in range(3):
        before = time.time()
        seconds, micros = client.time()
        after = time.time()
        sample = ((after - before) / 2, seconds + micros / 1e6 - (before + after) / 2)
        if best is None or sample[0] < best[0]:
            best = sample
    assert best is not None
    facts.clock_uncertainty, facts.clock_offset = best


def run_doctor(urls: Sequence[str], ttl: float = DEFAULT_TTL) -> Report:
    """Probe every URL (in parallel, so one stalled node costs one timeout) and judge them."""
    with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
        facts = list(pool.map(probe, urls))
    return Report([redact_url(u) for u in urls], judge(facts, ttl, raw_urls=urls))


def judge(
    nodes: Sequence[NodeFacts], ttl: float = DEFAULT_TTL, raw_urls: Sequence[str] | None = None
) -> list[Check]:
    """Every verdict for these nodes: per node, then across nodes when there are several."""
    redlock = len(nodes) > 1
    checks: list[Check] = []
    for node in nodes:
        checks.extend(_node_checks(node, redlock))
    if redlock:
        checks.extend(_cross_checks(nodes, ttl, raw_urls))
    return checks


def _node_checks(node: NodeFacts, redlock: bool) -> list[Check]:
    if node.error is not None:
        return [
            Check(
                "reachable",
                Status.FAIL,
                node.error,
                "start the server or correct the URL; locks on it cannot be taken or released",
                node.url,
            )
        ]
    checks = [
        Check("reachable", Status.OK, f"answered (Redis {node.version or 'unknown version'})")
    ]
    checks.append(_check_version(node))
    checks.append(_check_replication(node, redlock))
    checks.append(_check_eviction(node))
    checks.append(_check_persistence(node, redlock))
    checks.append(_check_latency(node))
    checks.extend(_check_permissions(node.permissions))
    if not redlock:
        checks.append(_check_single_clock(node))
    return [Check(c.name, c.status, c.message, c.fix, node.url) for c in checks]


ACL_FIX = f"grant the user what tasklock runs: ACL SETUSER <user> {ACL_RULES}"


def _check_permissions(found: Permissions | None) -> list[Check]:
    if found is None:
        return []
    if found.scripts is not None:
        return [
            Check(
                "permissions",
                Status.FAIL,
                f"the user cannot run tasklock's lock scripts on the key prefix: {found.scripts}",
                ACL_FIX,
            )
        ]
    refused = [text for text in (found.publish, found.subscribe) if text is not None]
    if refused:
        return [
            Check(
                "permissions",
                Status.WARN,
                "locks work, but waiters fall back to polling (up to a second late): "
                + "; ".join(refused),
                ACL_FIX,
            )
        ]
    return [
        Check(
            "permissions",
            Status.OK,
            "the user can run the lock scripts, publish and subscribe to wake-ups",
        )
    ]


def _version_tuple(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in text.split(".")[:3])
    except ValueError:
        return None


def _check_version(node: NodeFacts) -> Check:
    version = _version_tuple(node.version) if node.version else None
    if version is None:
        return Check(
            "version",
            Status.WARN,
            f"could not read the Redis version ({node.version!r})",
            "check the server with `redis-cli INFO server`; tasklock needs Redis 2.6.12+",
        )
    if version < MIN_VERSION:
        return Check(
            "version",
            Status.FAIL,
            f"Redis {node.version} lacks SET NX PX, which every lock acquire needs",
            "upgrade to Redis 6.2 or later",
        )
    if version < TESTED_VERSION:
        return Check(
            "version",
            Status.WARN,
            f"Redis {node.version} is older than 6.2, the oldest version tasklock is tested on",
            "upgrade to Redis 6.2 or later (`tasklock ls` also needs 6.0+ to filter SCAN by type)",
        )
    return Check("version", Status.OK, f"Redis {node.version}")


def _check_replication(node: NodeFacts, redlock: bool) -> Check:
    if node.role is not None and node.role != "master":
        return Check(
            "replication",
            Status.FAIL,
            f"this server is a {node.role}: it is read-only, so lock writes fail with READONLY",
            "point tasklock at the master (or, with Sentinel, at what Sentinel names as master)",
        )
    replicas = node.connected_replicas or 0
    if replicas and redlock:
        return Check(
            "replication",
            Status.WARN,
            f"Redlock master with {replicas} replica(s): replication is asynchronous, so a "
            "failover can promote a replica that never saw a lock, and a second client gets it",
            "run Redlock masters without replicas or failover (independent nodes are the point); "
            "use AOF and delayed restarts for durability instead",
        )
    if replicas:
        return Check(
            "replication",
            Status.WARN,
            f"master with {replicas} replica(s): replication is asynchronous, so a failover "
            "can lose a lock taken just before it and let a second holder in",
            "accept the failover window (use fencing to reject the stale holder's writes) or "
            "use Redlock over independent masters",
        )
    return Check("replication", Status.OK, "master without replicas")


def _check_eviction(node: NodeFacts) -> Check:
    policy = node.maxmemory_policy
    if policy is None:
        return Check(
            "eviction",
            Status.WARN,
            f"could not read maxmemory-policy ({node.config_error or 'not reported'})",
            "ask your provider or run `redis-cli CONFIG GET maxmemory-policy`; it must be "
            "noeviction",
        )
    if policy in _SAFE_POLICIES:
        return Check(
            "eviction",
            Status.OK,
            "maxmemory-policy noeviction: lock keys are never evicted (a full server refuses "
            "writes, and acquires fail closed)",
        )
    scope = (
        "any key, lock keys included"
        if policy.startswith("allkeys-")
        else "keys with a TTL, and every lock key has one"
    )
    fix = "CONFIG SET maxmemory-policy noeviction (and set it in redis.conf), or keep locks on a "
    fix += "Redis that does not evict"
    if not node.maxmemory:
        return Check(
            "eviction",
            Status.WARN,
            f"maxmemory-policy {policy} evicts {scope}; it is idle only because maxmemory is 0 "
            "(no limit), and starts evicting as soon as a limit is set",
            fix,
        )
    return Check(
        "eviction",
        Status.FAIL,
        f"maxmemory-policy {policy} with maxmemory {node.maxmemory} bytes evicts {scope}: an "
        "evicted lock lets a second holder in while the first still runs",
        fix,
    )


def _check_persistence(node: NodeFacts, redlock: bool) -> Check:
    what = "its votes for held locks" if redlock else "every held lock"
    if node.aof_enabled:
        if node.appendfsync in ("always", "everysec"):
            note = (
                ""
                if node.appendfsync == "always"
                else " (a host crash can lose the last second: delay its restart by one TTL)"
            )
            return Check("persistence", Status.OK, f"AOF on, appendfsync {node.appendfsync}{note}")
        return Check(
            "persistence",
            Status.WARN,
            f"AOF on but appendfsync {node.appendfsync or 'unknown'}: a host crash can lose "
            f"recent writes, so a restart forgets {what} written since the last fsync",
            "CONFIG SET appendfsync everysec (or always), or delay restarts by one TTL",
        )
    rdb = node.rdb_save
    if rdb:
        return Check(
            "persistence",
            Status.WARN,
            f"AOF off, RDB snapshots only (save {rdb}): a restart goes back to the last "
            f"snapshot and forgets {what} taken since then (a second holder while the first "
            "runs; fence tokens still go up)",
            "CONFIG SET appendonly yes (appendfsync everysec or always), or delay restarts by one "
            "TTL",
        )
    unknown = " (could not read the RDB settings)" if rdb is None else ""
    return Check(
        "persistence",
        Status.WARN,
        f"persistence off{unknown}: a restart forgets {what} (a second holder while the first "
        "runs; fence tokens still go up)",
        "CONFIG SET appendonly yes (appendfsync everysec or always), or delay restarts by one "
        "TTL so every old hold has expired",
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _check_latency(node: NodeFacts) -> Check:
    if not node.round_trips:
        return Check("latency", Status.WARN, "no round trip was measured", "re-run the doctor")
    median = statistics.median(node.round_trips)
    message = f"median round trip {_ms(median)} over {len(node.round_trips)} PINGs"
    if median > LATENCY_FAIL:
        return Check(
            "latency",
            Status.FAIL,
            message + ": slow enough to miss renewals and time out acquires",
            "run the workers near Redis, or find what stalls it (`redis-cli --latency`, "
            "SLOWLOG GET)",
        )
    if median > LATENCY_WARN:
        return Check(
            "latency",
            Status.WARN,
            message + f": above {_ms(LATENCY_WARN)}, every acquire and release pays it",
            "run the workers in the same network as Redis, or check its load "
            "(`redis-cli --latency`)",
        )
    return Check("latency", Status.OK, message)


def _check_single_clock(node: NodeFacts) -> Check:
    offset = node.clock_offset
    where = ""
    if offset is not None:
        side = "ahead of" if offset >= 0 else "behind"
        where = f" (its clock is {_ms(abs(offset))} {side} this host's)"
    return Check(
        "clock",
        Status.OK,
        f"one node: lock expiry is timed by the server's clock alone{where}",
    )


def _cross_checks(
    nodes: Sequence[NodeFacts], ttl: float, raw_urls: Sequence[str] | None
) -> list[Check]:
    return [_check_duplicates(nodes, raw_urls), _check_node_count(nodes), _check_clocks(nodes, ttl)]


def _check_duplicates(nodes: Sequence[NodeFacts], raw_urls: Sequence[str] | None) -> Check:
    urls = list(raw_urls) if raw_urls is not None else [n.url for n in nodes]
    groups: dict[str, list[str]] = {}
    for url, node in zip(urls, nodes, strict=True):
        # run_id is random per server process: two URLs with one run_id reach one server.
        groups.setdefault(node.run_id or f"url:{url}", []).append(node.url)
    repeated = [g for g in groups.values() if len(g) > 1]
    if repeated:
        listed = "; ".join(" = ".join(g) for g in repeated)
        return Check(
            "distinct nodes",
            Status.FAIL,
            f"the same server is listed more than once ({listed}): Redlock counts it as several "
            "votes, so one server can make a 'majority' and two clients can hold a lock",
            "list each Redlock master once, each an independent redis-server",
        )
    return Check("distinct nodes", Status.OK, f"{len(nodes)} distinct servers")


def _check_node_count(nodes: Sequence[NodeFacts]) -> Check:
    count = len(nodes)
    quorum = count // 2 + 1
    tolerated = count - quorum
    message = f"{count} nodes, quorum {quorum}: tolerates {tolerated} node(s) down"
    if count < 3:
        return Check(
            "quorum",
            Status.WARN,
            message + ": with 2 nodes both must answer, so Redlock adds no availability",
            "use 3 or 5 independent masters (or one, with the single-instance lock)",
        )
    if count % 2 == 0:
        return Check(
            "quorum",
            Status.WARN,
            message + f", no more than {count - 1} nodes would",
            f"use {count - 1} or {count + 1} masters: an even count adds a node without adding "
            "tolerance",
        )
    return Check("quorum", Status.OK, message)


def _check_clocks(nodes: Sequence[NodeFacts], ttl: float) -> Check:
    allowance = drift_allowance(ttl)
    timed = [n for n in nodes if n.clock_offset is not None]
    if len(timed) < 2:
        return Check(
            "clock",
            Status.WARN,
            "fewer than two nodes answered TIME, so their clocks could not be compared",
            "make the nodes reachable and re-run the doctor",
        )
    early = min(timed, key=lambda n: n.clock_offset or 0.0)
    late = max(timed, key=lambda n: n.clock_offset or 0.0)
    spread = (late.clock_offset or 0.0) - (early.clock_offset or 0.0)
    error = (late.clock_uncertainty or 0.0) + (early.clock_uncertainty or 0.0)
    message = (
        f"node clocks differ by up to {_ms(spread)} (measured to +/- {_ms(error)}); Redlock's "
        f"drift allowance for a {ttl:g} s TTL is {_ms(allowance)}"
    )
    fix = (
        "keep every node's clock synced (chrony/ntpd, slewing rather than stepping), and check "
        f"{late.url} against {early.url}"
    )
    if spread > allowance:
        return Check(
            "clock",
            Status.FAIL,
            message + ": clocks this far apart are not synced, and a correcting clock step "
            "shortens a lock's life on that node beyond what Redlock allows for",
            fix,
        )
    if spread > allowance / 4:
        return Check(
            "clock", Status.WARN, message + ": more than a quarter of the allowance is used", fix
        )
    return Check("clock", Status.OK, message)
