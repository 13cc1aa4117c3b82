"""Send one command to each of N Redis servers at once, and gather the answers by a deadline.

This is Redlock's engine: a lock cycle is three fan-outs (round 1, round 2, release), so their cost
is the lock's cost. Measured on the 2-core CI machine with 5 local servers:

* a thread per node per call (a thread pool) is no faster than asking the nodes one after another
  (about 1.0 ms against 0.9 ms per fan-out of 5 PINGs: the GIL and the thread hand-offs eat the
  parallelism);
* writing all 5 commands first and then reading the 5 replies costs about 0.18 ms, one round
  trip, because the servers work in parallel while the caller waits in one ``poll()``.

So the hot path runs in the calling thread and uses no thread at all: take one idle, connected
redis-py connection per node, write every command, then poll all the sockets until the caller's
outcome is decided or the per-node deadline passes. Threads are used only where redis-py can only
block: connecting, which each server's :class:`~tasklock.core.node.Node` does on worker threads
(see :mod:`tasklock.core.node`), and the replies still outstanding when the caller leaves (the
outcome was decided early, or the deadline passed), which are handed to the reaper thread
(:mod:`tasklock.core.reaper`). It reads and discards them and returns the connection to the
stock, or closes it after :data:`REAP_AFTER` seconds. Before that the caller may queue a follow-up
command on the same connection (Redlock queues its release behind a SET that got no answer):
Redis runs one connection's commands in order, so the release can never overtake the SET, even
when the server only wakes up later.

Dependencies go one way: this module uses the node and the reaper; the reaper uses the node;
the node uses neither. :class:`Node` and :func:`node_for` are re-exported from here, where the
Redlocks and the benchmarks import them.

This uses redis-py's connection-level API (``send_packed_command``, ``read_response``,
``can_read``, ``disconnect``) plus the connection's socket for polling; those have been stable
since redis-py 4.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from tasklock.core import clock as _clock
from tasklock.core.node import Node, node_for
from tasklock.core.ops import (
    PENDING,
    REAP_AFTER,
    Awaited,
    LateHook,
    NoReply,
    NotAwaited,
    Op,
    script_op,
)
from tasklock.core.reaper import reaper
from tasklock.core.sockets import (
    Poller,
    Waker,
    run_in_background,
    socket_of,
    stale_connections,
)

__all__ = [
    "PENDING",
    "REAP_AFTER",
    "NoReply",
    "Node",
    "NotAwaited",
    "Op",
    "Round",
    "TimedNode",
    "fan_out",
    "node_for",
    "run_in_background",
    "script_op",
    "timed",
]


# -- one server with a deadline, shaped like a client -------------------------------------------
def timed(node: Node, timeout: float) -> TimedNode:
    """``node`` with a deadline per call, shaped like a redis-py client (for the watchdog:
    ``pipeline()`` and ``execute_command``). Cached on the node, so calls batch per server."""
    view: TimedNode | None = node.views.get(timeout)
    if view is None:
        view = node.views.setdefault(timeout, TimedNode(node, timeout))
    return view


class TimedNode:
    """The part of a redis-py client that :func:`tasklock.core.scripts.run_batch` and
    :class:`tasklock.core.scripts.Script` use, over the fan-out, so every call has a deadline."""

    def __init__(self, node: Node, timeout: float) -> None:
        self.node = node
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"<TimedNode {self.node.label} {self.timeout * 1000:.0f}ms>"

    def run(self, ops: Sequence[Op]) -> list[Any]:
        """Send ``ops`` in one pipelined write; replies (errors in place) or the node's error."""
        call = _Call([_Slot(self.node, list(ops))], self.timeout, None)
        call.run()
        slot = call.slots[0]
        error = slot.error
        call.settle(None, None)
        if error is not None:
            raise error
        return list(slot.replies)

    def execute_command(self, *args: Any) -> Any:
        reply = self.run([Op(args)])[0]
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def pipeline(self, transaction: bool = False) -> _Batch:
        return _Batch(self)


class _Batch:
    def __init__(self, view: TimedNode) -> None:
        self._view = view
        self._ops: list[Op] = []

    def execute_command(self, *args: Any) -> _Batch:
        self._ops.append(Op(args))
        return self

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        replies = self._view.run(self._ops)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
        return replies


# -- one call -----------------------------------------------------------------------------------
class _Slot:
    """One server's part of a call: its ops, its connection, the replies still to read."""

    __slots__ = (
        "allowance",
        "conn",
        "deadline",
        "error",
        "fd",
        "node",
        "ops",
        "replies",
        "retried",
        "sent",
        "sinks",
        "waiting",
    )

    def __init__(self, node: Node, ops: list[Op]) -> None:
        self.node = node
        self.ops = ops
        self.conn: Any = None
        self.fd = -1
        self.replies: list[Any] = [PENDING] * len(ops)
        # For each reply still to read: the op it answers, or -1 (SCRIPT LOAD, discarded).
        self.sinks: collections.deque[int] = collections.deque()
        self.error: BaseException | None = None
        self.sent = False
        self.retried = False
        self.waiting: Future[Any] | None = None
        #: When this server counts as silent: ``timeout`` after its command was written, or,
        #: while it waits for a connection, the end of its connect allowance.
        self.deadline = 0.0
        self.allowance = 0.0  # the connect allowance it was given, for the message

    @property
    def done(self) -> bool:
        return self.error is not None or (self.sent and not self.sinks)

    @property
    def result(self) -> Any:
        """The first op's reply, the node's error, or PENDING."""
        if self.error is not None:
            return self.error
        return self.replies[0]

    def start(self, conn: Any, packed: Any = None) -> None:
        """Write the ops (``packed``: their bytes, when the caller already packed them)."""
        self.conn = conn
        self.waiting = None
        commands = [op.args for op in self.ops]
        self._send(commands, range(len(self.ops)), packed)
        if self.conn is not None:
            sock = socket_of(conn)
            if sock is None:
                self.fail(NoReply(f"{self.node.label}: connection closed"))
            else:
                self.fd = sock.fileno()

    def _send(
        self, commands: list[tuple[Any, ...]], sinks: Iterable[int], packed: Any = None
    ) -> None:
        conn = self.conn
        try:
            if packed is not None:
                pass
            elif len(commands) == 1:
                packed = conn.pack_command(*commands[0])
            else:
                packed = conn.pack_commands(commands)
            self.sent = True  # from here on, the bytes may reach the server
            conn.send_packed_command(packed, check_health=False)
        except Exception as exc:  # redis-py has disconnected it
            self.fail(exc)
            return
        self.sinks.extend(sinks)

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.sinks.clear()
        if self.conn is not None:
            self.node.discard(self.conn)
            self.conn = None
        self.node.mark_failed()

    def read_ready(self) -> None:
        """Read every reply that has arrived; finish the slot when the last one is in."""
        conn = self.conn
        while True:
            try:
                reply = conn.read_response()
            except ResponseError as exc:
                reply = exc
            except Exception as exc:  # connection lost or broken reply: no verdict
                self.conn = None  # redis-py disconnected it
                self.fail(exc)
                self.node.discard(conn)
                return
            position = self.sinks.popleft()
            if position >= 0:
                self.replies[position] = reply
            if not self.sinks:
                if self._retry_noscript() or self.error is not None:
                    return
                self.conn = None
                self.node.mark_ok()
                self.node.put(conn)
                return
            try:
                if not conn.can_read(0):  # the next reply may already sit in the parser buffer
                    return
            except Exception:
                continue  # let read_response report it

    def _retry_noscript(self) -> bool:
        """A server without our script (new, restarted, SCRIPT FLUSH): load it and run it again."""
        if self.retried or not any(isinstance(r, NoScriptError) for r in self.replies):
            return False
        missing = [
            i
            for i, reply in enumerate(self.replies)
            if isinstance(reply, NoScriptError) and self.ops[i].script is not None
        ]
        if not missing:
            return False
        self.retried = True
        scripts = {s.sha: s for s in (self.ops[i].script for i in missing) if s is not None}
        commands = [("SCRIPT", "LOAD", s.source) for s in scripts.values()]
        commands += [self.ops[i].args for i in missing]
        for i in missing:
            self.replies[i] = PENDING
        self._send(commands, [-1] * len(scripts) + missing)
        return self.conn is not None


class _Call:
    def __init__(
        self,
        slots: list[_Slot],
        timeout: float,
        decided: Callable[[list[Any]], bool] | None,
        connect_timeout: float | None = None,
    ) -> None:
        self.slots = slots
        self.timeout = timeout
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        self.decided = decided
        self._poller = Poller()
        self._by_fd: dict[int, _Slot] = {}
        self._waker: Waker | None = None
        self._packed: dict[tuple[Any, ...], Any] = {}

    def _pack(self, slot: _Slot, conn: Any) -> Any:
        """The slot's bytes. One op sent to every node is packed once, not once per node
        (packing costs about as much as the write), for connections with the same encoding."""
        if len(slot.ops) != 1:
            return None
        encoder = getattr(conn, "encoder", None)
        key = (
            id(slot.ops[0]),
            type(conn),
            getattr(encoder, "encoding", None),
            getattr(encoder, "encoding_errors", None),
        )
        packed = self._packed.get(key)
        if packed is None:
            packed = self._packed[key] = conn.pack_command(*slot.ops[0].args)
        return packed

    def _begin(self, slot: _Slot, conn: Any) -> None:
        try:
            packed = self._pack(slot, conn)
        except Exception as exc:  # an argument that cannot be encoded
            slot.conn = conn
            slot.fail(exc)
            return
        slot.start(conn, packed)
        slot.deadline = _clock.clock.monotonic() + self.timeout
        if slot.conn is not None and slot.sinks:
            self._by_fd[slot.fd] = slot
            self._poller.register(slot.fd)

    def _need_connection(self, slot: _Slot) -> None:
        """Wait for a connection to the slot's server: a new one (a connect is started) or one
        that another call or the reaper hands back, whichever comes first."""
        if self._waker is None:
            self._waker = Waker()
            self._poller.register(self._waker.fd)
        slot.node.listen(self._waker)
        if not slot.deadline:  # the first wait: a failing server gets no connect allowance
            healthy = slot.node.failing_since is None
            slot.allowance = self.connect_timeout if healthy else self.timeout
            slot.deadline = _clock.clock.monotonic() + slot.allowance
        future = slot.node.connecting()
        slot.waiting = future
        future.add_done_callback(self._waker.wake)

    def _connections_arrived(self) -> None:
        for slot in self.slots:
            future = slot.waiting
            if future is None:
                continue
            conn = slot.node.take()
            if conn is not None:
                self._begin(slot, conn)
            elif not future.done():
                continue
            elif future.exception() is not None:
                slot.waiting = None
                slot.fail(future.exception() or NoReply(slot.node.label))
            else:  # someone else took the new connection: ask for another one
                self._need_connection(slot)

    def _on_ready(self, fd: int) -> None:
        if self._waker is not None and fd == self._waker.fd:
            self._waker.drain()
            self._connections_arrived()
            return
        slot = self._by_fd.get(fd)
        if slot is None:
            return
        slot.read_ready()
        if slot.done:
            del self._by_fd[fd]
            self._poller.unregister(fd)

    def _latest_deadline(self) -> float:
        """The round ends when every server that has not answered is past its own deadline."""
        return max((slot.deadline for slot in self.slots if not slot.done), default=0.0)

    def run(self) -> None:
        """Write every command (connecting where needed), then read until decided, complete,
        or every silent server is past its deadline. Each server's deadline runs from its own
        write: a thread that waited for the GIL between writes, or a server that needed a
        connection first (within its connect allowance), is not taken for a silent server."""
        taken = [slot.node.take(checked=False) for slot in self.slots]
        idle = [conn for conn in taken if conn is not None]
        if idle:
            stale = stale_connections(idle)
            if stale:
                dead = {id(idle[i]) for i in stale}
                for i, conn in enumerate(taken):
                    if conn is not None and id(conn) in dead:
                        self.slots[i].node.discard(conn)
                        taken[i] = self.slots[i].node.take()
        for slot, conn in zip(self.slots, taken, strict=True):
            if conn is not None:
                self._begin(slot, conn)
            else:
                self._need_connection(slot)
        decided_early = False
        try:
            while not all(slot.done for slot in self.slots):
                if self.decided is not None and self.decided([s.result for s in self.slots]):
                    decided_early = True
                    break
                remaining = self._latest_deadline() - _clock.clock.monotonic()
                if remaining <= 0:
                    # Take what has arrived before calling the rest silent: when this thread was
                    # the slow one (GC, scheduling), the answers are waiting in the sockets.
                    for fd in self._poller.poll(0):
                        self._on_ready(fd)
                    break
                for fd in self._poller.poll(remaining):
                    self._on_ready(fd)
            if decided_early and self._by_fd:
                # Collect replies that have already arrived, so their connections go straight
                # back to the stock instead of through the reaper.
                for fd in self._poller.poll(0):
                    self._on_ready(fd)
        finally:
            if self._waker is not None:
                for slot in self.slots:
                    slot.node.unlisten(self._waker)
                self._waker.close()
        ms = self.timeout * 1000
        for slot in self.slots:
            if slot.done:
                continue
            if slot.conn is None and decided_early:  # nothing was sent, nor needed
                slot.waiting = None
                slot.error = NotAwaited("still connecting when the outcome was decided")
            elif slot.conn is None:  # still waiting for a connection: nothing was sent
                slot.waiting = None
                limit = slot.allowance * 1000
                slot.error = NoReply(f"could not connect within {limit:.0f} ms")
                slot.node.mark_failed()
            elif decided_early:
                slot.error = NotAwaited("no reply yet when the outcome was decided")
            else:
                slot.error = NoReply(f"no reply within {ms:.0f} ms")
                slot.node.mark_failed()

    def settle(
        self,
        followups: Mapping[int, Op] | None,
        late: Callable[[int, Any], Op | None] | None,
    ) -> None:
        """Hand connections whose replies are outstanding to the reaper (after ``followups``)."""
        for index, slot in enumerate(self.slots):
            conn = slot.conn
            if conn is None or not slot.sinks:
                continue
            slot.conn = None
            followup = followups.get(index) if followups else None
            awaited: collections.deque[Awaited] = collections.deque()
            for position in slot.sinks:
                if position < 0:
                    awaited.append((None, None))
                else:
                    hook = _bind(late, index) if late is not None else None
                    # A command with a follow-up behind it is never run again on NOSCRIPT (the
                    # reaper re-runs only the ops it is given): it did not run, so its follow-up
                    # (its undo) found nothing to undo, the end the caller asked for; run again,
                    # it would run after its undo and stay (a round-1 SET kept for its TTL).
                    op = None if followup is not None else slot.ops[position]
                    awaited.append((op, hook))
            if followup is not None:
                try:
                    conn.send_packed_command(
                        conn.pack_command(*followup.self_contained()), check_health=False
                    )
                except Exception:
                    slot.node.discard(conn)
                    continue
                awaited.append((None, None))
            reaper().adopt(slot.node, conn, awaited)
            slot.sinks.clear()


def _bind(late: Callable[[int, Any], Op | None], index: int) -> LateHook:
    return lambda reply: late(index, reply)


class Round:
    """The outcome of :func:`fan_out`: one result per node, in the order of the nodes.

    A result is the node's reply, or an exception: an error reply (``ResponseError``), a
    connection error, or :class:`NoReply`. Call :meth:`settle` exactly once when done with it.
    """

    def __init__(self, call: _Call) -> None:
        self._call = call
        self.results: list[Any] = [slot.result for slot in call.slots]
        #: Whether the command was written to the node (so it may have run there).
        self.sent: list[bool] = [slot.sent for slot in call.slots]
        #: Whether the node's reply is still outstanding (the command may still run there).
        self.outstanding: list[bool] = [bool(slot.sinks) for slot in call.slots]
        self._settled = False

    def settle(
        self,
        followups: Mapping[int, Op] | None = None,
        late: Callable[[int, Any], Op | None] | None = None,
    ) -> None:
        """Release this round's connections.

        ``followups`` (by node index) are queued behind commands still unanswered, on the same
        connection, so the server runs them after those, however late; a command with a
        follow-up behind it is not run again when it answers NOSCRIPT (a re-run would come after
        the follow-up). ``late(index, reply)`` is called from the reaper thread with each such
        late reply (or with a :class:`NoReply` when the reaper gives up on it); an Op it returns
        is sent on that same connection.
        """
        if not self._settled:
            self._settled = True
            self._call.settle(followups, late)


def fan_out(
    nodes: Sequence[Node],
    ops: Sequence[Op],
    timeout: float,
    *,
    decided: Callable[[list[Any]], bool] | None = None,
    connect_timeout: float | None = None,
) -> Round:
    """Send ``ops[i]`` to ``nodes[i]``, all at once; return when every node answered, when
    ``decided(results)`` (results so far, :data:`PENDING` for the rest) says so, or when every
    node still silent is past its deadline: ``timeout`` seconds after its command was written.
    A node with no idle connection first gets up to ``connect_timeout`` (default ``timeout``) to
    be connected, or ``timeout`` in all when its last call failed. Never blocks longer than
    ``connect_timeout + timeout``."""
    slots = [_Slot(node, [op]) for node, op in zip(nodes, ops, strict=True)]
    call = _Call(slots, timeout, decided, connect_timeout)
    call.run()
    return Round(call)
