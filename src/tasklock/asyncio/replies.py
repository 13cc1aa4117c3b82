"""Reading a lane connection's replies ourselves: RESP2, parsed as the bytes arrive.

A lane connection (:mod:`tasklock.asyncio.lanes`) is opened by redis-py (TCP or TLS, HELLO, AUTH,
SELECT: everything a connection needs before its first command), then tasklock takes its
transport over with a protocol of its own (:class:`ReplyReader`). Why: through redis-py's
StreamReader and parser, reading one small reply costs more CPU than sending the command, and
each read is an await of its own; here ``data_received`` parses whatever arrived and hands each
reply to the callback registered for it, in order, with no await and no task. A Redlock round
then wakes its caller once, when its outcome is decided, not once per master.

Only what tasklock's own commands answer is parsed: integers, bulk strings, arrays of them,
simple strings and errors (made into redis-py's exception classes by redis-py's own
``parse_error``). Replies are bytes; nothing is decoded.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any, Final

from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["INCOMPLETE", "ReplyReader", "parse_reply"]

log = logging.getLogger("tasklock.lock")


class _Incomplete:
    def __repr__(self) -> str:
        return "INCOMPLETE"


#: What :func:`parse_reply` answers while a reply has not fully arrived.
INCOMPLETE: Final = _Incomplete()


def parse_reply(buffer: bytearray, start: int) -> tuple[Any, int]:
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
    raise RedisConnectionError(f"unexpected reply type {chr(kind)!r} on a tasklock connection")


Callback = Callable[[Any], None]


class ReplyReader(asyncio.Protocol):
    """The protocol of a lane connection: replies go to the callbacks registered with
    :meth:`expect`, in the order the commands were written; a lost connection gives each
    waiting callback a ConnectionError."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._buffer = bytearray()
        self._waiting: collections.deque[Callback] = collections.deque()
        self.lost: BaseException | None = None
        #: Called (with this reader) whenever the last awaited reply has been handed over.
        self.on_idle: Callable[[ReplyReader], None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def expect(self, callback: Callback) -> None:
        if self.lost is not None:
            callback(self.lost)
            return
        self._waiting.append(callback)

    def feed(self, data: bytes) -> None:
        self.data_received(data)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        position = 0
        while self._waiting:
            try:
                reply, after = parse_reply(buffer, position)
            except Exception as exc:
                self._lose(RedisConnectionError(f"{self._where}: unreadable reply ({exc})"))
                return
            if reply is INCOMPLETE:
                break
            position = after
            callback = self._waiting.popleft()
            try:
                callback(reply)
            except Exception:  # a callback's bug must not stop the others' replies
                log.exception("a reply callback failed")
        if position:
            del buffer[:position]
        if not self._waiting and self.on_idle is not None and self.lost is None:
            self.on_idle(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lose(RedisConnectionError(f"Connection to {self._where} lost: {exc or 'closed'}"))

    def eof_received(self) -> bool:
        return False  # close the transport

    def _lose(self, error: BaseException) -> None:
        if self.lost is None:
            self.lost = error
        waiting, self._waiting = self._waiting, collections.deque()
        for callback in waiting:
            try:
                callback(error)
            except Exception:
                log.exception("a reply callback failed")
