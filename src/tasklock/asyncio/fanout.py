"""Send one command to each of N Redis servers at once, and gather the answers by a deadline:
the asyncio Redlock's engine (the blocking one is :mod:`tasklock.core.fanout`).

A task per server per round (``asyncio.gather``) costs more than the round trips: measured on the
2-core CI machine, a gather of 5 PINGs through ``redis.asyncio`` took 2.6-3.4x one PING, and a
Redlock cycle is three rounds. So, as the blocking fan-out does with one ``poll()``, a round here
writes every command at once on the masters' lane connections (:mod:`tasklock.asyncio.lanes`),
and their replies come back through the lanes' reply readers as callbacks
(:mod:`tasklock.asyncio.replies`): each reply is recorded as it arrives, and the round's caller
is woken once, when the outcome is decided (``decided``), every server has answered, or the
deadline has passed. No task, no await per server. Tasks are used only for a server without an
idle connection (connecting) or whose client has no lane (the ordinary path).

Replies still outstanding when the caller leaves are handled as the blocking fan-out's reaper
handles them, and :meth:`AsyncRound.settle` says how: a ``late`` hook that may answer with a
follow-up command (Redlock undoes a SET that was granted after its attempt failed or its hold
ended), or ``followups`` written at once behind the unanswered command on the same connection,
where Redis runs them after it, never before. A connection whose replies have not come within
:data:`~tasklock.core.ops.REAP_AFTER` seconds is closed, and the hook hears NoReply (its
follow-up then goes on a new connection, best effort). A command not yet sent when the caller
leaves (its connection was still being made) is not sent at all, unless the caller asks for it
(``send_late``: a release, harmless late and freeing the key sooner). A late NOSCRIPT (the
command did not run) is run again, as EVAL, only for such a command; never an acquire's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.exceptions import NoScriptError

from tasklock.asyncio.background import spawn
from tasklock.asyncio.lanes import AsyncLane, LaneConnection, async_lane_for
from tasklock.asyncio.scripts import run_script
from tasklock.core.ops import PENDING, REAP_AFTER, NoReply, NotAwaited, Op

__all__ = ["AsyncRound", "fan_out", "send_in_background"]

log = logging.getLogger("tasklock.fanout")

LateHook = Callable[[int, Any], Op | None]


async def _run_op(client: Any, op: Op) -> Any:
    """One command the ordinary way; a script's EVALSHA through :func:`run_script`."""
    if op.script is None:
        return await client.execute_command(*op.args)
    count = int(op.args[2])
    keys, args = op.args[3 : 3 + count], op.args[3 + count :]
    return await run_script(client, op.script, keys, args)


async def _bounded(client: Any, op: Op, timeout: float) -> Any:
    try:
        async with asyncio.timeout(timeout):
            return await _run_op(client, op)
    except TimeoutError:
        return NoReply(f"no reply within {timeout * 1000:.0f} ms")
    except Exception as exc:
        return exc


def _packed(lane: AsyncLane, args: Sequence[Any]) -> bytes:
    encode = lane.encode
    parts = [encode(arg) for arg in args]
    return b"*%d\r\n%s" % (
        len(parts),
        b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts),
    )


def _discard(_reply: Any) -> None:
    """The reply to a follow-up nobody waits for."""


class _Slot:
    """One server's part of a round."""

    __slots__ = (
        "client",
        "conn",
        "deadline",
        "evaled",
        "hook",
        "index",
        "lane",
        "op",
        "reaper",
        "reply",
        "rerun",
        "round",
        "sent",
        "stop",
    )

    def __init__(
        self, round_: _Collector, index: int, client: Any, op: Op, lane: AsyncLane | None
    ) -> None:
        self.round = round_
        self.index = index
        self.client = client
        self.op = op
        self.lane = lane
        self.conn: LaneConnection | None = None
        self.sent = False  # the command is on its way: it may run, answered or not
        self.stop = False  # the caller left before it was sent: never send it
        self.evaled = False  # sent again as EVAL after NOSCRIPT
        self.reply: Any = PENDING
        self.hook: LateHook | None = None  # settle(late=...): what to do with a late reply
        self.reaper: asyncio.TimerHandle | None = None
        self.rerun = False  # settle(send_late=True): a late NOSCRIPT runs it again, as EVAL
        #: When this server counts as silent (loop time): set when written, or on connecting.
        self.deadline = 0.0

    def write(self, args: Sequence[Any], packed: dict[Any, bytes] | None = None) -> None:
        """Write a command on this slot's connection (cached bytes per round when given)."""
        assert self.conn is not None
        assert self.lane is not None
        key = (id(args), self.lane.encoding)
        data = None if packed is None else packed.get(key)
        if data is None:
            data = _packed(self.lane, args)
            if packed is not None:
                packed[key] = data
        self.conn.write(data)

    def send(self, packed: dict[Any, bytes] | None = None) -> None:
        self.sent = True  # from the first byte written, the command may run
        self.write(self.op.args, packed)
        assert self.conn is not None
        self.conn.reader.expect(self.on_reply)
        self.deadline = asyncio.get_running_loop().time() + self.round.timeout
        self.round.rearm()  # the round's wait now ends at this server's own deadline

    def on_reply(self, reply: Any) -> None:
        """A reply (or the connection's loss) for this slot's command."""
        if (
            isinstance(reply, NoScriptError)
            and not self.evaled
            and self.op.script is not None
            and self.round.open
            and self.conn is not None
            and self.conn.usable
        ):
            self.evaled = True  # not run: once more as EVAL, which also loads the script
            self.write(self.op.self_contained())
            self.conn.reader.expect(self.on_reply)
            return
        if self.lane is not None:
            self.lane.failing = False
        if self.round.open:
            self.reply = reply
            self.round.changed()
        else:
            self.late(reply)

    def late(self, reply: Any) -> None:
        """A reply that came after the caller left (see the module docstring)."""
        if self.reaper is not None:
            self.reaper.cancel()
        if isinstance(reply, NoScriptError):
            # It did not run. A command that is harmless late (a release) runs again, as EVAL:
            # a master that had lost its scripts (restarted, SCRIPT FLUSH) and answered after
            # the round was decided would otherwise keep the key until its TTL.
            if self.rerun and not self.evaled:
                self.evaled = True
                if self.conn is not None and self.conn.usable:
                    self.write(self.op.self_contained())
                    self.conn.reader.expect(self.late)
                    self.reaper = asyncio.get_running_loop().call_later(REAP_AFTER, self.give_up)
                else:
                    send_in_background(self.client, self.op)
            return
        if isinstance(reply, redis_errors.ConnectionError):
            reply = NoReply(str(reply))
        follow = self.call_hook(reply)
        if follow is None:
            return
        if not isinstance(reply, NoReply) and self.conn is not None and self.conn.usable:
            self.write(follow.self_contained())
            self.conn.reader.expect(_discard)
        else:
            send_in_background(self.client, follow)

    def call_hook(self, reply: Any) -> Op | None:
        if self.hook is None:
            return None
        try:
            return self.hook(self.index, reply)
        except Exception:
            log.exception("late-reply hook failed")
            return None

    def give_up(self) -> None:
        """REAP_AFTER passed without the late reply: close; the reader reports the loss."""
        if self.conn is not None:
            self.conn.close()
            self.conn.reader.connection_lost(None)


class _Collector:
    """A round while its caller waits: wakes it when decided, complete, or when every server
    still silent is past its own deadline (``timeout`` after its command was written; a server
    still connecting has its connect allowance instead)."""

    __slots__ = ("decided", "open", "slots", "timeout", "waiter")

    def __init__(self, decided: Callable[[list[Any]], bool] | None, timeout: float) -> None:
        self.decided = decided
        self.timeout = timeout
        self.open = True
        self.slots: list[_Slot] = []
        self.waiter: asyncio.Future[None] | None = None

    def latest_deadline(self) -> float:
        return max((slot.deadline for slot in self.slots if slot.reply is PENDING), default=0.0)

    def rearm(self) -> None:
        """A deadline moved (a server connected and was written to): wake the caller, which
        waits again until the new latest deadline."""
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def replies(self) -> list[Any]:
        return [slot.reply for slot in self.slots]

    def finished(self) -> bool:
        replies = self.replies()
        return PENDING not in replies or (self.decided is not None and self.decided(replies))

    def changed(self) -> None:
        if self.waiter is not None and not self.waiter.done() and self.finished():
            self.waiter.set_result(None)


async def _connect_and_send(slot: _Slot) -> None:
    """A server without an idle lane connection: connect (a task, so that a slow connect delays
    nobody), then send unless the caller has left meanwhile."""
    assert slot.lane is not None
    try:
        connection = await slot.lane.connect()
    except Exception as exc:
        slot.lane.failing = True
        if slot.round.open:
            slot.reply = exc
            slot.round.changed()
        elif not slot.stop:  # settle(send_late=True): it still goes, the ordinary way
            slot.late(NoReply(f"could not connect: {exc}"))
        return
    slot.lane.failing = False
    if slot.stop:
        slot.lane.put(connection)  # connected too late: kept for later, never used for this
        return
    slot.conn = connection
    try:
        slot.send()
    except Exception as exc:
        connection.close()
        if slot.round.open:
            slot.reply = exc
            slot.round.changed()
        else:
            slot.late(NoReply(f"could not send: {exc}"))
        return
    if not slot.round.open:  # sent after the caller left (settle(send_late=True))
        slot.reaper = asyncio.get_running_loop().call_later(REAP_AFTER, slot.give_up)


async def _ordinary(slot: _Slot, timeout: float) -> None:
    """A server whose client has no lane: the command through the client, bounded."""
    slot.sent = True
    reply = await _bounded(slot.client, slot.op, timeout)
    if slot.round.open:
        slot.reply = reply
        slot.round.changed()
    else:
        slot.late(reply)


class AsyncRound:
    """The outcome of :func:`fan_out`: ``results`` by position (a reply, an error, NoReply, or
    NotAwaited), ``sent`` (the command may have run), ``outstanding`` (no reply yet)."""

    def __init__(self, slots: list[_Slot], results: list[Any]) -> None:
        self._slots = slots
        self.results = results
        self.sent = [slot.sent for slot in slots]
        self.outstanding = [slot.reply is PENDING for slot in slots]

    def settle(
        self,
        late: LateHook | None = None,
        followups: dict[int, Op] | None = None,
        send_late: bool = False,
    ) -> None:
        """What to do with replies still outstanding (see the module docstring). Call it at once
        (before any await), exactly once. ``send_late``: a command whose connection is still
        being made is sent once it is made (for a command that is harmless late, such as an
        owner-checked release: it frees the key long before its TTL would); its reply goes to
        ``late``; so does a late NOSCRIPT (it did not run): it is sent again, as EVAL."""
        loop = asyncio.get_running_loop()
        for slot in self._slots:
            if not self.outstanding[slot.index]:
                continue
            slot.hook = late
            slot.rerun = send_late
            if not slot.sent:
                slot.stop = not send_late  # still connecting: sent when connected, or never
                continue
            follow = (followups or {}).get(slot.index)
            conn = slot.conn
            if follow is not None:
                if conn is not None and conn.usable:
                    slot.write(follow.self_contained())
                    conn.reader.expect(_discard)
                else:  # no connection of ours (no lane, or it broke): best effort, anew
                    send_in_background(slot.client, follow)
            if conn is not None:
                slot.reaper = loop.call_later(REAP_AFTER, slot.give_up)


def send_in_background(client: Any, op: Op) -> None:
    """Send ``op``, best effort, on a connection of ``client``'s own pool and bounded by
    REAP_AFTER: a follow-up or undo whose lane connection is gone, or a command that is harmless
    late (an owner-checked release) whose lane connection broke under it."""
    spawn(_bounded(client, op, REAP_AFTER))


async def fan_out(
    clients: Sequence[Any],
    ops: Sequence[Op],
    timeout: float,
    decided: Callable[[list[Any]], bool] | None = None,
    lanes: Sequence[AsyncLane | None] | None = None,
    connect_timeout: float | None = None,
) -> AsyncRound:
    """Send ``ops[i]`` to ``clients[i]``, all at once; return when every server answered,
    ``decided(results)`` is true (PENDING for the missing), or every server still silent is
    past its deadline: ``timeout`` seconds after its command was written. A server with no idle
    connection first gets up to ``connect_timeout`` (default ``timeout``) to be connected, or
    ``timeout`` in all when its last connect or round failed: time spent connecting a cold pool
    (many tasks at once, each needing a connection per master) is not a master's silence.
    ``lanes[i]`` is ``async_lane_for(clients[i])``, for a caller that keeps them (a Redlock
    does: its masters do not change). Call :meth:`AsyncRound.settle` on the result."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    allowance = timeout if connect_timeout is None else connect_timeout
    collector = _Collector(decided, timeout)
    slots = collector.slots
    if lanes is None:
        lanes = [async_lane_for(client) for client in clients]
    parts = enumerate(zip(clients, ops, lanes, strict=True))
    slots.extend(_Slot(collector, i, client, op, lane) for i, (client, op, lane) in parts)
    packed: dict[Any, bytes] = {}
    for slot in slots:
        lane = slot.lane
        slot.deadline = start + (allowance if lane is not None and not lane.failing else timeout)
        if lane is None:
            spawn(_ordinary(slot, timeout))
            continue
        slot.conn = lane.take_idle()
        if slot.conn is None:
            spawn(_connect_and_send(slot))
            continue
        try:
            slot.send(packed)
        except redis_errors.ConnectionError:  # died while idle: a new one, in a task
            slot.conn.close()
            slot.conn = None
            slot.sent = False
            spawn(_connect_and_send(slot))
    try:
        while not collector.finished():
            left = collector.latest_deadline() - loop.time()
            if left <= 0:
                break
            collector.waiter = loop.create_future()
            try:
                async with asyncio.timeout(left):
                    await collector.waiter
            except TimeoutError:
                pass
    finally:
        collector.open = False
    return AsyncRound(slots, _results(slots, decided, timeout))


def _results(
    slots: list[_Slot], decided: Callable[[list[Any]], bool] | None, timeout: float
) -> list[Any]:
    """Each server's reply, or why there is none (and the lanes that were silent are marked
    failing: their next rounds get no connect allowance)."""
    early = decided is not None and decided([slot.reply for slot in slots])
    results: list[Any] = []
    for slot in slots:
        if slot.reply is not PENDING:
            results.append(slot.reply)
        elif early:
            results.append(NotAwaited("the outcome was decided without it"))
        else:
            if slot.lane is not None:
                slot.lane.failing = True
            if slot.sent:
                results.append(NoReply(f"no reply within {timeout * 1000:.0f} ms"))
            else:
                results.append(NoReply("could not connect in time"))
    return results
