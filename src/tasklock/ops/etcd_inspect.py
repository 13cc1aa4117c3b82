"""tasklock's locks on etcd as an operator sees them: the etcd side of ``tasklock ls/show/release``.

:class:`EtcdStore` answers the same questions as the Redis store (:mod:`tasklock.ops.stores`), in
the same :class:`~tasklock.ops.inspect.LockInfo` and :class:`~tasklock.ops.inspect.KeyState`
rows, so the commands, their text and their ``--json`` are one code path for both backends.

The key layout of :mod:`tasklock.etcd` differs from Redis's in ways that decide what is read:

* A lock is the key ``<name>``; its value is the owner token alone (``<token> <JSON meta>``), and
  its fence is the key's ``create_revision``, not a ``#<fence>`` suffix: the fence shown is that
  revision. Its TTL is its lease's (``/v3/lease/timetolive``), in etcd's whole seconds.
* A Semaphore permit is the key ``<name>:permit:<i>``, the same kind of value on a lease of its
  own. ``ls`` shows it as Redis shows a permit: a row keyed by the semaphore's ``<name>``, kind
  "permit", with the count of live permits; ``show <name>`` lists them.
* Values that are not lock values (``dedupe_enqueue``'s pending markers hold a bare task id) are
  skipped, as on Redis, by the same strict parser (:func:`~tasklock.ops.inspect.parse_lock_value`).
* There is no fence counter key: the store's revision is the counter.

Listing is a range request over the prefix a glob pattern fixes (the whole keyspace for ``*``),
paged by key and pinned to the first page's revision (one consistent snapshot), filtered by the
pattern client-side with Redis's glob rules (:func:`glob_regex`), so ``--match`` means the same on
both backends.

Release deletes the key in a transaction that compares its ``create_revision`` and lease to what
was shown (a hold that expired and was taken again, or moved to a new lease by ``extend``, is left
alone), then revokes that lease: each hold has its own, and only the revoke makes the holder's
next keep-alive fail, so its watchdog reports the lock lost. Without it the holder would keep
renewing a lease that holds no key, believing it still holds the lock.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from tasklock.core.urls import redacted as redact_url
from tasklock.errors import BackendUnavailable, ConfigurationError
from tasklock.etcd import protocol
from tasklock.etcd.client import Client
from tasklock.ops.inspect import (
    KeyState,
    LockInfo,
    decode_key,
    key_bytes,
    key_text,
    newest_first,
    parse_lock_value,
)

__all__ = [
    "FENCE_NOTE",
    "STORE",
    "EtcdStore",
    "check_url",
    "glob_prefix",
    "glob_regex",
    "open_client",
    "prefix_range",
    "release_hold_txn",
    "run_doctor",
]

#: Keys per range request: few round trips, and a bounded answer from etcd.
PAGE = 500
#: Lease TTL lookups in flight at once (one request each: the gateway has no batch form).
TTL_WORKERS = 8
#: What ``show`` says instead of fence counters.
FENCE_NOTE = (
    "none on etcd: the fence is the key's create revision, which etcd itself keeps strictly "
    "increasing"
)
_PERMIT = re.compile(rb"(?P<name>.+):permit:(?P<index>[0-9]+)", re.DOTALL)
_SEMAPHORE = "semaphore"  # the KeyState type of a name that is no key but has permits


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _option_error(exc: ConfigurationError, url: str, option: str) -> ConfigurationError:
    """``exc`` naming ``option``, with the URL's password (if any) hidden."""
    message = str(exc).replace(url, redact_url(url)).replace(repr(url), repr(redact_url(url)))
    return ConfigurationError(f"{option}: {message}")


def check_url(url: str, option: str) -> str:
    """``url`` if it names etcd endpoints, else a ConfigurationError naming ``option``."""
    try:
        protocol.parse_endpoints(url)
    except ConfigurationError as exc:
        raise _option_error(exc, url, option) from None
    return url


def open_client(url: str, option: str) -> Client:
    """A client for the endpoints of ``url``; a bad URL is a ConfigurationError naming
    ``option``."""
    try:
        return Client(url)
    except ConfigurationError as exc:
        raise _option_error(exc, url, option) from None


# --- glob patterns ------------------------------------------------------------------------------


def glob_prefix(pattern: bytes) -> bytes:
    """The literal prefix every key matching ``pattern`` starts with: the bytes before its first
    ``*``, ``?`` or ``[``, backslash escapes resolved. It bounds the range that is read."""
    out = bytearray()
    i = 0
    while i < len(pattern):
        char = pattern[i : i + 1]
        if char in (b"*", b"?", b"["):
            break
        if char == b"\\" and i + 1 < len(pattern):
            i += 1
        out += pattern[i : i + 1]
        i += 1
    return bytes(out)


def _class_item(pattern: bytes, i: int) -> tuple[bytes, int]:
    """One item of a ``[...]`` class at ``i`` as regex text, and where the next one starts."""
    if pattern[i : i + 1] == b"\\" and i + 1 < len(pattern):
        return b"\\x%02x" % pattern[i + 1], i + 2
    if pattern[i + 1 : i + 2] == b"-" and i + 2 < len(pattern):
        low, high = sorted((pattern[i], pattern[i + 2]))  # Redis swaps a reversed range
        return b"\\x%02x-\\x%02x" % (low, high), i + 3
    return b"\\x%02x" % pattern[i], i + 1


def glob_regex(pattern: bytes) -> re.Pattern[bytes]:
    """``pattern`` as Redis's SCAN MATCH reads it (``stringmatchlen``), as a regex to fullmatch.

    Not :mod:`fnmatch`: its ``[!...]`` is Redis's ``[^...]`` and it has no backslash escapes,
    so a pattern would select other keys on etcd than on Redis. Here ``*`` ``?`` ``[a-z]``
    ``[^...]`` and ``\\x`` mean what they mean to Redis, on bytes.
    """
    out: list[bytes] = []
    i = 0
    while i < len(pattern):
        char = pattern[i : i + 1]
        if char == b"*":
            out.append(b".*")
        elif char == b"?":
            out.append(b".")
        elif char == b"\\" and i + 1 < len(pattern):
            i += 1
            out.append(b"\\x%02x" % pattern[i])
        elif char == b"[":
            i += 1
            negate = pattern[i : i + 1] == b"^"
            i += negate
            items: list[bytes] = []
            while i < len(pattern) and pattern[i : i + 1] != b"]":
                item, i = _class_item(pattern, i)
                items.append(item)
            if items:
                out.append(b"[" + (b"^" if negate else b"") + b"".join(items) + b"]")
            else:  # "[]" matches nothing, "[^]" any one byte (as in Redis)
                out.append(b"." if negate else b"(?!)")
        else:
            out.append(b"\\x%02x" % pattern[i])
        i += 1
    return re.compile(b"".join(out), re.DOTALL)


def prefix_range(prefix: bytes) -> tuple[bytes, bytes]:
    """``(key, range_end)`` of etcd's range over every key starting with ``prefix``: the whole
    keyspace (``"\\0"``, ``"\\0"``) for an empty one."""
    end = prefix.rstrip(b"\xff")
    if not end:
        return (prefix or b"\0"), b"\0"
    return prefix, end[:-1] + bytes([end[-1] + 1])


def release_hold_txn(key: bytes, create_revision: int, lease: int) -> dict[str, Any]:
    """Delete ``key`` only while it is the hold that was read: the same create revision (a hold
    taken again since has a new one) on the same lease (``extend`` moves a hold to a new lease,
    and the holder then renews that one: deleting the key would leave it renewing a lease that
    holds nothing, believing it still holds the lock)."""
    k = protocol.b64(key)
    created = {"target": "CREATE", "key": k, "result": "EQUAL"}
    created["create_revision"] = str(create_revision)
    return {
        "compare": [
            created,
            {"target": "LEASE", "key": k, "result": "EQUAL", "lease": str(lease)},
        ],
        "success": [{"request_delete_range": {"key": k}}],
    }


# --- holds --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Hold:
    """One lock or permit key as read: what release compares against, and its lease."""

    key: bytes  # the etcd key
    name: bytes  # the lock's key, or the permit's semaphore
    value: bytes
    lease: int
    create_revision: int
    permit: bool


def _hold(kv: dict[str, Any], as_permit: bool) -> _Hold | None:
    """The hold in one kv of a range reply, or None when its value is no tasklock lock value.
    ``as_permit``: a ``<name>:permit:<i>`` key is read as a permit of ``<name>``."""
    key = _unb64(kv.get("key"))
    value = _unb64(kv.get("value"))
    if parse_lock_value(value) is None:
        return None
    match = _PERMIT.fullmatch(key) if as_permit else None
    return _Hold(
        key,
        match["name"] if match else key,
        value,
        int(kv.get("lease", 0)),
        int(kv.get("create_revision", 0)),
        match is not None,
    )


class EtcdStore:
    """The :class:`tasklock.ops.stores.Store` of an etcd cluster (see the module).

    It remembers each hold it read by fence (a create revision is unique across the cluster), so
    a release compares the key with exactly what was shown.
    """

    fence_note: str | None = FENCE_NOTE

    def __init__(self, url: str, option: str) -> None:
        self.option = option
        self.where = redact_url(url)
        self.client = open_client(url, option)
        self._holds: dict[int, _Hold] = {}

    def close(self) -> None:
        self.client.close()

    # -- requests ----------------------------------------------------------------------------
    def _call(self, path: str, body: dict[str, Any], what: str) -> dict[str, Any]:
        """POST to the gateway; an answer that is not etcd's (another HTTP server, a Redis port)
        is an error naming the option, never a traceback."""
        try:
            status, content, endpoint = self.client.raw(path, body, what)
        except BackendUnavailable as exc:
            text = str(exc).rstrip(".")
            # Refused everywhere: nothing listens. Accepted and no answer: something that is
            # not etcd's gateway (a Redis port resets the connection), or a stalled member.
            refused = "unreachable" in text and "no answer" not in text
            hint = "" if refused else "; is it etcd's client port (etcd >= 3.4)?"
            raise BackendUnavailable(f"{self.option}={self.where!r}: {text}{hint}") from None
        try:
            reply = json.loads(content)
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or ("header" not in reply and "code" not in reply):
            raise ConfigurationError(
                f"{self.option}={self.where!r}: {endpoint} answered HTTP {status} to {path}, not "
                "as etcd's v3 JSON gateway: check that the URL names etcd's client port "
                "(etcd >= 3.4)"
            )
        error = protocol.error_from_reply(status, content, endpoint, what)
        if error is not None:
            raise error
        return reply

    def _range(self, start: bytes, end: bytes, what: str) -> Iterator[dict[str, Any]]:
        """Every kv from ``start`` up to ``end``, a page at a time, all at one revision."""
        body: dict[str, Any] = {"key": protocol.b64(start), "range_end": protocol.b64(end)}
        body["limit"] = str(PAGE)
        while True:
            reply = self._call(protocol.RANGE, body, what)
            kvs = reply.get("kvs") or []
            yield from kvs
            if not reply.get("more") or not kvs:
                return
            body["key"] = protocol.b64(_unb64(kvs[-1]["key"]) + b"\0")
            body["revision"] = str(protocol.reply_revision(reply))

    def _ttl_ms(self, lease: int) -> int | None:
        """The lease's time left in ms; None for no lease; -1 when it is gone (so is the key)."""
        if not lease:
            return None
        what = f"reading lease {lease:x}"
        ttl = int(self._call(protocol.TIMETOLIVE, {"ID": str(lease)}, what).get("TTL", 0))
        return -1 if ttl < 0 else ttl * 1000

    def _infos(self, holds: Sequence[_Hold]) -> list[LockInfo]:
        """LockInfo rows of ``holds`` (TTLs read, expired ones dropped; each permit counting the
        live permits of its semaphore), remembered for :meth:`release`."""
        with ThreadPoolExecutor(max_workers=max(1, min(TTL_WORKERS, len(holds)))) as pool:
            ttls = list(pool.map(self._ttl_ms, [hold.lease for hold in holds]))
        live = [(hold, ttl) for hold, ttl in zip(holds, ttls, strict=True) if ttl != -1]
        counts: dict[bytes, int] = {}
        for hold, _ in live:
            if hold.permit:
                counts[hold.name] = counts.get(hold.name, 0) + 1
        infos = []
        for hold, ttl in live:
            parsed = parse_lock_value(hold.value)
            assert parsed is not None  # _hold kept lock values only
            holder = replace(parsed, fence=hold.create_revision)
            count = counts[hold.name] if hold.permit else None
            infos.append(LockInfo(decode_key(hold.name), hold.value, holder, ttl, count))
            self._holds[hold.create_revision] = hold
        return infos

    # -- the Store interface -----------------------------------------------------------------
    def list_locks(self, match: bytes) -> list[LockInfo]:
        """Every held lock and live permit whose key (or, for a permit, semaphore name) matches
        the glob ``match``, newest first."""
        regex = glob_regex(match)
        start, end = prefix_range(glob_prefix(match))
        holds = []
        for kv in self._range(start, end, f"listing locks matching '{key_text(match)}'"):
            hold = _hold(kv, as_permit=True)
            if hold is not None and (regex.fullmatch(hold.name) or regex.fullmatch(hold.key)):
                holds.append(hold)
        return sorted(self._infos(holds), key=newest_first)

    def read(self, key: str) -> KeyState:
        """What the key ``key`` holds: a lock, another value, nothing; or, when there is no such
        key but live permits of a semaphore of that name, the type ``"semaphore"``."""
        raw = key_bytes(key)
        what = f"reading '{key_text(key)}'"
        kvs = self._call(protocol.RANGE, {"key": protocol.b64(raw)}, what).get("kvs") or []
        if kvs:
            value = _unb64(kvs[0].get("value"))
            hold = _hold(kvs[0], as_permit=False)
            infos = self._infos([hold]) if hold is not None else []
            if hold is None or infos:
                lock = infos[0] if infos else None
                return KeyState(key, "string", value, lock.ttl_ms if lock else None, lock)
        if self.permits(key):
            return KeyState(key, _SEMAPHORE, None, None)
        return KeyState(key, "none", None, None)

    def is_semaphore(self, state: KeyState) -> bool:
        return state.type == _SEMAPHORE

    def permits(self, key: str) -> list[LockInfo]:
        """The live permits of the semaphore ``key``, first to free first."""
        name = key_bytes(key)
        holds = []
        for kv in self._range(*prefix_range(name + b":permit:"), f"reading '{key_text(key)}'"):
            hold = _hold(kv, as_permit=True)
            if hold is not None and hold.permit and hold.name == name:
                holds.append(hold)
        infos = self._infos(holds)
        return sorted(infos, key=lambda p: (p.ttl_ms is None, p.ttl_ms or 0, p.fence or 0))

    def fence_counters(
        self, key: str
    ) -> tuple[dict[str, int | None], dict[str, str], list[dict[str, Any]]]:
        return {}, {}, []

    def release(self, lock: LockInfo) -> bool:
        """Delete the key of ``lock`` if it is still the hold that was read, then revoke its
        lease (see the module); False, nothing touched, when it changed."""
        hold = self._holds[lock.fence or 0]
        body = release_hold_txn(hold.key, hold.create_revision, hold.lease)
        shown = f"'{key_text(decode_key(hold.key))}'"
        if not self._call(protocol.TXN, body, f"releasing {shown}").get("succeeded"):
            return False
        if hold.lease:
            try:
                self.client.revoke(hold.lease, f"revoking the lease of {shown}")
            except (BackendUnavailable, ConfigurationError) as exc:
                raise BackendUnavailable(
                    f"{shown} was deleted, but its lease {hold.lease:x} could not be revoked "
                    f"({exc}): its holder learns that it lost the lock only when that lease "
                    "expires; revoke it with `etcdctl lease revoke`"
                ) from None
        return True

    def release_permit(self, key: str, permit: LockInfo) -> int:
        """1 when the permit was released (its delete wakes the semaphore's watchers), 0 when
        it changed since it was read."""
        return 1 if self.release(permit) else 0


def run_doctor(urls: Sequence[str], option: str = "--url") -> Any:
    """The etcd doctor (:mod:`tasklock.ops.etcd_doctor`), as the backend registry's ops module
    offers it."""
    from tasklock.ops.etcd_doctor import run_doctor as etcd_doctor

    return etcd_doctor(urls, option)


#: The :class:`tasklock.ops.stores.Store` of this backend, for the registry.
STORE = EtcdStore
