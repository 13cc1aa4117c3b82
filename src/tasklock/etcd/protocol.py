"""etcd's v3 JSON gateway, with no I/O: endpoints, request bodies, replies and errors.

Every function here is pure: the transports (:mod:`tasklock.etcd.client`, and later an asyncio
one) only send what these build and hand back what the server answered. Keys and values travel
base64-encoded in the gateway's JSON; 64-bit numbers (revisions, lease IDs, TTLs) travel as
strings, and fields equal to their zero value (``succeeded: false``, ``TTL: 0``) are left out.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tasklock.errors import BackendUnavailable, ConfigurationError

__all__ = [
    "DEFAULT_PORT",
    "GRANT",
    "KEEPALIVE",
    "RANGE",
    "REVOKE",
    "TIMETOLIVE",
    "TXN",
    "WATCH",
    "Holder",
    "acquire_txn",
    "b64",
    "check_revoke",
    "error_from_reply",
    "holder_of",
    "holders_of",
    "is_lease_not_found",
    "keepalive_ttl",
    "lease_id",
    "lease_ttl",
    "parse_endpoints",
    "permit_count",
    "permit_key",
    "permit_range",
    "permit_slots",
    "permit_txn",
    "read_txn",
    "release_txn",
    "reply_of",
    "reply_revision",
    "swap_lease_txn",
    "watch_request",
    "watch_woken",
]

DEFAULT_PORT = 2379

GRANT = "/v3/lease/grant"
REVOKE = "/v3/lease/revoke"
KEEPALIVE = "/v3/lease/keepalive"
TIMETOLIVE = "/v3/lease/timetolive"
RANGE = "/v3/kv/range"
TXN = "/v3/kv/txn"
WATCH = "/v3/watch"

_SCHEMES = {"etcd": "http", "etcds": "https", "http": "http", "https": "https"}


# -- endpoints ---------------------------------------------------------------------------------
def parse_endpoints(spec: str | Sequence[str]) -> list[str]:
    """Base URLs (``http://host:port``) from ``etcd://h1:2379,h2:2379`` (``etcds://`` for TLS),
    a comma-separated list of ``http(s)://host:port`` URLs, or a list of either.

    A ConfigurationError names the URL and what is wrong with it.
    """
    items: list[str]
    if isinstance(spec, str):
        items = [spec]
    elif isinstance(spec, Sequence) and all(isinstance(item, str) for item in spec):
        items = list(spec)
    else:
        raise ConfigurationError(
            f"etcd endpoints must be a URL such as 'etcd://10.0.0.1:2379,10.0.0.2:2379', a list "
            f"of URLs, or a tasklock.etcd client, got {spec!r}"
        )
    endpoints: list[str] = []
    for item in items:
        endpoints.extend(_parse_one(item))
    if not endpoints:
        raise ConfigurationError(f"no etcd endpoint in {spec!r}")
    return list(dict.fromkeys(endpoints))


def _parse_one(url: str) -> list[str]:
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise ConfigurationError(
            f"etcd URL {url!r} must start with etcd://, etcds://, http:// or https:// "
            "(e.g. 'etcd://10.0.0.1:2379,10.0.0.2:2379')"
        )
    scheme = scheme.lower()
    out: list[str] = []
    # etcd://h1,h2 lists hosts after one scheme; http://a,http://b lists whole URLs.
    parts = rest.split(",")
    for part in parts:
        part = part.strip()
        if "://" in part:
            out.extend(_parse_one(part))
            continue
        out.append(_host_port(url, scheme, part))
    return out


def _host_port(url: str, scheme: str, netloc: str) -> str:
    if not netloc:
        raise ConfigurationError(f"etcd URL {url!r} has an empty host")
    split = urlsplit(f"//{netloc}")
    if split.path not in ("", "/") or split.query or split.fragment:
        raise ConfigurationError(
            f"etcd URL {url!r}: {netloc!r} has a path or query; give host:port only "
            "(the v3 gateway's paths are fixed)"
        )
    if split.username is not None or split.password is not None:
        raise ConfigurationError(
            f"etcd URL {url!r}: credentials in the URL are not supported (etcd auth is not "
            "implemented by tasklock.etcd yet)"
        )
    host = split.hostname
    if not host:
        raise ConfigurationError(f"etcd URL {url!r}: {netloc!r} has no host")
    try:
        port = split.port
    except ValueError:
        raise ConfigurationError(
            f"etcd URL {url!r}: {netloc!r} has an invalid port (1-65535)"
        ) from None
    if port == 0:
        raise ConfigurationError(f"etcd URL {url!r}: {netloc!r} has an invalid port (1-65535)")
    host_text = f"[{host}]" if ":" in host else host
    return f"{_SCHEMES[scheme]}://{host_text}:{port or DEFAULT_PORT}"


# -- encoding ----------------------------------------------------------------------------------
def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def lease_ttl(seconds: float) -> int:
    """A TTL in etcd's unit, whole seconds: rounded up, so a lease never expires early."""
    if seconds < 1:
        raise ConfigurationError(
            f"etcd leases are in whole seconds, at least 1; got a TTL of {seconds!r} s"
        )
    return math.ceil(seconds)


# -- requests ----------------------------------------------------------------------------------
def permit_range(key: bytes) -> tuple[bytes, bytes]:
    """The range [start, end) that holds the permits of a semaphore named ``key``: every key
    ``<name>:permit:<i>`` (``;`` is the byte after ``:``, so the range ends right after them)."""
    return key + b":permit:", key + b":permit;"


def permit_key(key: bytes, slot: int) -> bytes:
    """Permit ``slot`` (0 <= slot < limit) of the semaphore named ``key``."""
    return b"%s:permit:%d" % (key, slot)


def _absent(key: bytes, range_end: bytes | None = None) -> dict[str, Any]:
    """Compare: no key at ``key`` (or none in [key, range_end)). etcd compares every key of a
    range, and an empty range as one zero KeyValue, whose create revision is 0."""
    compare = {"target": "CREATE", "key": b64(key), "result": "EQUAL", "create_revision": "0"}
    if range_end is not None:
        compare["range_end"] = b64(range_end)
    return compare


def _range(
    key: bytes, range_end: bytes | None = None, *, count_only: bool = False, keys_only: bool = False
) -> dict[str, Any]:
    request: dict[str, Any] = {"key": b64(key)}
    if range_end is not None:
        request["range_end"] = b64(range_end)
    if count_only:
        request["count_only"] = True
    if keys_only:
        request["keys_only"] = True
    return {"request_range": request}


def acquire_txn(key: bytes, value: bytes, lease: int) -> dict[str, Any]:
    """Create ``key`` with ``value`` on ``lease`` if neither it nor any permit of a semaphore of
    the same name exists; else read it (and count the permits: a waiter then watches them)."""
    permits = permit_range(key)
    return {
        "compare": [_absent(key), _absent(*permits)],
        "success": [{"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}}],
        "failure": [_range(key), _range(*permits, count_only=True)],
    }


def permit_txn(key: bytes, slot: int, value: bytes, lease: int) -> dict[str, Any]:
    """Create permit ``slot`` of the semaphore ``key`` with ``value`` on ``lease`` if it is free
    and no lock of the same name is held; else count the lock key and list the permits' keys
    (so the next try picks a free slot)."""
    permit = permit_key(key, slot)
    return {
        "compare": [_absent(key), _absent(permit)],
        "success": [
            {"request_put": {"key": b64(permit), "value": b64(value), "lease": str(lease)}}
        ],
        "failure": [_range(key, count_only=True), _range(*permit_range(key), keys_only=True)],
    }


def read_txn(key: bytes) -> dict[str, Any]:
    """Read the lock key and every permit of the name in one revision (a read-only txn with no
    compare: served as a linearizable read, not a Raft write)."""
    return {"success": [_range(key), _range(*permit_range(key))]}


def release_txn(key: bytes, lease: int) -> dict[str, Any]:
    """Delete ``key`` only while it is attached to ``lease`` (i.e. still this hold's)."""
    k = b64(key)
    return {
        "compare": [{"target": "LEASE", "key": k, "result": "EQUAL", "lease": str(lease)}],
        "success": [{"request_delete_range": {"key": k}}],
    }


def swap_lease_txn(key: bytes, value: bytes, old: int, new: int) -> dict[str, Any]:
    """Move ``key`` from lease ``old`` to ``new`` if it is still on ``old`` (extend: etcd cannot
    change a lease's TTL). A put keeps the key's create revision, so the fence stays."""
    k = b64(key)
    return {
        "compare": [{"target": "LEASE", "key": k, "result": "EQUAL", "lease": str(old)}],
        "success": [{"request_put": {"key": k, "value": b64(value), "lease": str(new)}}],
    }


def watch_request(
    key: bytes, start_revision: int, range_end: bytes | None = None
) -> dict[str, Any]:
    """Watch ``key`` (or the range [key, range_end)) for deletes from ``start_revision`` on
    (puts are filtered out)."""
    request = {"key": b64(key), "start_revision": str(start_revision), "filters": ["NOPUT"]}
    if range_end is not None:
        request["range_end"] = b64(range_end)
    return {"create_request": request}


# -- replies -----------------------------------------------------------------------------------
def reply_revision(reply: dict[str, Any]) -> int:
    return int(reply.get("header", {}).get("revision", 0))


def lease_id(reply: dict[str, Any]) -> int:
    """The ID of a granted lease."""
    return int(reply["ID"])


def keepalive_ttl(reply: dict[str, Any]) -> int:
    """The TTL a keep-alive renewed the lease to; 0 when the lease was gone (expired, revoked)."""
    result = reply.get("result", reply)
    return int(result.get("TTL", 0))


@dataclass(frozen=True)
class Holder:
    """The lock key as a read found it."""

    value: bytes
    lease: int
    create_revision: int
    key: bytes = b""


def holder_of(reply: dict[str, Any]) -> Holder | None:
    """The key from a range reply, or from the range in a failed acquire txn's reply."""
    if "responses" in reply:
        for response in reply.get("responses", []):
            if "response_range" in response:
                return holder_of(response["response_range"])
        return None
    kvs = reply.get("kvs") or []
    if not kvs:
        return None
    return _holder(kvs[0])


def _holder(kv: dict[str, Any]) -> Holder:
    return Holder(
        _unb64(kv.get("value")),
        int(kv.get("lease", 0)),
        int(kv["create_revision"]),
        _unb64(kv.get("key")),
    )


def _ranges(reply: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two range replies of a txn that read the lock key then the permits ({}: none)."""
    found = [r["response_range"] for r in reply.get("responses", []) if "response_range" in r]
    found += [{}, {}]
    return found[0], found[1]


def holders_of(reply: dict[str, Any]) -> tuple[Holder | None, list[Holder]]:
    """A :func:`read_txn` reply: the lock key's holder (or None) and the permits' holders."""
    lock, permits = _ranges(reply)
    kvs = lock.get("kvs") or []
    return (_holder(kvs[0]) if kvs else None), [_holder(kv) for kv in permits.get("kvs") or []]


def permit_count(reply: dict[str, Any]) -> int:
    """How many permits a failed :func:`acquire_txn` counted."""
    return int(_ranges(reply)[1].get("count", 0))


def permit_slots(reply: dict[str, Any], key: bytes) -> tuple[bool, set[int]]:
    """A failed :func:`permit_txn`: whether the lock key is held, and the permit slots taken.
    Keys in the range that are not a slot number (written by something else) are skipped."""
    lock, permits = _ranges(reply)
    start = len(permit_range(key)[0])
    slots: set[int] = set()
    for kv in permits.get("kvs") or []:
        suffix = _unb64(kv.get("key"))[start:]
        if suffix.isdigit() and len(suffix) < 10:
            slots.add(int(suffix))
    return int(lock.get("count", 0)) > 0, slots


def watch_woken(line: bytes) -> bool | None:
    """One line of a watch stream: True when a waiter must look again (a delete event, or the
    watch was cancelled or compacted away), None for nothing of note (the creation notice)."""
    if not line.strip():
        return None
    message = json.loads(line)
    if "error" in message:
        return True
    result = message.get("result", {})
    if result.get("events") or result.get("canceled") or result.get("compact_revision"):
        return True
    return None


# gRPC status codes that mean a setting is wrong (nothing a retry fixes).
_SETTING_CODES = {3: "invalid argument", 7: "permission denied", 16: "unauthenticated"}


def error_from_reply(status: int, body: bytes, endpoint: str, what: str) -> Exception | None:
    """The tasklock error for a non-2xx gateway reply (None for success)."""
    if 200 <= status < 300:
        return None
    try:
        message = json.loads(body)
        code = int(message.get("code", 0))
        text = str(message.get("message") or message.get("error") or "")
    except (ValueError, AttributeError):
        code, text = 0, body[:200].decode("utf-8", "replace").strip()
    if status == 404 and not code:
        return ConfigurationError(
            f"{endpoint} answered 404 while {what}: not an etcd v3 JSON gateway (etcd >= 3.4 "
            "serves it on the client port)"
        )
    if code in _SETTING_CODES:
        return ConfigurationError(
            f"etcd at {endpoint} refused {what} ({_SETTING_CODES[code]}): {text}"
        )
    return BackendUnavailable(f"etcd at {endpoint} failed {what} (HTTP {status}): {text}")


def is_lease_not_found(status: int, body: bytes) -> bool:
    if status < 300:
        return False
    try:
        return int(json.loads(body).get("code", 0)) == 5
    except (ValueError, AttributeError):
        return False


def reply_of(status: int, body: bytes, endpoint: str, what: str) -> dict[str, Any]:
    """A unary call's parsed reply; etcd's errors raised as tasklock errors (both clients)."""
    error = error_from_reply(status, body, endpoint, what)
    if error is not None:
        raise error
    reply: dict[str, Any] = json.loads(body)
    return reply


def check_revoke(status: int, body: bytes, endpoint: str, what: str) -> None:
    """A lease revoke's reply: a lease already gone (expired, revoked) is fine; any other error
    is raised as a tasklock error (both clients)."""
    if is_lease_not_found(status, body):
        return
    error = error_from_reply(status, body, endpoint, what)
    if error is not None:
        raise error
