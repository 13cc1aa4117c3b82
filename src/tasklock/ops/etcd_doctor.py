"""``tasklock doctor --url etcd://...``: what in an etcd cluster can break locks, and the fixes.

The same two steps as the Redis doctor (:mod:`tasklock.ops.doctor`), whose :class:`Report`,
:class:`Check` and :class:`Status` it returns, so the text, the ``--json`` shape and the exit
codes (``--strict`` included) are the Redis doctor's:

* :func:`probe` reads one endpoint's facts: ``GET /version`` and ``GET /health``, the member
  list, the maintenance status (who leads), and a real lock cycle on a probe key;
* :func:`judge` turns them into verdicts, per endpoint and across them.

What is checked, and why it matters for a lock:

* reachable, and etcd at all: a URL that names another server (an HTTP server, a Redis port) is
  a failure that says so, not a traceback.
* version: tasklock speaks the v3 JSON gateway at ``/v3/``, which etcd serves from 3.4 on.
* health and leader: without a leader no write commits, so no lock can be taken or released,
  and keep-alives fail (holders report their locks lost).
* lock probe: a 2 s lease, a put-if-absent transaction on a probe key, its delete and the lease's
  revoke, as the configured endpoint sees them; its round trip is what every acquire pays.
* members: a cluster of n tolerates ``n - (n // 2 + 1)`` failed members. One member tolerates
  none; an even count tolerates no more than one fewer would (3 members tolerate 1, 5 tolerate 2).
* endpoints: the client fails over only between the endpoints it is given; fewer than the
  members means it can lose the cluster while a quorum is still up.
* one cluster: every endpoint given must report the same ``cluster_id``. A client fails over
  between its endpoints, and a lock taken on one cluster is invisible to the other.

``GET`` goes through httpx directly: :class:`tasklock.etcd.client.Client` only POSTs, which is
all the gateway's API needs.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from tasklock.errors import BackendUnavailable, ConfigurationError
from tasklock.etcd import protocol
from tasklock.etcd.client import DEFAULT_TIMEOUT, Client
from tasklock.ops.doctor import LATENCY_FAIL, LATENCY_WARN, Check, Report, Status
from tasklock.ops.etcd_inspect import check_url

__all__ = ["MIN_VERSION", "EndpointFacts", "judge", "probe", "run_doctor"]

MIN_VERSION = (3, 4)
MEMBER_LIST = "/v3/cluster/member/list"
STATUS = "/v3/maintenance/status"
GRANT = "/v3/lease/grant"
PROBE_TTL = 2
_NOT_ETCD_FIX = (
    "point the URL at etcd's client port (2379 by default, the --listen-client-urls of etcd), "
    "not another service"
)


@dataclass
class EndpointFacts:
    """What :func:`probe` learned about one endpoint; None where it could not be read."""

    url: str
    error: str | None = None
    version: str | None = None
    health: str | None = None  # "true", "false", or the reason it could not be read
    health_reason: str = ""
    cluster_id: str | None = None
    member_id: str | None = None
    members: list[str] = field(default_factory=list)  # member names (or IDs)
    leader: str | None = None
    probe_error: str | None = None
    round_trip: float | None = None  # seconds, the probe's put-if-absent transaction


def _get(http: httpx.Client, facts: EndpointFacts, path: str) -> dict[str, Any] | None:
    """``GET path`` as JSON; None, with ``facts.error`` set, when it is not etcd's answer."""
    try:
        response = http.get(facts.url + path)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        facts.error = f"etcd at {facts.url} did not answer ({exc or type(exc).__name__})"
        return None
    except httpx.HTTPError as exc:  # not HTTP at all (a Redis port drops the connection)
        facts.error = (
            f"{facts.url} is not etcd: it does not answer HTTP as etcd does "
            f"({exc or type(exc).__name__})"
        )
        return None
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        facts.error = (
            f"{facts.url} is not etcd: it answered HTTP {response.status_code} to GET {path} "
            "without etcd's JSON"
        )
        return None
    return answer


def _post(client: Client, path: str, body: dict[str, Any], what: str) -> dict[str, Any]:
    status, content, endpoint = client.raw(path, body, what)
    error = protocol.error_from_reply(status, content, endpoint, what)
    if error is not None:
        raise error
    reply: dict[str, Any] = httpx.Response(status, content=content).json()
    return reply


def _lock_probe(client: Client, facts: EndpointFacts) -> None:
    """Take and release a probe lock as tasklock does, timing its put-if-absent transaction."""
    what = "taking a probe lock"
    key = f"tasklock:doctor:probe:{secrets.token_hex(8)}".encode()
    lease = protocol.lease_id(_post(client, GRANT, {"TTL": str(PROBE_TTL)}, what))
    try:
        start = time.perf_counter()
        reply = _post(client, protocol.TXN, protocol.acquire_txn(key, b"probe", lease), what)
        facts.round_trip = time.perf_counter() - start
        if not reply.get("succeeded"):
            facts.probe_error = "the put-if-absent transaction on a fresh probe key failed"
        _post(client, protocol.TXN, protocol.release_txn(key, lease), "releasing a probe lock")
    finally:
        client.revoke(lease, "revoking the probe lock's lease")


def probe(url: str) -> EndpointFacts:
    """Read what :func:`judge` needs from the one endpoint ``url`` (``http(s)://host:port``)."""
    facts = EndpointFacts(url)
    with httpx.Client(timeout=DEFAULT_TIMEOUT) as http:
        version = _get(http, facts, "/version")
        if version is None:
            return facts
        if "etcdserver" not in version:
            facts.error = f"{url} is not etcd: GET /version names no etcdserver ({version!r:.80})"
            return facts
        facts.version = str(version["etcdserver"])
        health = _get(http, facts, "/health")
        if health is None:
            facts.health, facts.error = f"unreadable ({facts.error})", None
        else:
            facts.health = str(health.get("health"))
            facts.health_reason = str(health.get("reason") or "")
    client = Client(url)
    try:
        members = _post(client, MEMBER_LIST, {}, "listing members")
        header = members.get("header", {})
        facts.cluster_id, facts.member_id = header.get("cluster_id"), header.get("member_id")
        facts.members = [str(m.get("name") or m.get("ID")) for m in members.get("members", [])]
        facts.leader = str(_post(client, STATUS, {}, "reading its status").get("leader", "0"))
        _lock_probe(client, facts)
    except (BackendUnavailable, ConfigurationError, ValueError, KeyError) as exc:
        facts.probe_error = str(exc) or type(exc).__name__
    finally:
        client.close()
    return facts


def run_doctor(urls: Sequence[str], option: str = "--url") -> Report:
    """Probe every endpoint of the etcd URLs ``urls`` (in parallel) and judge them."""
    endpoints: list[str] = []
    for url in urls:
        check_url(url, option)
        endpoints.extend(protocol.parse_endpoints(url))
    endpoints = list(dict.fromkeys(endpoints))
    with ThreadPoolExecutor(max_workers=len(endpoints)) as pool:
        facts = list(pool.map(probe, endpoints))
    return Report(endpoints, judge(facts))


def judge(endpoints: Sequence[EndpointFacts]) -> list[Check]:
    """Every verdict: per endpoint, then across the endpoints that answered."""
    checks: list[Check] = []
    for facts in endpoints:
        checks.extend(
            Check(c.name, c.status, c.message, c.fix, facts.url) for c in _endpoint_checks(facts)
        )
    answered = [f for f in endpoints if f.error is None and f.cluster_id is not None]
    if answered:
        checks.append(_check_members(answered[0]))
        checks.append(_check_endpoints(len(endpoints), answered[0]))
        checks.append(_check_one_cluster(answered))
    return checks


def _endpoint_checks(facts: EndpointFacts) -> list[Check]:
    if facts.error is not None:
        fix = _NOT_ETCD_FIX if "is not etcd" in facts.error else "start etcd or correct the URL"
        return [Check("reachable", Status.FAIL, facts.error, fix)]
    checks = [Check("reachable", Status.OK, f"answered (etcd {facts.version})"), _version(facts)]
    if facts.health == "true":
        checks.append(Check("health", Status.OK, "GET /health: healthy"))
    else:
        checks.append(
            Check(
                "health",
                Status.FAIL,
                f"GET /health: {facts.health} {facts.health_reason}".rstrip(),
                "see etcd's log and `etcdctl endpoint health --cluster`",
            )
        )
    if facts.leader is not None:
        checks.append(_leader(facts))
    checks.extend(_probe_checks(facts))
    return checks


def _version(facts: EndpointFacts) -> Check:
    try:
        version = tuple(int(part) for part in (facts.version or "").split(".")[:2])
    except ValueError:
        version = ()
    if len(version) < 2:
        return Check("version", Status.WARN, f"could not read the version ({facts.version!r})")
    if version < MIN_VERSION:
        return Check(
            "version",
            Status.FAIL,
            f"etcd {facts.version} has no v3 JSON gateway at /v3/ (it came in etcd 3.4)",
            "upgrade etcd to 3.5 (or at least 3.4)",
        )
    return Check("version", Status.OK, f"etcd {facts.version}")


def _leader(facts: EndpointFacts) -> Check:
    if facts.leader in ("0", ""):
        return Check(
            "leader",
            Status.FAIL,
            "no leader: no write commits, so no lock is taken or released, and holders' "
            "keep-alives fail (their locks are reported lost)",
            "restore a quorum of members (`etcdctl endpoint status --cluster`)",
        )
    return Check("leader", Status.OK, f"leader is member {int(facts.leader or 0):x}")


def _probe_checks(facts: EndpointFacts) -> list[Check]:
    if facts.probe_error is not None:
        return [
            Check(
                "lock probe",
                Status.FAIL,
                f"could not take and release a probe lock: {facts.probe_error}",
                "check the member's health and the user's permissions on the keyspace",
            )
        ]
    trip = (facts.round_trip or 0.0) * 1000
    checks = [
        Check("lock probe", Status.OK, "took and released a probe lock on a 2 s lease"),
    ]
    message = f"the probe's put-if-absent transaction took {trip:.1f} ms (a Raft commit)"
    if trip > LATENCY_FAIL * 1000:
        checks.append(
            Check(
                "latency",
                Status.FAIL,
                message + ": slow enough to miss renewals and time out acquires",
                "check the members' disks (etcd fsyncs each commit) and the network between "
                "them and the workers",
            )
        )
    elif trip > LATENCY_WARN * 1000:
        checks.append(
            Check(
                "latency",
                Status.WARN,
                message + f": above {LATENCY_WARN * 1000:.0f} ms, every acquire pays it",
                "put etcd's data on SSDs, and the workers near the cluster",
            )
        )
    else:
        checks.append(Check("latency", Status.OK, message))
    return checks


def _check_members(facts: EndpointFacts) -> Check:
    count = len(facts.members)
    quorum = count // 2 + 1
    tolerated = count - quorum
    message = (
        f"{count} member(s) ({', '.join(facts.members)}), quorum {quorum}: tolerates "
        f"{tolerated} failed member(s)"
    )
    fix = (
        "run 3 or 5 members: a 3-member cluster tolerates 1 failure, a 5-member cluster 2 "
        "(locks stay held and takeable while a quorum is up)"
    )
    if count == 1:
        return Check(
            "members",
            Status.WARN,
            message + ": while it is down no lock can be taken, released or renewed",
            fix,
        )
    if count % 2 == 0:
        return Check(
            "members",
            Status.WARN,
            message + f", no more than {count - 1} members would",
            fix,
        )
    return Check("members", Status.OK, message)


def _check_endpoints(given: int, facts: EndpointFacts) -> Check:
    members = len(facts.members)
    if given < members:
        return Check(
            "endpoints",
            Status.WARN,
            f"{given} endpoint(s) given for {members} members: the client fails over only "
            "between the endpoints it is given, so with those members down it cannot reach the "
            "cluster although a quorum may still be up",
            "list every member's client URL: etcd://m1:2379,m2:2379,m3:2379",
        )
    return Check("endpoints", Status.OK, f"{given} endpoint(s) given for {members} member(s)")


def _check_one_cluster(answered: Sequence[EndpointFacts]) -> Check:
    clusters: dict[str, list[str]] = {}
    for facts in answered:
        clusters.setdefault(str(facts.cluster_id), []).append(facts.url)
    if len(clusters) > 1:
        listed = "; ".join(
            f"cluster {int(cid):x}: {', '.join(urls)}" for cid, urls in clusters.items()
        )
        return Check(
            "one cluster",
            Status.FAIL,
            f"the endpoints belong to {len(clusters)} different clusters ({listed}): the client "
            "fails over between them, and a lock taken on one cluster is not seen on another",
            "list the client URLs of one cluster's members only",
        )
    (cluster_id,) = clusters
    return Check(
        "one cluster",
        Status.OK,
        f"{len(answered)} endpoint(s) of cluster {int(cluster_id):x}",
    )
