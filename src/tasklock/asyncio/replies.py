"""Reading a lane connection's replies ourselves: RESP2 (lanes never speak RESP3), parsed as the
bytes arrive.

A lane connection (:mod:`tasklock.asyncio.lanes`) is opened by redis-py (TCP or TLS, HELLO, AUTH,
SELECT: everything a connection needs before its first command), then tasklock takes its
transport over with a protocol of its own (:class:`ReplyReader`). Why: through redis-py's
StreamReader and parser, reading one small reply costs more CPU than sending the command, and
each read is an await of its own; here ``data_received`` parses whatever arrived and hands each
reply to the callback registered for it, in order, with no await and no task. A Redlock round
then wakes its caller once, when its outcome is decided, not once per master.

What is parsed, and how, is :mod:`tasklock.core.replies`, shared with the blocking lanes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

from tasklock.core.replies import INCOMPLETE, parse_reply

__all__ = ["INCOMPLETE", "ReplyReader", "parse_reply"]

log = logging.getLogger("tasklock.lock")


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
                # Never taken for a lost connection (whose call may be sent again).
                self._lose(InvalidResponse(f"{self._where}: unreadable reply ({exc})"))
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

    def fail(self, error: BaseException) -> None:
        """Give up on this connection: each waiting callback (and any registered later) gets
        ``error``."""
        self._lose(error)

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
