"""The task layer's enqueue-time markers (``dedupe_enqueue``) on etcd.

A marker is a key whose value is the pending task's id, on a lease of its own (``pending_ttl``,
rounded up to whole seconds), so etcd removes a forgotten marker by itself, as Redis's PX does.
The three operations mirror the Redis scripts ``CLAIM`` and ``DELETE_IF`` (see
:mod:`tasklock.pending` for what each is for):

* :meth:`Markers.claim`: create the marker unless one exists; the id of a twin that holds it
  (None when it is this task's, or was just created).
* :meth:`Markers.renew`: the same, and give this task's marker a full TTL from now (etcd cannot
  lengthen a lease: the key moves to a fresh one in a transaction that checks it is still ours).
* :meth:`Markers.delete_if`: delete the marker only while it names this task, and revoke its
  lease (so leases do not pile up until their TTL).

Each is a transaction that compares before it writes, so two producers racing for one marker
get one winner, as with the Redis scripts. A lease granted for a write that then did not happen
is revoked at once.
"""

from __future__ import annotations

import base64
import contextlib
import math
from typing import Any

from tasklock.etcd import protocol
from tasklock.etcd.client import Client

__all__ = ["Markers"]


def _kv(reply: dict[str, Any]) -> dict[str, Any] | None:
    """The first key-value of a range reply, or of the range response inside a txn reply."""
    for response in reply.get("responses", []):
        for name in ("response_range", "response_delete_range", "response_put"):
            inner = response.get(name)
            if inner is None:
                continue
            kvs = inner.get("kvs") or inner.get("prev_kvs") or []
            if kvs:
                return dict(kvs[0])
            prev = inner.get("prev_kv")
            if prev:
                return dict(prev)
    return None


def _value(kv: dict[str, Any] | None) -> str | None:
    if kv is None:
        return None
    text = kv.get("value")
    return base64.b64decode(text).decode("utf-8", "replace") if text else ""


class Markers:
    """Enqueue-time markers on one etcd cluster (thread-safe: the client is)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def _grant(self, ttl_ms: int, what: str) -> int:
        seconds = max(1, math.ceil(ttl_ms / 1000))
        return protocol.lease_id(self.client.call(protocol.GRANT, {"TTL": str(seconds)}, what))

    def _revoke_quietly(self, lease: int, what: str) -> None:
        with contextlib.suppress(Exception):  # it expires by itself
            self.client.revoke(lease, what)

    def _put_if_absent(self, key: str, task_id: str, lease: int, what: str) -> dict[str, Any]:
        k = protocol.b64(key.encode())
        body = {
            "compare": [{"target": "CREATE", "key": k, "result": "EQUAL", "create_revision": "0"}],
            "success": [
                {
                    "request_put": {
                        "key": k,
                        "value": protocol.b64(task_id.encode()),
                        "lease": str(lease),
                    }
                }
            ],
            "failure": [{"request_range": {"key": k}}],
        }
        return self.client.call(protocol.TXN, body, what)

    def claim(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        """Mark ``key`` as pending under ``task_id`` for ``ttl_ms``; the id a twin's marker holds,
        or None (claimed now, or already this task's)."""
        lease = self._grant(ttl_ms, what)
        try:
            reply = self._put_if_absent(key, task_id, lease, what)
        except BaseException:
            self._revoke_quietly(lease, what)
            raise
        if reply.get("succeeded"):
            return None
        self._revoke_quietly(lease, what)
        current = _value(_kv(reply))
        if current is None:
            # Deleted between the compare and the read cannot happen in one txn; an empty
            # failure branch means the key vanished: claim again once.
            return self.claim(key, task_id, ttl_ms, what)
        return None if current == task_id else current

    def renew(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        """:meth:`claim`, and a full ``ttl_ms`` from now for a marker that names ``task_id``."""
        lease = self._grant(ttl_ms, what)
        k = protocol.b64(key.encode())
        mine = protocol.b64(task_id.encode())
        body = {
            "compare": [{"target": "VALUE", "key": k, "result": "EQUAL", "value": mine}],
            "success": [
                {"request_put": {"key": k, "value": mine, "lease": str(lease), "prev_kv": True}}
            ],
            "failure": [{"request_range": {"key": k}}],
        }
        try:
            reply = self.client.call(protocol.TXN, body, what)
            if reply.get("succeeded"):
                old = _kv(reply)
                if old is not None and int(old.get("lease", 0)):
                    self._revoke_quietly(int(old["lease"]), what)
                return None
            current = _value(_kv(reply))
            if current is not None:
                self._revoke_quietly(lease, what)
                return current
            # No marker (expired, or cleared as stale): claim it again on the fresh lease.
            reply = self._put_if_absent(key, task_id, lease, what)
        except BaseException:
            self._revoke_quietly(lease, what)
            raise
        if reply.get("succeeded"):
            return None
        self._revoke_quietly(lease, what)
        current = _value(_kv(reply))
        return None if current in (None, task_id) else current

    def delete_if(self, key: str, task_id: str, what: str) -> bool:
        """Delete the marker at ``key`` if it names ``task_id``; whether it did."""
        k = protocol.b64(key.encode())
        body = {
            "compare": [
                {
                    "target": "VALUE",
                    "key": k,
                    "result": "EQUAL",
                    "value": protocol.b64(task_id.encode()),
                }
            ],
            "success": [{"request_delete_range": {"key": k, "prev_kv": True}}],
        }
        reply = self.client.call(protocol.TXN, body, what)
        if not reply.get("succeeded"):
            return False
        old = _kv(reply)
        if old is not None and int(old.get("lease", 0)):
            self._revoke_quietly(int(old["lease"]), what)
        return True
