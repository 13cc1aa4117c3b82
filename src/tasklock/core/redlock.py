"""Redlock: one lock over N independent Redis masters, with strictly increasing fencing tokens.

The algorithm (Redis's own description, plus fencing):

1. Round 1, on every master at once: one script does ``SET name owner NX PX ttl`` and, when that
   succeeded, returns the master's fence counter.
2. If a quorum (``N // 2 + 1``) said yes and time is left (validity = TTL - elapsed - drift, on the
   monotonic clock), round 2 goes to the masters that said yes: one owner-checked script sets
   ``counter = max(counter, t)`` with ``t = max(counters read) + 1`` and stores ``owner#t``.
3. The lock is held iff round 2 reached a quorum and validity is still positive. Otherwise the
   attempt is undone on every master that may hold it (also those that did not answer: the undo is
   queued on the same connection, behind the unanswered SET, so it can never overtake it) and a
   blocking acquire retries after a jittered delay, or sooner when a release is published.

Why two rounds: taking the maximum of per-master INCRs is not monotonic (two majorities can see
different counters). With two rounds, any two holds share a master on which the earlier one wrote
its token while it held the lock there, before the later one's SET NX could succeed there; so the
later hold reads a counter at least as high and gets a larger token.

Every fan-out is parallel and bounded by ``node_timeout`` per master from the moment its command
is written (see :mod:`tasklock.core.fanout`): a stopped, paused or partitioned master costs at
most that, never a socket timeout. A master with no idle connection first gets
``connect_timeout`` to be connected: a cold pool is not a silent master. Extend and the
watchdog's renewal go to every master and need a quorum within the validity time; a renewal that
finds the lock gone on a majority marks it lost (``lock.lost``, ``on_lost``). When a majority
gives no verdict at all (errors, timeouts), a blocking acquire undoes the round and retries it
with the jittered backoff until its ``blocking_timeout``; then, or at once for a non-blocking
acquire, a release or an extend, :class:`~tasklock.errors.QuorumNotReached` is raised, naming
each failed master and why. A lock that is simply held by someone else is not an error
(``acquire`` returns False, as with ``Lock``).

How many masters: N = 2k + 1 tolerates k failed or unreachable masters (3 tolerates 1, 5
tolerates 2). An even N tolerates no more than N - 1 and has one more master that can fail, so it
is refused; N = 1 works but is not fault tolerant (a warning says so; use :class:`tasklock.Lock`).

Requirements and limits — read these before relying on Redlock:

* Persistence. A master that restarts empty forgets the lock, so a second client can take a
  majority while the first still holds it (its token is still higher: round 1 reads each
  master's clock where its counter is gone or behind, see ``REDLOCK_ACQUIRE``). Run
  every master with ``appendonly yes`` and ``appendfsync always`` (``everysec`` can lose the last
  second), or keep a restarted master out of service for longer than the TTL (delayed restarts).
  ``tasklock doctor`` checks the persistence settings.
* Redlock assumes bounded clock drift and bounded pauses. It does not survive a client paused
  (GC, SIGSTOP, VM migration) past its validity, or a server clock that jumps (the TTL then
  expires early): the client keeps running believing it holds the lock. That is what fencing is
  for: pass ``lock.fence`` to the resource you protect and have it reject any token lower than the
  highest it has seen. Without fencing, Redlock is an efficiency lock, not a safety lock.
* Masters must be independent (not replicas of one another, not one server listed twice).
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tasklock.core.base import Attempt, BaseLock, Number, _Waiter
from tasklock.core.clock import clock
from tasklock.core.connection import client_for_url
from tasklock.core.fanout import (
    Node,
    Op,
    Round,
    fan_out,
    node_for,
    run_in_background,
    script_op,
    timed,
)
from tasklock.core.keys import fence_counter_ttl_ms, wake_channel
from tasklock.core.lease import fence_key_or_default
from tasklock.core.quorum import (
    DEFAULT_DRIFT_EXTRA_MS,
    DEFAULT_DRIFT_FACTOR,
    DEFAULT_NODE_TIMEOUT,
    AttemptState,
    Quorum,
    RetriesNoVerdict,
    Tally,
    Validity,
    attempt_value,
    check_node_count,
    clients_from,
    decided_by,
    default_node_timeout,
    drift_for,
    fault_tolerance,
    flag,
    next_fence,
    owner_of,
    quorum_for,
    quorum_ttl,
    round1,
    seconds_until_free,
    tally,
    timing,
    undo_late_set,
    validity_left,
)
from tasklock.core.scripts import (
    REDLOCK_ACQUIRE,
    REDLOCK_EXTEND,
    REDLOCK_FENCE,
    REDLOCK_RELEASE,
)
from tasklock.core.wakeup import PUBLISH_REFUSED, Subscription, hub_for, warn_wakeup_refused
from tasklock.core.watchdog import Outcome, Renewal, RenewCall

__all__ = [
    "DEFAULT_NODE_TIMEOUT",
    "Redlock",
    "Tally",
    "Validity",
    "attempt_value",
    "check_node_count",
    "default_node_timeout",
    "drift_for",
    "fault_tolerance",
    "next_fence",
    "quorum_for",
    "quorum_ttl",
    "seconds_until_free",
    "tally",
    "validity_left",
]


class Redlock(RetriesNoVerdict, BaseLock):
    """A lock over N independent Redis masters; same interface as :class:`tasklock.Lock`.

    ``clients`` is a list of redis-py clients or Redis URLs (one per master; clients made from
    URLs get socket and connect timeouts equal to ``connect_timeout``: the rounds have deadlines
    of their own). The key on every master is exactly ``name``. Extra keyword-only parameters:

    * ``fence_key``: the fence counter's key on every master (default ``{name}:fence``).
    * ``drift_factor`` (0.01) and ``drift_extra_ms`` (2): the clock-drift allowance subtracted
      from the validity time, ``TTL * drift_factor + drift_extra_ms``.
    * ``node_timeout``: seconds each master gets to answer each round, from the moment its
      command is written (default 0.1, at most a tenth of the TTL). A master that does not
      answer in time counts as failed for that round.
    * ``connect_timeout``: seconds a master without an idle connection gets to be connected
      before its command is written (default 1.0, at most a quarter of the TTL, at least
      ``node_timeout``); time spent connecting a cold pool is not a master's silence. A master
      whose last call failed gets ``node_timeout`` for both together.

    A round that gets no verdict (a majority silent) is retried by a blocking ``acquire`` with
    the jittered backoff until its ``blocking_timeout``; :class:`~tasklock.errors.QuorumNotReached`
    is raised only once that has passed, or at once by a non-blocking call.
    * ``watchdog``, ``on_lost``, ``owner_info``: as for :class:`tasklock.Lock`.

    Masters must persist (AOF with ``appendfsync always``) or restart only after the TTL; see the
    module documentation for that and for what Redlock does not guarantee.
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
        on_lost: Callable[[BaseLock], Any] | None = None,
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
        #: The redis-py clients, one per master (made from URLs where URLs were given).
        self.clients = clients_from(
            clients,
            kind="redis-py client (redis.Redis)",
            accepts=lambda item: (
                hasattr(item, "execute_command") and hasattr(item, "connection_pool")
            ),
            from_url=lambda url: client_for_url(
                url, socket_timeout=self.connect_timeout, connect_timeout=self.connect_timeout
            ),
        )
        check_node_count(len(self.clients))
        self._nodes: list[Node] = [node_for(client) for client in self.clients]
        self.quorum = quorum_for(len(self.clients))
        self._rules = Quorum(
            self.name,
            [node.label for node in self._nodes],
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
        # Holds whose round 1 left replies outstanding: their late SETs are undone on release.
        self._open: dict[bytes, AttemptState] = {}
        self._open_lock = threading.Lock()

    # -- shared pieces --------------------------------------------------------------------------
    def _quorum_error(self, doing: str, verdicts: Tally) -> Exception:
        return self._rules.error(doing, verdicts)

    def _release_op(self, owner: bytes, value: bytes) -> Op:
        return script_op(REDLOCK_RELEASE, (self.name,), (owner, value, self._channel))

    def _fan(
        self,
        ops: Sequence[Op],
        indexes: Sequence[int] | None = None,
        decided: Callable[[list[Any]], bool] | None = None,
    ) -> Round:
        """One round to the masters at ``indexes`` (default: all), ``ops`` one per master."""
        nodes = self._nodes if indexes is None else [self._nodes[i] for i in indexes]
        return fan_out(
            nodes, ops, self.node_timeout, decided=decided, connect_timeout=self.connect_timeout
        )

    def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        owner = attempt_value(token).encode()
        n, q = len(self._nodes), self.quorum
        validity = Validity(self.ttl, self.drift)
        acquire = script_op(REDLOCK_ACQUIRE, self._keys, (owner, self._ttl_ms))
        first = self._fan([acquire] * n, decided=decided_by(round1, q))
        verdicts = tally(first.results, round1)
        state = AttemptState(self._release_op(owner, owner))
        if verdicts.reached(q) and validity.left() > 0:
            # Masters that answer round 1 after the quorum hold our key too; if the attempt has
            # failed or the hold has ended by the time their answer comes, the reaper undoes it.
            # A master the reaper gives up on gets the undo too, queued behind the SET on the
            # same connection whatever the hold is doing: a later release travels on another
            # connection, which a master resuming from a long pause may run before the SET,
            # leaving a key nobody deletes. (That master was never part of the hold's quorum.)
            first.settle(late=lambda index, reply: undo_late_set(state, index, reply))
            fence = next_fence(verdicts.yes.values())
            value = owner + b"#" + str(fence).encode()
            state.release = self._release_op(owner, value)
            chosen = sorted(verdicts.yes)
            fence_op = script_op(REDLOCK_FENCE, self._keys, (owner, fence, self._fence_ttl_ms))
            second = self._fan([fence_op] * len(chosen), chosen, decided_by(flag, q))
            fenced = tally(second.results, flag, chosen)
            if fenced.reached(q) and validity.left() > 0:
                second.settle()
                if any(first.outstanding):
                    with self._open_lock:
                        self._open[owner] = state
                return Attempt(True, value, fence)
            # Round 2 fell short: undo wherever round 1 put our key, late answers included.
            kept = state.finish()
            late = {i for i, waiting in enumerate(second.outstanding) if waiting}
            second.settle(followups=dict.fromkeys(late, state.release))
            self._undo(state.release, (set(chosen) | kept) - {chosen[i] for i in late})
            verdicts.failed.update(fenced.failed)
            verdicts.unawaited.update(fenced.unawaited)
        else:
            # No quorum in time: undo everywhere our SET may have run. Masters that have not
            # answered get the undo queued behind the SET on the same connection.
            state.finish()
            late = {i for i, waiting in enumerate(first.outstanding) if waiting}
            first.settle(followups=dict.fromkeys(late, state.release))
            maybe = {i for i in verdicts.failed if first.sent[i]} - late
            self._undo(state.release, set(verdicts.yes) | maybe)
        return self._rules.failed_attempt(verdicts)

    def _undo(self, release: Op, indexes: set[int]) -> None:
        """Delete a failed attempt's key on ``indexes``; waits (at most node_timeout) so that our
        own next attempt does not find our own stale key."""
        if indexes:
            self._send_release(release, sorted(indexes))

    def _send_release(
        self,
        release: Op,
        indexes: Sequence[int] | None = None,
        decided: Callable[[list[Any]], bool] | None = None,
    ) -> Round:
        """Release (or undo) on the masters at ``indexes``: "release on every instance, even
        those that seemed to fail". One not answered in time has it on its connection (the
        reaper reads the answer); one that got no connection in time gets it later, when it has
        one (:meth:`Node.defer`): it is owner-checked, so late is harmless, and the key goes
        long before its TTL."""
        chosen = range(len(self._nodes)) if indexes is None else indexes
        done = self._fan([release] * len(chosen), indexes, decided)
        done.settle()
        for i, sent in zip(chosen, done.sent, strict=True):
            if not sent:
                self._nodes[i].defer(release)
        return done

    # -- release / extend -----------------------------------------------------------------------
    def _finish(self, owner: bytes) -> None:
        with self._open_lock:
            state = self._open.pop(owner, None)
        if state is not None:
            state.finish()  # the release goes to every master, late SETs included

    def _release_value(self, value: bytes) -> bool:
        owner = owner_of(value)
        self._finish(owner)
        release = self._release_op(owner, value)
        done = self._send_release(release, decided=decided_by(flag, self.quorum))
        for node, reply in zip(self._nodes, done.results, strict=True):
            if reply == PUBLISH_REFUSED:
                warn_wakeup_refused(node.label, "PUBLISH")
        return self._rules.released(done.results)

    def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        owner = owner_of(value)
        nodes, q = self._nodes, self.quorum
        ms = max(1, int(seconds * 1000))
        timer = Validity(seconds, 0.0)
        extend = script_op(
            REDLOCK_EXTEND, (self.name,), (owner, value, ms, "1" if replace else "0")
        )
        done = self._fan([extend] * len(nodes), decided=decided_by(flag, q))
        done.settle()
        if self._rules.extended(done.results, seconds, timer.elapsed()):
            return True
        self._finish(owner)  # not ours on a quorum (any more): the hold ends
        return False

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        owner = owner_of(value)
        args = (owner, value, self._ttl_ms, "1")
        calls: list[RenewCall] = [
            (timed(node, self.node_timeout), REDLOCK_EXTEND, (self.name,), args)
            for node in self._nodes
        ]

        def judge(results: list[Any], elapsed: float) -> Outcome:
            outcome = self._rules.renewed(results, elapsed)
            if outcome is Outcome.LOST:
                self._finish(owner)
            return outcome

        return Renewal(self.name, self.ttl, calls, judge, on_lost)

    # -- reads ----------------------------------------------------------------------------------
    def locked(self) -> bool:
        """True if enough masters hold ``name`` that nobody else could take a quorum now."""
        n = len(self._nodes)
        done = self._fan([Op(("EXISTS", self.name))] * n)
        done.settle()
        return self._rules.locked(done.results)

    def _stored_value_is(self, value: bytes) -> bool:
        n = len(self._nodes)
        done = self._fan([Op(("GET", self.name))] * n)
        done.settle()
        return self._rules.stored_is(done.results, value)

    def _peek(self) -> tuple[bytes | None, int | None]:
        """The value most masters hold for ``name`` (the current holder's, normally) and how long
        until expiry alone would free a quorum, in ms; (None, None) when a quorum is free."""
        n = len(self._nodes)
        gets = self._fan([Op(("GET", self.name))] * n)
        gets.settle()
        ttls = self._fan([Op(("PTTL", self.name))] * n)
        ttls.settle()
        return self._rules.holder(gets.results, ttls.results)

    # -- waiting --------------------------------------------------------------------------------
    def _waiter(self, token: str) -> _Waiter:
        return _AnyNodeWaiter(self.clients, self._nodes, self._channel, self.node_timeout)


class _AnyNodeWaiter:
    """Subscribed to the lock's wake channel on every master that answers; wakes on any.

    Subscribing can block on a stalled master (redis-py connects synchronously), so it runs on
    the fan-out's background workers, and masters already failing are skipped: the releasing
    holder publishes on each master it releases, so any one subscription that works suffices,
    and jittered polling remains the fallback.
    """

    def __init__(
        self, clients: Sequence[Any], nodes: Sequence[Node], channel: str, timeout: float
    ) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._subscriptions: list[Subscription] = []
        self._closed = False
        futures = [
            run_in_background(functools.partial(self._subscribe, client, channel))
            for client, node in zip(clients, nodes, strict=True)
            if node.failing_since is None
        ]
        concurrent.futures.wait(futures, timeout)

    def _subscribe(self, client: Any, channel: str) -> None:
        subscription = hub_for(client).watch(channel, self._event)
        with self._lock:
            if not self._closed:
                self._subscriptions.append(subscription)
                return
        subscription.close()

    def arm(self) -> None:
        self._event.clear()

    def wait(self, timeout: float) -> bool:
        return clock.wait(self._event, timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            subscription.close()
