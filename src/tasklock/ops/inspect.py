"""Reading tasklock's lock keys as an operator sees them: who holds what, for how long, fenced how.

Only values that tasklock wrote are treated as locks: ``<32 hex token> <JSON owner metadata>``
followed by ``#<fence>`` (see :mod:`tasklock.core.owner` and :mod:`tasklock.core.scripts`). That
filter is what keeps fence counters (integers), enqueue markers (a task id) and other libraries'
keys out of ``tasklock ls``, and what stops ``tasklock release`` from deleting a key tasklock did
not write. A Redlock node holds the bare ``<token> <meta>`` (no fence yet) for the moment between
its two rounds, so a missing fence is accepted and shown as unknown.

Listing uses SCAN (never KEYS, which blocks the server) with ``TYPE string`` where the server
supports it (Redis 6.0+), and reads each page's values and TTLs in one pipelined round trip. A
Semaphore's permits (members of a sorted set, the same values) are read by
:mod:`tasklock.ops.permits`, which gives them as :class:`LockInfo` rows too.

Keys are any bytes. Here they are ``str`` decoded from UTF-8 with ``surrogateescape`` (each byte
that is not UTF-8 becomes one lone surrogate, so nothing is lost and :func:`key_bytes` gives the
bytes back). People see them through :func:`key_text` and type them back through
:func:`key_from_text`, one the inverse of the other (see :func:`key_text` for the form), so every
key ``tasklock ls`` prints is one that ``show`` and ``release`` find.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions as redis_errors

from tasklock.core.connection import backend_errors
from tasklock.core.keys import fence_key_for, wake_channel
from tasklock.core.owner import Holder, parse_value
from tasklock.core.scripts import RELEASE

__all__ = [
    "KeyState",
    "LockInfo",
    "fence_counter_keys",
    "key_bytes",
    "key_from_text",
    "key_text",
    "list_locks",
    "newest_first",
    "parse_lock_value",
    "printable",
    "read_fence_counters",
    "read_key",
    "release_if_unchanged",
    "scan_pages",
]

#: Keys per SCAN call: large enough for few round trips, small enough not to stall the server.
SCAN_COUNT = 1000

_TOKEN = re.compile(r"[0-9a-f]{32}")
#: The latest acquisition time shown (9999-12-31 23:59:59 UTC, the last second ``time.strftime``
#: can print); a holder's ``at`` outside 0 .. this is unknown, not an OverflowError.
_LAST_SHOWN_AT = 253402300799.0
#: Digits a counter may have to be read as one (a fence is at most 19; Python refuses to convert
#: strings of over 4,300 digits).
_COUNTER_DIGITS = 40
# The task layer's execution lock: <prefix>:{<task name>}:lock:<digest>, with its fence counter
# at <prefix>:{<task name>}:fence (one counter per task name, in the lock's cluster slot).
_TASK_LOCK_KEY = re.compile(r"(?P<base>.*\{[^{}]+\}):lock:[^{}]+")


# --- keys as text ---------------------------------------------------------------------------------

#: Characters written as a named escape (the backslash first: it starts every escape).
_NAMED_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_NAMED_UNESCAPES = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
#: What the form is, for the error that refuses a malformed escape.
_KEY_FORM = (
    "keys are read as `tasklock ls` prints them: \\\\ is one backslash, \\n \\r \\t a newline, "
    "carriage return and tab, \\xNN a byte (one that is not UTF-8, or a control character), "
    "\\uNNNN and \\UNNNNNNNN a character by its code point"
)


def _escape(text: str, *, backslashes: bool) -> str:
    out: list[str] = []
    last = len(text) - 1
    for i, char in enumerate(text):
        code = ord(char)
        if char in _NAMED_ESCAPES and (backslashes or char != "\\"):
            out.append(_NAMED_ESCAPES[char])
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char == " " and (i == 0 or i == last):  # invisible at either end of a column
            out.append("\\x20")
        elif char.isprintable():
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


def key_text(key: bytes | str) -> str:
    """``key`` as people see it: one line of printable text that :func:`key_from_text` turns back
    into exactly these bytes.

    Printable characters stand for themselves, spaces included (a space at either end is written
    ``\\x20``, since a padded column would hide it). A backslash is ``\\\\``; a newline, carriage
    return and tab are ``\\n``, ``\\r``, ``\\t``; any other control character, and any byte that
    is not UTF-8, is ``\\xNN`` (a byte); any other character that does not print (an invisible
    separator, a character not yet assigned) is ``\\uNNNN`` or ``\\UNNNNNNNN``. These are Python's
    escapes, except that ``\\xNN`` always means one byte, so a key never has two spellings that
    differ in what they find. ``str`` keys are the ``surrogateescape`` form (see the module).
    """
    if isinstance(key, bytes):
        key = key.decode("utf-8", "surrogateescape")
    if key.isprintable() and "\\" not in key and not key.startswith(" ") and not key.endswith(" "):
        return key  # nearly every key: nothing to escape
    return _escape(key, backslashes=True)


def printable(text: str) -> str:
    """``text`` with what does not print escaped as in :func:`key_text`, backslashes left alone:
    for values that are only read (holder metadata), never typed back."""
    if text.isprintable():
        return text
    return _escape(text, backslashes=False)


def key_from_text(text: str) -> str:
    """The key (``surrogateescape`` form) that :func:`key_text` printed as ``text``; the inverse.

    ``text`` may also hold lone surrogates ``\\udc80``-``\\udcff``: Python's form of argv bytes
    that are not UTF-8, so a key typed as the raw bytes (``$'bin-\\xff'`` in bash) is found too.
    A malformed escape (``\\q``, a trailing backslash, ``\\xZZ``, ``\\ud800``) is a ValueError
    that says how keys are written: a backslash typed as itself would otherwise name another key.
    """
    if "\\" not in text:
        _check_characters(text, text)
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        kind = text[i + 1 : i + 2]
        if kind in _NAMED_UNESCAPES:
            out.append(_NAMED_UNESCAPES[kind])
            i += 2
            continue
        width = _HEX_ESCAPES.get(kind)
        digits = text[i + 2 : i + 2 + width] if width else ""
        if (
            not width
            or len(digits) != width
            or not all(c in "0123456789abcdefABCDEF" for c in digits)
        ):
            shown = printable(text[i : i + 2 + (width or 0)])
            raise ValueError(f"'{printable(text)}' has a malformed escape '{shown}': {_KEY_FORM}")
        code = int(digits, 16)
        if kind == "x":
            out.append(chr(code) if code < 0x80 else chr(0xDC00 + code))
        elif code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            shown = text[i : i + 2 + width]
            raise ValueError(
                f"'{printable(text)}' has '{shown}', which is not a character: {_KEY_FORM}"
            )
        else:
            out.append(chr(code))
        i += 2 + width
    key = "".join(out)
    _check_characters(key, text)
    return key


def _check_characters(key: str, text: str) -> None:
    """Lone surrogates other than surrogateescape's stand for no byte: refuse them here, not as
    a UnicodeEncodeError when the key is sent."""
    for char in key:
        if 0xD800 <= ord(char) <= 0xDFFF and not 0xDC80 <= ord(char) <= 0xDCFF:
            raise ValueError(
                f"'{printable(text)}' holds {char!r}, which is not a character: {_KEY_FORM}"
            )


def key_bytes(key: str) -> bytes:
    """The bytes of a key in the ``surrogateescape`` form, as Redis stores them."""
    return key.encode("utf-8", "surrogateescape")


# --- lock values ----------------------------------------------------------------------------------


def parse_lock_value(value: bytes | str) -> Holder | None:
    """The holder described by ``value`` if tasklock wrote it as a lock value, else None.

    Stricter than :func:`tasklock.core.owner.parse_value` (which reads any value as a bare token):
    the token must be 32 lowercase hex digits and the metadata a JSON object naming host and pid.
    Any value a server can hold gives an answer, never an exception: a fence of digits that are
    not ASCII (``#²``) or too many of them, JSON nested too deep to read, are simply not locks.
    """
    try:
        holder = parse_value(value)
    except (ValueError, RecursionError):
        return None
    if not _TOKEN.fullmatch(holder.token):
        return None
    if "host" not in holder.meta or "pid" not in holder.meta:
        return None
    return holder


def decode_key(key: bytes | str) -> str:
    """A key as Redis sent it, in the ``surrogateescape`` form (see the module)."""
    return key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key


@dataclass(frozen=True)
class LockInfo:
    """One held lock, or one live permit of a Semaphore: its key, the raw stored value (the
    permit's member), the parsed holder and the TTL left (the permit's own, for a permit).

    ``key`` is in the ``surrogateescape`` form (see the module); show it with :func:`key_text`.
    """

    key: str
    raw_value: bytes
    holder: Holder
    ttl_ms: int | None  # None: the key has no TTL (tasklock never writes one without)
    #: For a Semaphore's permit, how many live tasklock permits its set held when read; None for
    #: a lock.
    permits: int | None = None

    @property
    def kind(self) -> str:
        """``"lock"`` or ``"permit"`` (one of a Semaphore's)."""
        return "lock" if self.permits is None else "permit"

    @property
    def fence(self) -> int | None:
        return self.holder.fence

    @property
    def meta(self) -> dict[str, Any]:
        return self.holder.meta

    @property
    def host(self) -> str | None:
        value = self.meta.get("host")
        return None if value is None else str(value)

    @property
    def pid(self) -> int | None:
        value = self.meta.get("pid")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def task(self) -> str | None:
        """The task or job id, for locks taken by the task layer."""
        value = self.meta.get("task")
        return None if value is None else str(value)

    @property
    def task_name(self) -> str | None:
        value = self.meta.get("name")
        return None if value is None else str(value)

    @property
    def acquired_at(self) -> float | None:
        """Wall-clock acquisition time on the holder's host (display and ordering only); None
        when the metadata has none, or one no clock gives (before 1970, after the year 9999,
        not finite), which no date could be printed for."""
        value = self.meta.get("at")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if not math.isfinite(value) or not 0 <= value <= _LAST_SHOWN_AT:
            return None
        return float(value)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; the field names are a stable interface for scripts. ``key`` is the
        key as ``tasklock ls`` prints it (:func:`key_text`), the form ``show`` and ``release``
        take: the key itself unless it has a backslash or characters that do not print.
        ``kind`` is ``"lock"`` or ``"permit"``; ``permits`` the live permits of a permit's
        semaphore (None for a lock)."""
        return {
            "key": key_text(self.key),
            "host": self.host,
            "pid": self.pid,
            "task": self.task,
            "task_name": self.task_name,
            "acquired_at": self.acquired_at,
            "ttl_ms": self.ttl_ms,
            "fence": self.fence,
            "token": self.holder.token,
            "meta": self.meta,
            "value": self.holder.value,
            "kind": self.kind,
            "permits": self.permits,
        }


def _lock_info(key: bytes | str, value: Any, pttl: Any) -> LockInfo | None:
    """A LockInfo from one GET + PTTL answer, or None when it is not a held tasklock lock."""
    if not isinstance(value, bytes | str) or isinstance(pttl, BaseException):
        return None  # WRONGTYPE (no TYPE filter on old servers) or the key vanished
    if pttl == -2:
        return None  # expired between GET and PTTL
    holder = parse_lock_value(value)
    if holder is None:
        return None
    raw = value.encode() if isinstance(value, str) else value
    return LockInfo(decode_key(key), raw, holder, int(pttl) if pttl >= 0 else None)


def scan_pages(client: Any, match: str | bytes, kind: str = "string") -> Iterator[list[bytes]]:
    """Pages of keys matching ``match``, keys of Redis type ``kind`` only when the server can
    filter by type (Redis 6.0+); on older servers every key, for the caller's reads to sort out.

    A Redis Cluster client is scanned master by master: SCAN walks one node's keys with a cursor
    of its own (redis-py's cluster SCAN answers a cursor per node, which cannot be paged as one).
    The caller's reads of a page then go through the cluster client, which routes each key."""
    primaries = getattr(client, "get_primaries", None)
    if primaries is not None:
        for node in primaries():
            yield from _scan_node(client.get_redis_connection(node), match, kind)
        return
    yield from _scan_node(client, match, kind)


def _scan_node(client: Any, match: str | bytes, kind: str) -> Iterator[list[bytes]]:
    type_filter: str | None = kind
    cursor = 0
    while True:
        try:
            cursor, keys = client.scan(cursor, match=match, count=SCAN_COUNT, _type=type_filter)
        except redis_errors.ResponseError:
            if type_filter is None or cursor != 0:
                raise
            type_filter = None  # Redis < 6.0 has no TYPE option: filter by reading values
            continue
        yield list(keys)
        if int(cursor) == 0:
            return


def list_locks(client: Any, match: str | bytes = "*") -> list[LockInfo]:
    """Every held tasklock lock whose key matches ``match`` (a SCAN glob), newest first.

    Newest means the latest ``at`` in the owner metadata; locks without one come last. Keys that
    change while the scan runs may or may not be listed (SCAN's guarantee), never twice.
    """
    locks: dict[str, LockInfo] = {}
    with backend_errors(client, f"listing locks matching '{key_text(match)}'"):
        for page in scan_pages(client, match):
            keys = [k for k in page if not k.endswith(b":fence")]
            if not keys:
                continue
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
            answers = pipe.execute(raise_on_error=False)
            for i, key in enumerate(keys):
                info = _lock_info(key, answers[2 * i], answers[2 * i + 1])
                if info is not None:
                    locks[info.key] = info
    return sorted(locks.values(), key=newest_first)


def newest_first(info: LockInfo) -> tuple[bool, float, str, int]:
    """The sort key of ``tasklock ls``: latest ``at`` first, then by key and fence."""
    at = info.acquired_at
    return (at is None, -(at or 0.0), info.key, info.fence or 0)


@dataclass(frozen=True)
class KeyState:
    """What one key holds right now, read atomically (one MULTI/EXEC)."""

    key: str  # the surrogateescape form
    type: str  # Redis TYPE: "none" when the key does not exist
    raw_value: bytes | None
    ttl_ms: int | None
    lock: LockInfo | None = field(default=None)

    @property
    def exists(self) -> bool:
        return self.type != "none"


def read_key(client: Any, key: str) -> KeyState:
    """The type, value, TTL and (when it is a tasklock lock) parsed holder of ``key`` (in the
    ``surrogateescape`` form)."""
    raw_key = key_bytes(key)
    with backend_errors(client, f"reading '{key_text(key)}'"):
        pipe = client.pipeline(transaction=True)
        pipe.type(raw_key)
        pipe.get(raw_key)
        pipe.pttl(raw_key)
        kind, value, pttl = pipe.execute(raise_on_error=False)
    kind_text = kind.decode() if isinstance(kind, bytes) else str(kind)
    if kind_text != "string" or not isinstance(value, bytes | str):
        return KeyState(key, kind_text, None, None)
    raw = value.encode() if isinstance(value, str) else value
    ttl_ms = int(pttl) if isinstance(pttl, int) and pttl >= 0 else None
    return KeyState(key, kind_text, raw, ttl_ms, _lock_info(key, raw, pttl))


def fence_counter_keys(key: str) -> list[tuple[str, str]]:
    """Where the fence counter of lock ``key`` can be, as ``(label, counter key)`` pairs.

    The core's default counter comes first (:func:`tasklock.core.keys.fence_key_for`); a key laid
    out like a task-layer execution lock (``<prefix>:{<task>}:lock:<digest>``) also gets the
    per-task counter ``<prefix>:{<task>}:fence``. A lock created with an explicit ``fence_key``
    uses a counter that cannot be derived from its name.
    """
    candidates = [("default", fence_key_for(key))]
    match = _TASK_LOCK_KEY.fullmatch(key)
    if match:
        candidates.insert(0, ("task layer", f"{match['base']}:fence"))
    return candidates


def _counter(answer: Any) -> int | None:
    """A counter's value when it is a plain non-negative integer, else None (whatever it holds:
    bytes that are not UTF-8, digits that are not ASCII, a list)."""
    if isinstance(answer, str):
        answer = answer.encode("utf-8", "surrogateescape")
    if not isinstance(answer, bytes) or not answer.isdigit() or len(answer) > _COUNTER_DIGITS:
        return None  # bytes.isdigit() is ASCII digits only
    return int(answer)


def read_fence_counters(client: Any, keys: Sequence[str]) -> dict[str, int | None]:
    """The current value of each counter key (None: not set or not an integer)."""
    if not keys:
        return {}
    with backend_errors(client, "reading fence counters"):
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key_bytes(key))
        answers = pipe.execute(raise_on_error=False)
    return {key: _counter(answer) for key, answer in zip(keys, answers, strict=True)}


def release_if_unchanged(client: Any, key: str, value: bytes) -> bool:
    """Delete ``key`` only if it still holds ``value``, and wake its waiters. True if deleted.

    The owner check is the same release script every lock uses, so a lock that expired and was
    taken again since ``value`` was read is left alone.
    """
    with backend_errors(client, f"releasing '{key_text(key)}'"):
        channel = key_bytes(wake_channel(key))
        return bool(RELEASE(client, (key_bytes(key),), (value, channel)))
