"""RESP2 replies parsed by tasklock itself, for the lane connections of both drivers.

Lane connections always speak RESP2, whatever their client speaks (see :mod:`tasklock.core.lanes`),
so no RESP3 type (``_``, ``#``, ``%``, push frames...) can reach this parser; a byte it does not
know raises redis-py's ``InvalidResponse``, which is never taken for a lost connection (that would
send the call again).

A lane connection (:mod:`tasklock.core.lanes`, :mod:`tasklock.asyncio.lanes`) carries only
tasklock's own commands, one thread's or one loop's, so its replies can be read without redis-py's
parser: through it, reading one small reply cost more CPU than sending the command. Only what
tasklock's commands answer is parsed: integers, bulk strings, arrays of them, simple strings and
errors (made into redis-py's exception classes by redis-py's own ``parse_error``). Replies are
bytes; nothing is decoded.
"""

from __future__ import annotations

from typing import Any, Final

from redis._parsers.base import BaseParser
from redis.exceptions import InvalidResponse

__all__ = ["INCOMPLETE", "parse_reply"]


class _Incomplete:
    def __repr__(self) -> str:
        return "INCOMPLETE"


#: What :func:`parse_reply` answers while a reply has not fully arrived.
INCOMPLETE: Final = _Incomplete()


def parse_reply(buffer: bytes | bytearray, start: int) -> tuple[Any, int]:
    """The reply that starts at ``start`` and the offset after it, or (INCOMPLETE, start)."""
    end = buffer.find(b"\r\n", start)
    if end < 0:
        return INCOMPLETE, start
    kind = buffer[start]
    line = bytes(buffer[start + 1 : end])
    after = end + 2
    if kind == 58:  # ":" integer
        return int(line), after
    if kind == 36:  # "$" bulk string
        size = int(line)
        if size < 0:
            return None, after
        if len(buffer) < after + size + 2:
            return INCOMPLETE, start
        return bytes(buffer[after : after + size]), after + size + 2
    if kind == 42:  # "*" array
        count = int(line)
        if count < 0:
            return None, after
        items = []
        position = after
        for _ in range(count):
            item, position = parse_reply(buffer, position)
            if item is INCOMPLETE:
                return INCOMPLETE, start
            items.append(item)
        return items, position
    if kind == 43:  # "+" simple string
        return line, after
    if kind == 45:  # "-" error: redis-py's class for it (NoScriptError, NoPermissionError...)
        error = BaseParser.parse_error(line.decode(errors="replace"))  # type: ignore[no-untyped-call]
        return error, after
    raise InvalidResponse(f"unexpected reply type {chr(kind)!r} on a tasklock connection")
