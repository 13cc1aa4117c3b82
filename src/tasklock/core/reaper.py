"""The reaper: one daemon thread that reads the replies fan-out callers did not wait for.

A fan-out caller leaves as soon as its outcome is decided or its deadline passes; the replies
still on their way are handed here with their connections. The reaper reads and discards them
(running a late-reply hook where the caller left one, e.g. Redlock's undo of a SET that was
granted after its deadline) and returns each connection to its node's stock, or closes it after
:data:`~tasklock.core.ops.REAP_AFTER` seconds. Fork-safe: a child starts with no reaper.

It depends on the node (:mod:`tasklock.core.node`) and never on the fan-out
(:mod:`tasklock.core.fanout`), which depends on it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from tasklock.core import clock as _clock
from tasklock.core.node import Node
from tasklock.core.ops import REAP_AFTER, Awaited, LateHook, NoReply, Op
from tasklock.core.sockets import Poller, Waker, socket_of

__all__ = ["reaper"]

log = logging.getLogger("tasklock.fanout")


@dataclass(eq=False)
class _Straggler:
    node: Node
    conn: Any
    awaited: collections.deque[Awaited]
    give_up_at: float
    fd: int = -1


class _Reaper:
    """One daemon thread that waits for the replies callers did not wait for.

    A reply of NOSCRIPT (a server that had not loaded the script yet: new or restarted) means
    the command did not run; the reaper runs it again as EVAL with the script's text, so a
    release or extend that nobody waited for is not silently dropped. It is given no command to
    run again where the caller queued a follow-up behind it (see ``Round.settle``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._incoming: list[_Straggler] = []
        self._active: dict[int, _Straggler] = {}  # by socket: read and written by the thread only
        self._waker = Waker()
        self._thread = threading.Thread(target=self._run, name="tasklock-reaper", daemon=True)
        self._thread.start()

    def adopt(self, node: Node, conn: Any, awaited: collections.deque[Awaited]) -> None:
        sock = socket_of(conn)
        if sock is None:
            node.discard(conn)
            return
        straggler = _Straggler(node, conn, awaited, _clock.clock.monotonic() + REAP_AFTER)
        straggler.fd = sock.fileno()
        with self._lock:
            self._incoming.append(straggler)
        self._waker.wake()

    def waiting(self) -> int:
        """Connections whose replies it still waits for (0: every late reply was read and
        acted on). For tests and diagnostics: a moment's count, read without the thread."""
        with self._lock:
            return len(self._incoming) + len(self._active)

    def _run(self) -> None:
        poller = Poller()
        poller.register(self._waker.fd)
        active = self._active
        while True:
            try:
                now = _clock.clock.monotonic()
                timeout = min((s.give_up_at for s in active.values()), default=now + 60) - now
                for fd in poller.poll(max(0.0, timeout)):
                    if fd == self._waker.fd:
                        self._waker.drain()
                        with self._lock:  # moved under the lock: waiting() never misses one
                            incoming, self._incoming = self._incoming, []
                            active.update((item.fd, item) for item in incoming)
                        for item in incoming:
                            poller.register(item.fd)
                        continue
                    found = active.get(fd)
                    if found is not None and self._read(found):
                        del active[fd]
                        poller.unregister(fd)
                now = _clock.clock.monotonic()
                for fd, straggler in list(active.items()):
                    if now >= straggler.give_up_at:
                        poller.unregister(fd)
                        self._give_up(straggler)
                        del active[fd]
            except Exception:  # never let the thread die
                log.exception("tasklock fan-out reaper failed; continuing")

    def _read(self, straggler: _Straggler) -> bool:
        """Read what has arrived; True when the straggler is finished with."""
        conn = straggler.conn
        while True:
            try:
                reply = conn.read_response()
            except ResponseError as exc:
                reply = exc
            except Exception:
                straggler.node.discard(conn)
                return True
            op, hook = straggler.awaited.popleft()
            if isinstance(reply, NoScriptError) and op is not None and op.script is not None:
                followup: Op | None = op  # it did not run: run it again, self-contained
                after: Awaited = (None, hook)
            else:
                followup = self._call_hook(hook, reply) if hook is not None else None
                after = (None, None)
            if followup is not None:
                try:
                    conn.send_packed_command(
                        conn.pack_command(*followup.self_contained()), check_health=False
                    )
                except Exception:
                    straggler.node.discard(conn)
                    return True
                straggler.awaited.append(after)
            if not straggler.awaited:
                straggler.node.mark_ok()
                straggler.node.put(conn)
                return True
            try:
                if not conn.can_read(0):
                    return False
            except Exception:
                continue

    def _give_up(self, straggler: _Straggler) -> None:
        conn = straggler.conn
        for _, hook in straggler.awaited:
            if hook is None:
                continue
            followup = self._call_hook(hook, NoReply(f"no reply within {REAP_AFTER:.0f} s"))
            if followup is not None:
                with contextlib.suppress(Exception):
                    conn.send_packed_command(
                        conn.pack_command(*followup.self_contained()), check_health=False
                    )
        straggler.node.mark_failed()
        straggler.node.discard(conn)

    @staticmethod
    def _call_hook(hook: LateHook, reply: Any) -> Op | None:
        try:
            return hook(reply)
        except Exception:
            log.exception("late-reply hook failed")
            return None


_reaper_lock = threading.Lock()
_the_reaper: _Reaper | None = None


def reaper() -> _Reaper:
    """The process's reaper (started on first use; a forked child gets a new one)."""
    global _the_reaper
    if _the_reaper is None:
        with _reaper_lock:
            if _the_reaper is None:
                _the_reaper = _Reaper()
    return _the_reaper


def _reset_after_fork() -> None:
    global _reaper_lock, _the_reaper
    _reaper_lock = threading.Lock()
    _the_reaper = None


os.register_at_fork(after_in_child=_reset_after_fork)
