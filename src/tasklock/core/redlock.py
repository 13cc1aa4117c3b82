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

Every fan-out is parallel and bounded by ``node_timeout`` per master (see
:mod:`tasklock.core.fanout`): a stopped, paused or partitioned master costs at most that, never a
socket timeout. Extend and the watchdog's renewal go to every master and need a quorum within the
validity time; a renewal that finds the lock gone on a majority marks it lost (``lock.lost``,
``on_lost``). When a majority gives no verdict at all (errors, timeouts) the call raises
:class:`~tasklock.errors.QuorumNotReached`, naming each failed master and why; a lock that is
simply held by someone else is not an error (``acquire`` returns False, as with ``Lock``).

How many masters: N = 2k + 1 tolerates k failed or unreachable masters (3 tolerates 1, 5
tolerates 2). An even N tolerates no more than N - 1 and has one more master that can fail, so it
is refused; N = 1 works but is not fault tolerant (a warning says so; use :class:`tasklock.Lock`).

Requirements and limits — read these before relying on Redlock:

* Persistence. A master that restarts empty forgets both the lock and its fence counter, so a
  second client can take a majority while the first still holds it, and tokens can repeat. Run
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
import secrets
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tasklock.core.base import Attempt, BaseLock, Number, _Waiter
from tasklock.core.clock import clock
from tasklock.core.connection import client_for_url, describe_client, validate_url
from tasklock.core.fanout import (
    PENDING,
    Node,
    NotAwaited,
    Op,
    fan_out,
    node_for,
    run_in_background,
    script_op,
)
from tasklock.core.keys import fence_key_for, wake_channel
from tasklock.core.scripts import (
    REDLOCK_ACQUIRE,
    REDLOCK_EXTEND,
    REDLOCK_FENCE,
    REDLOCK_RELEASE,
)
from tasklock.core.wakeup import Subscription, hub_for
from tasklock.core.watchdog import Outcome, Renewal, RenewCall
from tasklock.errors import ConfigurationError, QuorumNotReached

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
    "validity_left",
]

#: Per-master deadline when none is given (capped at a tenth of the TTL for very short TTLs).
DEFAULT_NODE_TIMEOUT = 0.1


# -- the arithmetic, pure -----------------------------------------------------------------------
#: The clock-drift allowance subtracted from the validity time: ``TTL * factor + extra``.
DEFAULT_DRIFT_FACTOR = 0.01
DEFAULT_DRIFT_EXTRA_MS = 2.0


def quorum_for(n: int) -> int:
    """Masters that must agree: a strict majority."""
    return n // 2 + 1


def fault_tolerance(n: int) -> int:
    """Masters that may fail (stopped, paused, partitioned) while the lock keeps working."""
    return n - quorum_for(n)


def check_node_count(n: int) -> None:
    """Refuse counts where a quorum makes no sense; warn for a single master."""
    table = "; ".join(f"N={k} tolerates {fault_tolerance(k)}" for k in (1, 3, 5, 7))
    if n < 1:
        raise ConfigurationError(f"clients must name at least one Redis master, got {n} ({table})")
    if n % 2 == 0:
        raise ConfigurationError(
            f"clients has {n} masters: quorum is {quorum_for(n)} of {n}, so it tolerates "
            f"{fault_tolerance(n)} failed master(s), no more than {n - 1} masters would, and has "
            f"one more that can fail. Use an odd number ({table})"
        )
    if n == 1:
        warnings.warn(
            "Redlock over a single master is not fault tolerant (if it fails, nobody can take "
            f"the lock); use tasklock.Lock for one Redis, or 3 or 5 masters ({table})",
            RuntimeWarning,
            stacklevel=3,
        )


def drift_for(ttl: float, factor: float, extra_ms: float) -> float:
    """Seconds allowed for clock drift between the masters and us: ``ttl * factor + extra``."""
    return ttl * factor + extra_ms / 1000


def validity_left(ttl: float, elapsed: float, drift: float) -> float:
    """Seconds the lock is still known to be held: ``TTL - elapsed - drift`` (<= 0: not held)."""
    return ttl - elapsed - drift


class Validity:
    """Validity time of one operation, measured on the monotonic clock from its start."""

    __slots__ = ("drift", "started", "ttl")

    def __init__(self, ttl: float, drift: float) -> None:
        self.ttl = ttl
        self.drift = drift
        self.started = clock.monotonic()

    def elapsed(self) -> float:
        return clock.monotonic() - self.started

    def left(self) -> float:
        """Seconds still valid now (<= 0: expired)."""
        return validity_left(self.ttl, self.elapsed(), self.drift)


def default_node_timeout(ttl: float) -> float:
    """The per-master deadline: :data:`DEFAULT_NODE_TIMEOUT`, at most a tenth of the TTL."""
    return min(DEFAULT_NODE_TIMEOUT, ttl / 10)


def next_fence(counters: Iterable[int]) -> int:
    """Round 2's token: one above the highest counter round 1 read."""
    return max(counters) + 1


def quorum_ttl(ttls: Iterable[float], quorum: int) -> float | None:
    """The TTL that at least ``quorum`` masters have (the quorum-th largest), or None."""
    ordered = sorted(ttls, reverse=True)
    return ordered[quorum - 1] if len(ordered) >= quorum else None


def seconds_until_free(held_ttls_ms: Iterable[int], free: int, quorum: int) -> float | None:
    """When enough held masters expire to make a quorum free, if their holder never releases.

    ``held_ttls_ms`` are the holders' remaining TTLs (-1: no TTL, never expires), ``free`` the
    masters that are free now. None when expiry alone cannot free a quorum.
    """
    needed = quorum - free
    if needed <= 0:
        return 0.0
    expiring = sorted(t for t in held_ttls_ms if t >= 0)
    return expiring[needed - 1] / 1000 if len(expiring) >= needed else None


@dataclass
class Tally:
    """The verdicts of one round, by master index: yes, no (a definite answer), or no verdict."""

    yes: dict[int, Any] = field(default_factory=dict)
    no: dict[int, Any] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    #: Masters whose answer was not waited for because the outcome was already decided.
    unawaited: set[int] = field(default_factory=set)

    def reached(self, quorum: int) -> bool:
        return len(self.yes) >= quorum

    def refused(self, n: int, quorum: int) -> bool:
        """So many definite noes that a quorum of yeses is impossible."""
        return len(self.no) > n - quorum

    def undecided(self, n: int, quorum: int) -> bool:
        """Neither a quorum of yeses nor of noes: failures left the outcome open."""
        return not self.reached(quorum) and not self.refused(n, quorum)

    def unreachable(self, quorum: int) -> bool:
        """A majority gave no verdict (errors or timeouts rather than answers)."""
        return len(self.failed) - len(self.unawaited) >= quorum


Classifier = Callable[[Any], tuple[bool | None, Any]]  # reply -> (yes/no/None=failed, value)


def tally(
    results: Sequence[Any], classify: Classifier, indexes: Sequence[int] | None = None
) -> Tally:
    """Sort a round's results into yes / no / failed (with the reason)."""
    out = Tally()
    for position, reply in enumerate(results):
        index = indexes[position] if indexes is not None else position
        verdict, value = classify(reply)
        if isinstance(reply, NotAwaited):
            out.unawaited.add(index)
        if verdict is True:
            out.yes[index] = value
        elif verdict is False:
            out.no[index] = value
        else:
            out.failed[index] = value
    return out


def attempt_value(token: str) -> str:
    """The value round 1 stores: the owner token made unique to this attempt.

    The retries of one blocking acquire share the owner token; an undo still queued on a paused
    master for an earlier attempt must never delete a later attempt's key there. tasklock's own
    tokens (``<hex> {json}``) get the suffix inside the JSON, so operators' tools still read them.
    """
    nonce = secrets.token_hex(4)
    if token.endswith("}") and " {" in token:
        separator = "" if token.endswith("{}") else ","
        return f'{token[:-1]}{separator}"try":"{nonce}"}}'
    return f"{token}~{nonce}"


def _reason(reply: Any) -> str:
    if isinstance(reply, BaseException):
        return f"{type(reply).__name__}: {reply}"
    return f"unexpected reply {reply!r}"


def _round1(reply: Any) -> tuple[bool | None, Any]:
    """REDLOCK_ACQUIRE: {1, counter} acquired; {0, pttl} held by someone else."""
    if isinstance(reply, list | tuple) and len(reply) == 2 and isinstance(reply[1], int):
        if reply[0] == 1:
            return True, int(reply[1])
        if reply[0] == 0:
            return False, int(reply[1])
    return None, _reason(reply)


def _flag(reply: Any) -> tuple[bool | None, Any]:
    """Scripts that answer 1 (done) / 0 (not ours), or a positive TTL / 0 for extend."""
    if isinstance(reply, int) and not isinstance(reply, bool):
        return (reply > 0), reply
    return None, _reason(reply)


def _decided_by(classify: Classifier, need: int) -> Callable[[list[Any]], bool]:
    """For :func:`fan_out`: stop waiting once ``need`` yeses are in, or once so many definite
    noes are in that they cannot be. Errors and silence decide nothing: the remaining masters
    are waited for (at most the deadline), so a silent majority is reported as such."""

    def decided(results: list[Any]) -> bool:
        yes = no = 0
        for reply in results:
            if reply is not PENDING:
                verdict = classify(reply)[0]
                if verdict is True:
                    yes += 1
                elif verdict is False:
                    no += 1
        return yes >= need or no > len(results) - need

    return decided


def _same_value(stored: Any, values: tuple[bytes, bytes]) -> bool:
    if isinstance(stored, str):
        stored = stored.encode()
    return stored in values


# -- identity of a master ------------------------------------------------------------------------
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


def _server_of(client: Any) -> tuple[Any, ...]:
    kwargs: dict[str, Any] = getattr(client.connection_pool, "connection_kwargs", {}) or {}
    if kwargs.get("path"):
        return ("unix", kwargs["path"])
    host = str(kwargs.get("host", "localhost")).lower()
    return ("tcp", "127.0.0.1" if host in _LOOPBACK else host, int(kwargs.get("port", 6379)))


@dataclass(eq=False)
class _AttemptState:
    """Shared with the reaper: replies that arrive after we stopped waiting check ``finished``
    (the attempt failed or the hold ended) and undo a late SET on that same connection."""

    release: Op
    finished: bool = False


class Redlock(BaseLock):
    """A lock over N independent Redis masters; same interface as :class:`tasklock.Lock`.

    ``clients`` is a list of redis-py clients or Redis URLs (one per master; clients made from
    URLs get socket timeouts equal to ``node_timeout``). The key on every master is exactly
    ``name``. Extra keyword-only parameters:

    * ``fence_key``: the fence counter's key on every master (default ``{name}:fence``).
    * ``drift_factor`` (0.01) and ``drift_extra_ms`` (2): the clock-drift allowance subtracted
      from the validity time, ``TTL * drift_factor + drift_extra_ms``.
    * ``node_timeout``: seconds each master gets to answer each round (default 0.1, at most a
      tenth of the TTL). A master that does not answer in time counts as failed for that round.
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
        _check_number("drift_factor", drift_factor, low=0.0, high=1.0)
        _check_number("drift_extra_ms", drift_extra_ms, low=0.0, high=None)
        if node_timeout is not None:
            _check_number("node_timeout", node_timeout, low=0.0, high=None, low_ok=False)
        if fence_key is not None and (not isinstance(fence_key, str) or not fence_key):
            raise ConfigurationError(f"fence_key must be a non-empty string, got {fence_key!r}")
        self.drift = drift_for(self.ttl, float(drift_factor), float(drift_extra_ms))
        if self.drift >= self.ttl:
            raise ConfigurationError(
                f"timeout={self.ttl} leaves no validity time after the clock-drift allowance of "
                f"{self.drift:.3f} s (drift_factor={drift_factor}, "
                f"drift_extra_ms={drift_extra_ms}); use a longer timeout"
            )
        self.drift_factor = float(drift_factor)
        self.drift_extra_ms = float(drift_extra_ms)
        #: Seconds each master gets to answer each round.
        self.node_timeout = (
            default_node_timeout(self.ttl) if node_timeout is None else float(node_timeout)
        )
        #: The redis-py clients, one per master (made from URLs where URLs were given).
        self.clients = self._clients_from(clients)
        check_node_count(len(self.clients))
        self._nodes: list[Node] = [node_for(client) for client in self.clients]
        self.quorum = quorum_for(len(self.clients))
        self.fence_key = fence_key or fence_key_for(self.name)
        self._keys = (self.name, self.fence_key)
        self._ttl_ms = max(1, int(self.ttl * 1000))
        self._channel = wake_channel(self.name)
        # Holds whose round 1 left replies outstanding: their late SETs are undone on release.
        self._open: dict[bytes, _AttemptState] = {}
        self._open_lock = threading.Lock()

    def _clients_from(self, clients: Sequence[Any]) -> list[Any]:
        if isinstance(clients, str | bytes) or not isinstance(clients, Sequence):
            raise ConfigurationError(
                "clients must be a list of redis-py clients or Redis URLs (one per master), "
                f"got {clients!r}"
            )
        made: list[Any] = []
        seen: dict[tuple[Any, ...], int] = {}
        for index, item in enumerate(clients):
            option = f"clients[{index}]"
            if isinstance(item, str):
                validate_url(item, option)
                client = client_for_url(
                    item, socket_timeout=self.node_timeout, connect_timeout=self.node_timeout
                )
            elif hasattr(item, "execute_command") and hasattr(item, "connection_pool"):
                client = item
            else:
                raise ConfigurationError(
                    f"{option} must be a redis-py client (redis.Redis) or a Redis URL, got "
                    f"{type(item).__name__}"
                )
            server = _server_of(client)
            if server in seen:
                raise ConfigurationError(
                    f"clients[{seen[server]}] and {option} are the same Redis server "
                    f"({describe_client(client)}): Redlock needs independent masters, each listed "
                    "once"
                )
            seen[server] = index
            made.append(client)
        return made

    # -- shared pieces --------------------------------------------------------------------------
    def _quorum_error(self, doing: str, verdicts: Tally) -> QuorumNotReached:
        failures = {self._nodes[i].label: reason for i, reason in sorted(verdicts.failed.items())}
        listed = "; ".join(f"{label}: {reason}" for label, reason in failures.items())
        n = len(self._nodes)
        return QuorumNotReached(
            f"Redlock {self.name!r}: {len(failures)} of {n} masters gave no verdict while "
            f"{doing}, so no quorum ({self.quorum} of {n}) could be formed: {listed}. Check "
            "that the masters are running and reachable; a master slower than "
            f"node_timeout={self.node_timeout * 1000:.0f} ms counts as failed",
            failures,
        )

    def _release_op(self, owner: bytes, value: bytes) -> Op:
        return script_op(REDLOCK_RELEASE, (self.name,), (owner, value, self._channel))

    @staticmethod
    def _owner_of(value: bytes) -> bytes:
        return value.rsplit(b"#", 1)[0]

    # -- acquire --------------------------------------------------------------------------------
    def _attempt(self, token: str) -> Attempt:
        owner = attempt_value(token).encode()
        nodes, n, q = self._nodes, len(self._nodes), self.quorum
        validity = Validity(self.ttl, self.drift)
        first = fan_out(
            nodes,
            [script_op(REDLOCK_ACQUIRE, self._keys, (owner, self._ttl_ms))] * n,
            self.node_timeout,
            decided=_decided_by(_round1, q),
        )
        verdicts = tally(first.results, _round1)
        state = _AttemptState(self._release_op(owner, owner))
        if verdicts.reached(q) and validity.left() > 0:
            # Masters that answer round 1 after the quorum hold our key too; if the attempt has
            # failed or the hold has ended by the time their answer comes, the reaper undoes it.
            first.settle(late=lambda index, reply: state.release if state.finished else None)
            fence = next_fence(verdicts.yes.values())
            value = owner + b"#" + str(fence).encode()
            state.release = self._release_op(owner, value)
            chosen = sorted(verdicts.yes)
            second = fan_out(
                [nodes[i] for i in chosen],
                [script_op(REDLOCK_FENCE, self._keys, (owner, fence))] * len(chosen),
                self.node_timeout,
                decided=_decided_by(_flag, q),
            )
            fenced = tally(second.results, _flag, chosen)
            if fenced.reached(q) and validity.left() > 0:
                second.settle()
                if any(first.outstanding):
                    with self._open_lock:
                        self._open[owner] = state
                return Attempt(True, value, fence)
            # Round 2 fell short: undo wherever round 1 put our key.
            state.finished = True
            late = {i for i, waiting in enumerate(second.outstanding) if waiting}
            second.settle(followups=dict.fromkeys(late, state.release))
            self._undo(state.release, set(chosen) - {chosen[i] for i in late})
            verdicts.failed.update(fenced.failed)
            verdicts.unawaited.update(fenced.unawaited)
        else:
            # No quorum in time: undo everywhere our SET may have run. Masters that have not
            # answered get the undo queued behind the SET on the same connection.
            state.finished = True
            late = {i for i, waiting in enumerate(first.outstanding) if waiting}
            first.settle(followups=dict.fromkeys(late, state.release))
            maybe = {i for i in verdicts.failed if first.sent[i]} - late
            self._undo(state.release, set(verdicts.yes) | maybe)
        if verdicts.unreachable(q):
            raise self._quorum_error("acquiring", verdicts)
        held = list(verdicts.no.values())
        free = n - len(held) - len(verdicts.failed)
        return Attempt(False, holder_ttl=seconds_until_free(held, free, q))

    def _undo(self, release: Op, indexes: set[int]) -> None:
        """Delete a failed attempt's key on ``indexes``; waits (at most node_timeout) so that our
        own next attempt does not find our own stale key."""
        if not indexes:
            return
        chosen = sorted(indexes)
        undo = fan_out([self._nodes[i] for i in chosen], [release] * len(chosen), self.node_timeout)
        undo.settle()

    # -- release / extend -----------------------------------------------------------------------
    def _finish(self, owner: bytes) -> None:
        with self._open_lock:
            state = self._open.pop(owner, None)
        if state is not None:
            state.finished = True

    def _release_value(self, value: bytes) -> bool:
        owner = self._owner_of(value)
        self._finish(owner)
        nodes, q = self._nodes, self.quorum
        release = self._release_op(owner, value)
        done = fan_out(
            nodes, [release] * len(nodes), self.node_timeout, decided=_decided_by(_flag, q)
        )
        done.settle()
        for node, sent in zip(nodes, done.sent, strict=True):
            if not sent:  # no connection in time: sent when the master is back (harmless late)
                node.defer(release)
        verdicts = tally(done.results, _flag)
        if verdicts.reached(q):
            return True
        if verdicts.refused(len(nodes), q):
            return False
        raise self._quorum_error("releasing (the keys expire with their TTL)", verdicts)

    def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        owner = self._owner_of(value)
        nodes, q = self._nodes, self.quorum
        ms = max(1, int(seconds * 1000))
        timer = Validity(seconds, 0.0)
        done = fan_out(
            nodes,
            [script_op(REDLOCK_EXTEND, (self.name,), (owner, value, ms, "1" if replace else "0"))]
            * len(nodes),
            self.node_timeout,
            decided=_decided_by(_flag, q),
        )
        done.settle()
        verdicts = tally(done.results, _flag)
        if verdicts.reached(q):
            ttl = (quorum_ttl(verdicts.yes.values(), q) or 0) / 1000
            drift = drift_for(ttl, self.drift_factor, self.drift_extra_ms)
            if validity_left(ttl, timer.elapsed(), drift) > 0:
                return True
        elif verdicts.undecided(len(nodes), q):
            raise self._quorum_error("extending", verdicts)
        self._finish(owner)  # not ours on a quorum (any more): the hold ends
        return False

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        owner = self._owner_of(value)
        args = (owner, value, self._ttl_ms, "1")
        calls: list[RenewCall] = [
            (node.timed(self.node_timeout), REDLOCK_EXTEND, (self.name,), args)
            for node in self._nodes
        ]
        n, q, ttl, drift = len(self._nodes), self.quorum, self.ttl, self.drift

        def judge(results: list[Any], elapsed: float) -> Outcome:
            verdicts = tally(results, _flag)
            if verdicts.reached(q) and validity_left(ttl, elapsed, drift) > 0:
                return Outcome.RENEWED
            if verdicts.refused(n, q):
                self._finish(owner)
                return Outcome.LOST
            return Outcome.UNREACHABLE

        return Renewal(self.name, self.ttl, calls, judge, on_lost)

    # -- reads ----------------------------------------------------------------------------------
    def locked(self) -> bool:
        """True if enough masters hold ``name`` that nobody else could take a quorum now."""
        nodes, n, q = self._nodes, len(self._nodes), self.quorum
        done = fan_out(nodes, [Op(("EXISTS", self.name))] * n, self.node_timeout)
        done.settle()
        verdicts = tally(done.results, _flag)
        if len(verdicts.yes) >= n - q + 1:
            return True
        if len(verdicts.no) >= q:
            return False
        raise self._quorum_error("reading the lock", verdicts)

    def _stored_value_is(self, value: bytes) -> bool:
        owner = self._owner_of(value)
        nodes, n, q = self._nodes, len(self._nodes), self.quorum

        def ours(reply: Any) -> tuple[bool | None, Any]:
            if reply is None or isinstance(reply, bytes | str):
                return _same_value(reply, (owner, value)), reply
            return None, _reason(reply)

        done = fan_out(nodes, [Op(("GET", self.name))] * n, self.node_timeout)
        done.settle()
        verdicts = tally(done.results, ours)
        if verdicts.reached(q):
            return True
        if verdicts.refused(n, q):
            return False
        raise self._quorum_error("reading the lock", verdicts)

    def _peek(self) -> tuple[bytes | None, int | None]:
        """The value most masters hold for ``name`` (the current holder's, normally) and how long
        until expiry alone would free a quorum, in ms; (None, None) when a quorum is free."""
        nodes, n, q = self._nodes, len(self._nodes), self.quorum
        gets = fan_out(nodes, [Op(("GET", self.name))] * n, self.node_timeout)
        gets.settle()
        ttls = fan_out(nodes, [Op(("PTTL", self.name))] * n, self.node_timeout)
        ttls.settle()
        values = Counter(
            (v.encode() if isinstance(v, str) else v)
            for v in gets.results
            if isinstance(v, bytes | str)
        )
        if not values:
            return None, None
        held = [t for t in ttls.results if isinstance(t, int) and not isinstance(t, bool)]
        free = sum(1 for t in held if t == -2)
        seconds = seconds_until_free([t for t in held if t != -2], free, q)
        return values.most_common(1)[0][0], None if seconds is None else int(seconds * 1000)

    # -- waiting --------------------------------------------------------------------------------
    def _waiter(self) -> _Waiter:
        return _AnyNodeWaiter(self.clients, self._nodes, self._channel, self.node_timeout)


def _check_number(
    option: str, value: Any, *, low: float, high: float | None, low_ok: bool = True
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ConfigurationError(f"{option} must be a number, got {value!r}")
    if value < low or (value == low and not low_ok) or (high is not None and value >= high):
        bound = f">= {low}" if low_ok else f"> {low}"
        if high is not None:
            bound += f" and < {high}"
        raise ConfigurationError(f"{option} must be {bound}, got {value!r}")


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
