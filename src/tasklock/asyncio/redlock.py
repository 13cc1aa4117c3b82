"""Redlock for asyncio: one lock over N independent masters, awaited on ``redis.asyncio`` clients.

The algorithm and its limits are :class:`tasklock.Redlock`'s (read :mod:`tasklock.core.redlock`
before relying on it); its rules are :mod:`tasklock.core.quorum`'s, one copy for both. This
module only runs the rounds, over the asyncio fan-out (:mod:`tasklock.asyncio.fanout`): every
command of a round written at once, the replies read until the outcome is decided or
``node_timeout`` has passed; a master that has not answered by then counts as failed for that
round, as with the blocking fan-out. Round 1's late answers are handled as the blocking Redlock
handles them: once the attempt has failed, the undo is written behind the SET on its own
connection, where it can never overtake it; a late SET answered after the hold has ended (or
never answered, once :data:`~tasklock.core.ops.REAP_AFTER` has passed) is undone the same way.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from tasklock.asyncio._base import AsyncBaseLock, _AsyncWaiter
from tasklock.asyncio.background import keep
from tasklock.asyncio.fanout import AsyncRound, fan_out, send_in_background
from tasklock.asyncio.lanes import async_lane_for
from tasklock.asyncio.wakeup import AsyncSubscription, async_hub_for
from tasklock.core.connection import describe_client
from tasklock.core.fanout import NoReply, Op, script_op
from tasklock.core.keys import fence_counter_ttl_ms, wake_channel
from tasklock.core.lease import Attempt, Number, fence_key_or_default
from tasklock.core.quorum import (
    DEFAULT_DRIFT_EXTRA_MS,
    DEFAULT_DRIFT_FACTOR,
    AttemptState,
    Classifier,
    Quorum,
    RetriesNoVerdict,
    Validity,
    attempt_value,
    check_node_count,
    clients_from,
    decided_by,
    flag,
    next_fence,
    owner_of,
    quorum_for,
    round1,
    tally,
    timing,
    undo_late_set,
)
from tasklock.core.renewal import Outcome, Renewal, RenewCall
from tasklock.core.scripts import REDLOCK_ACQUIRE, REDLOCK_EXTEND, REDLOCK_FENCE, REDLOCK_RELEASE
from tasklock.core.wakeup import PUBLISH_REFUSED, warn_wakeup_refused

__all__ = ["Redlock"]


def _is_async_client(item: Any) -> bool:
    """A redis.asyncio client for one server (RedisCluster is refused: a master is one server)."""
    return (
        hasattr(item, "connection_pool")
        and inspect.iscoroutinefunction(getattr(item, "execute_command", None))
        and not hasattr(item, "get_node_from_key")
    )


class Redlock(RetriesNoVerdict, AsyncBaseLock):
    """:class:`tasklock.Redlock` for asyncio: a lock over N independent Redis masters.

    ``clients`` is a list of ``redis.asyncio`` clients or Redis URLs (one per master; clients made
    from URLs get socket and connect timeouts equal to ``connect_timeout``). The other
    parameters (``node_timeout`` runs from the moment a master's command is written; a master
    being connected first gets ``connect_timeout``), the errors
    (:class:`~tasklock.errors.QuorumNotReached` when a majority gives no verdict, raised by a
    blocking acquire only once its ``blocking_timeout`` has passed) and the guarantees are
    :class:`tasklock.Redlock`'s; holds, cancellation and the watchdog are
    :class:`tasklock.asyncio.Lock`'s.
    """

    def __init__(
        self,
        clients: Sequence[Any],
        name: str,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        fence_key: str | None = None,
        watchdog: bool | None = None,
        on_lost: Callable[[AsyncBaseLock], Any] | None = None,
        owner_info: Mapping[str, Any] | None = None,
        drift_factor: Number = DEFAULT_DRIFT_FACTOR,
        drift_extra_ms: Number = DEFAULT_DRIFT_EXTRA_MS,
        node_timeout: Number | None = None,
        connect_timeout: Number | None = None,
    ) -> None:
        super().__init__(
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
            watchdog=watchdog,
            on_lost=on_lost,
            owner_info=owner_info,
        )
        self.fence_key = fence_key_or_default(fence_key, self.name)
        chosen = timing(self.ttl, drift_factor, drift_extra_ms, node_timeout, connect_timeout)
        self.drift = chosen.drift
        self.drift_factor = chosen.drift_factor
        self.drift_extra_ms = chosen.drift_extra_ms
        #: Seconds each master gets to answer each round.
        self.node_timeout = chosen.node_timeout
        #: Seconds a master without an idle connection gets to be connected.
        self.connect_timeout = chosen.connect_timeout
        #: The redis.asyncio clients, one per master (made from URLs where URLs were given).
        self.clients = clients_from(
            clients,
            kind="redis.asyncio client (redis.asyncio.Redis)",
            accepts=_is_async_client,
            from_url=lambda url: aioredis.Redis.from_url(
                url,
                socket_timeout=self.connect_timeout,
                socket_connect_timeout=self.connect_timeout,
                health_check_interval=30,
            ),
        )
        check_node_count(len(self.clients))
        self._labels = [describe_client(client) for client in self.clients]
        self._lanes = [async_lane_for(client) for client in self.clients]
        self.quorum = quorum_for(len(self.clients))
        self._rules = Quorum(
            self.name,
            self._labels,
            self.quorum,
            self.node_timeout,
            self.ttl,
            self.drift,
            self.drift_factor,
            self.drift_extra_ms,
        )
        self._keys = (self.name, self.fence_key)
        self._ttl_ms = max(1, int(self.ttl * 1000))
        self._fence_ttl_ms = fence_counter_ttl_ms(self.ttl)
        self._channel = wake_channel(self.name)
        # Holds whose round 1 left answers outstanding: their late SETs are undone on release.
        self._open: dict[bytes, AttemptState] = {}

    # -- shared pieces --------------------------------------------------------------------------
    def _quorum_error(self, doing: str, verdicts: Any) -> Exception:
        return self._rules.error(doing, verdicts)

    def _release_op(self, owner: bytes, value: bytes) -> Op:
        return script_op(REDLOCK_RELEASE, (self.name,), (owner, value, self._channel))

    async def _round(
        self,
        op: Op | Sequence[Op],
        indexes: Sequence[int] | None = None,
        decided: Classifier | None = None,
    ) -> AsyncRound:
        """One fan-out round to the masters at ``indexes`` (default: all)."""
        chosen = range(len(self.clients)) if indexes is None else indexes
        ops = [op] * len(chosen) if isinstance(op, Op) else list(op)
        return await fan_out(
            [self.clients[i] for i in chosen],
            ops,
            self.node_timeout,
            decided=None if decided is None else decided_by(decided, self.quorum),
            lanes=[self._lanes[i] for i in chosen],
            connect_timeout=self.connect_timeout,
        )

    # -- acquire --------------------------------------------------------------------------------
    async def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        owner = attempt_value(token).encode()
        q = self.quorum
        validity = Validity(self.ttl, self.drift)
        first = await self._round(
            script_op(REDLOCK_ACQUIRE, self._keys, (owner, self._ttl_ms)), decided=round1
        )
        verdicts = tally(first.results, round1)
        state = AttemptState(self._release_op(owner, owner))
        if verdicts.reached(q) and validity.left() > 0:
            # Masters that answer round 1 after the quorum hold our key too: if the attempt has
            # failed or the hold has ended by the time their answer comes, it is undone on that
            # same connection, behind the SET (as the blocking Redlock's reaper does).
            first.settle(late=lambda index, reply: undo_late_set(state, index, reply))
            fence = next_fence(verdicts.yes.values())
            value = owner + b"#" + str(fence).encode()
            state.release = self._release_op(owner, value)
            chosen = sorted(verdicts.yes)
            second = await self._round(
                script_op(REDLOCK_FENCE, self._keys, (owner, fence, self._fence_ttl_ms)),
                chosen,
                decided=flag,
            )
            fenced = tally(second.results, flag, chosen)
            if fenced.reached(q) and validity.left() > 0:
                second.settle()
                if any(first.outstanding):
                    self._open[owner] = state
                return Attempt(True, value, fence)
            # Round 2 fell short: undo wherever round 1 put our key, late answers included. A
            # master whose round 2 was never written (still connecting) gets the undo anew.
            kept = state.finish()
            late = _written_unanswered(second)
            second.settle(followups=dict.fromkeys(late, state.release))
            await self._undo(state.release, (set(chosen) | kept) - {chosen[i] for i in late})
            verdicts.failed.update(fenced.failed)
            verdicts.unawaited.update(fenced.unawaited)
        else:
            # No quorum in time: undo everywhere our SET may have run. Masters that have not
            # answered get the undo written behind the SET on the same connection.
            state.finish()
            late = _written_unanswered(first)
            first.settle(followups=dict.fromkeys(late, state.release))
            maybe = {i for i in verdicts.failed if first.sent[i]} - late
            await self._undo(state.release, set(verdicts.yes) | maybe)
        return self._rules.failed_attempt(verdicts)

    async def _undo(self, release: Op, indexes: set[int]) -> None:
        """Delete a failed attempt's key on ``indexes``; waits (at most node_timeout) so that our
        own next attempt does not find our own stale key."""
        if indexes:
            await self._send_release(release, sorted(indexes))

    async def _send_release(
        self, release: Op, indexes: Sequence[int] | None = None, decided: bool = False
    ) -> AsyncRound:
        """Release (or undo) on the masters at ``indexes`` (default: all): "release on every
        instance, even those that seemed to fail". Owner-checked, so late is harmless: a master
        that got no answer in time gets it again in the background when it answers (or its
        connection is given up); one whose connection was still being made gets it once
        connected; a late NOSCRIPT runs it again as EVAL; a connection that broke under it
        sends it again on a new one. Else its key would live until its TTL."""
        done = await self._round(release, indexes, decided=flag if decided else None)
        done.settle(
            late=lambda index, reply: release if isinstance(reply, NoReply) else None,
            send_late=True,
        )
        chosen = range(len(self.clients)) if indexes is None else indexes
        for i, reply in zip(chosen, done.results, strict=True):
            if isinstance(reply, redis_errors.ConnectionError):
                send_in_background(self.clients[i], release)
        return done

    # -- release / extend -----------------------------------------------------------------------
    def _finish(self, owner: bytes) -> None:
        state = self._open.pop(owner, None)
        if state is not None:
            state.finish()  # the release goes to every master, late SETs included

    async def _release_value(
        self, value: bytes, on_cancel: Callable[[asyncio.Future[Any]], None] | None = None
    ) -> bool:
        owner = owner_of(value)
        self._finish(owner)
        done = await self._send_release(self._release_op(owner, value), decided=True)
        for i, reply in enumerate(done.results):
            if reply == PUBLISH_REFUSED:
                warn_wakeup_refused(self._labels[i], "PUBLISH")
        return self._rules.released(done.results)

    async def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        owner = owner_of(value)
        ms = max(1, int(seconds * 1000))
        timer = Validity(seconds, 0.0)
        extend = script_op(
            REDLOCK_EXTEND, (self.name,), (owner, value, ms, "1" if replace else "0")
        )
        done = await self._round(extend, decided=flag)
        done.settle()
        if self._rules.extended(done.results, seconds, timer.elapsed()):
            return True
        self._finish(owner)  # not ours on a quorum (any more): the hold ends
        return False

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        owner = owner_of(value)
        args = (owner, value, self._ttl_ms, "1")
        calls: list[RenewCall] = [
            (client, REDLOCK_EXTEND, (self.name,), args) for client in self.clients
        ]

        def judge(results: list[Any], elapsed: float) -> Outcome:
            outcome = self._rules.renewed(results, elapsed)
            if outcome is Outcome.LOST:
                self._finish(owner)
            return outcome

        return Renewal(self.name, self.ttl, calls, judge, on_lost)

    # -- reads ----------------------------------------------------------------------------------
    async def locked(self) -> bool:
        """True if enough masters hold ``name`` that nobody else could take a quorum now."""
        done = await self._round(Op(("EXISTS", self.name)))
        done.settle()
        return self._rules.locked(done.results)

    async def _stored_value_is(self, value: bytes) -> bool:
        done = await self._round(Op(("GET", self.name)))
        done.settle()
        return self._rules.stored_is(done.results, value)

    async def _peek(self) -> tuple[bytes | None, int | None]:
        """The value most masters hold for ``name`` and how long until expiry alone would free a
        quorum, in ms; (None, None) when a quorum is free."""
        gets = await self._round(Op(("GET", self.name)))
        gets.settle()
        ttls = await self._round(Op(("PTTL", self.name)))
        ttls.settle()
        return self._rules.holder(gets.results, ttls.results)

    # -- waiting --------------------------------------------------------------------------------
    async def _waiter(self, token: str) -> _AsyncWaiter:
        waiter = _AnyMasterWaiter(self._channel)
        await waiter.subscribe(self.clients, self.node_timeout)
        return waiter


def _written_unanswered(done: AsyncRound) -> set[int]:
    """Positions whose command was written and not answered: a follow-up (the undo) can be
    queued behind it on its connection. One never written (still connecting) is not among
    them: it is never sent now, so its undo, if needed, goes anew."""
    return {i for i, waiting in enumerate(done.outstanding) if waiting and done.sent[i]}


class _AnyMasterWaiter:
    """Subscribed to the lock's wake channel on every master that answers in time; one event
    shared by the subscriptions, so a release published on any master wakes the waiter.
    Subscriptions still being made when the deadline passes join later (or are closed at once
    when the waiter is already closed); jittered polling stays the fallback."""

    def __init__(self, channel: str) -> None:
        self._channel = channel
        self._event = asyncio.Event()
        self._subscriptions: list[AsyncSubscription] = []
        self._closed = False

    async def subscribe(self, clients: Sequence[Any], timeout: float) -> None:
        tasks = [keep(asyncio.ensure_future(self._subscribe(client))) for client in clients]
        await asyncio.wait(tasks, timeout=timeout)

    async def _subscribe(self, client: Any) -> None:
        try:
            subscription = await async_hub_for(client).watch(self._channel, self._event)
        except Exception:
            return  # this master cannot wake us; the others (or polling) will
        if self._closed:
            subscription.close()
        else:
            self._subscriptions.append(subscription)

    def arm(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._event.wait()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self._closed = True
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            subscription.close()
