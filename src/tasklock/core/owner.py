"""Owner tokens: 128 random bits from :mod:`secrets`, plus who holds the lock, readably.

A token looks like ``9f1c…e2 {"host":"web-1","pid":4242,"at":1795000000.123,"task":"3b7…"}``
(``at``: wall-clock time of the attempt that took the lock, for display and sorting only: a
waiter's retries restamp it, see :func:`restamped`). The random part makes it
unguessable and unique; the JSON part lets an operator (``tasklock ls``) see which host, process and
task holds a lock. The stored lock value adds ``#<fence>`` (see :mod:`tasklock.core.scripts`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _text
from typing import Any

from tasklock.core.pids import current_pid

__all__ = ["Holder", "new_token", "parse_value", "restamped", "token_id"]

_meta_cache: tuple[int, str] | None = None


def _process_meta() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _base_meta_prefix() -> str:
    # Cached per pid: hostname lookups are not free and a forked child must not report its parent.
    # The JSON object is left open so the acquisition time can be appended without re-encoding.
    global _meta_cache
    pid = current_pid()
    if _meta_cache is None or _meta_cache[0] != pid:
        _meta_cache = (pid, json.dumps(_process_meta(), separators=(",", ":"))[:-1])
    return _meta_cache[1]


def new_token(extra: Mapping[str, Any] | None = None) -> str:
    """A fresh owner token; ``extra`` (e.g. ``{"task": task_id}``) is added to the metadata."""
    meta = f'{_base_meta_prefix()},"at":{time.time():.3f}'
    if extra:
        meta += "," + _members(extra)
    return f"{secrets.token_hex(16)} {meta}}}"


def _members(extra: Mapping[str, Any]) -> str:
    """``extra`` as the members of a JSON object (no braces). Text keys and values, which is
    what the task layer passes on every call (``{"task": id, "name": name}``), skip
    :func:`json.dumps`'s machinery: the same text, for a fraction of its cost."""
    if all(type(k) is str and type(v) is str for k, v in extra.items()):
        return ",".join(f"{_text(k)}:{_text(v)}" for k, v in extra.items())
    return json.dumps(dict(extra), separators=(",", ":"), default=str)[1:-1]


_STAMP = re.compile(r'(?<=[{,])"at":[0-9]+(?:\.[0-9]+)?')


def restamped(token: str) -> str:
    """``token`` with its ``at`` moved to now: what a waiter's next attempt stores, so that a
    holder's age (``tasklock ls``, the admin page, the exporter) counts from the attempt that
    took the lock, not from when the waiting began. The random part, which names the waiter in
    a fair queue (:func:`token_id`), stays."""
    return _STAMP.sub(f'"at":{time.time():.3f}', token, count=1)


def token_id(token: str) -> str:
    """What names an owner whatever its ``at``: the token's random part (all of a token that has
    no metadata)."""
    return token.partition(" ")[0]


@dataclass(frozen=True)
class Holder:
    """What a lock value says about its holder."""

    value: str
    token: str
    fence: int | None
    meta: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.meta.items() if k != "at"]
        if self.fence is not None:
            parts.append(f"fence={self.fence}")
        return " ".join(parts) or self.token


def parse_value(value: bytes | str) -> Holder:
    """Read a stored lock value; values written by other lock libraries parse as a bare token."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    body, sep, fence_text = text.rpartition("#")
    fence: int | None = None
    # ASCII digits only, and no more than a 64-bit number has: "²" is a digit to isdigit() but
    # not to int(), and int() refuses numbers over 4,300 digits. A corrupt value is no fence.
    if sep and fence_text.isascii() and fence_text.isdigit() and len(fence_text) <= 20:
        fence = int(fence_text)
    else:
        body = text
    token, _, meta_text = body.partition(" ")
    meta: dict[str, Any] = {}
    if meta_text:
        try:
            loaded = json.loads(meta_text)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than Python recurses
            loaded = None
        if isinstance(loaded, dict):
            meta = loaded
    return Holder(value=text, token=token, fence=fence, meta=meta)
