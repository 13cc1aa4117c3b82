"""Redlock's rules, with no I/O: one copy for the blocking and the asyncio Redlock.

The arithmetic (quorum, fault tolerance, drift, validity, the next fence, when expiry alone frees
a quorum), how a round's replies are read (:func:`tally` with a classifier per script), what a
round decides (:class:`Quorum`: acquired, released, extended, renewed, locked, ours, the
current holder) and the errors it raises. :class:`tasklock.Redlock` fans out over threads and
sockets (:mod:`tasklock.core.fanout`), :class:`tasklock.asyncio.Redlock` over tasks; neither
decides anything itself.
"""

from __future__ import annotations

import secrets
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tasklock.core.clock import clock
from tasklock.core.connection import describe_client, validate_url
from tasklock.core.lease import GIVE_UP, AcquireLoop, Attempt
from tasklock.core.ops import PENDING, NoReply, NotAwaited, Op
from tasklock.core.renewal import Outcome
from tasklock.errors import ConfigurationError, QuorumNotReached

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_DRIFT_EXTRA_MS",
    "DEFAULT_DRIFT_FACTOR",
    "DEFAULT_NODE_TIMEOUT",
    "AttemptState",
    "Classifier",
    "NoVerdict",
    "Quorum",
    "QuorumLoop",
    "Tally",
    "Timing",
    "Validity",
    "attempt_value",
    "check_node_count",
    "check_number",
    "clients_from",
    "decided_by",
    "default_connect_timeout",
    "default_node_timeout",
    "drift_for",
    "fault_tolerance",
    "flag",
    "next_fence",
    "owner_of",
    "quorum_for",
    "quorum_ttl",
    "reason",
    "round1",
    "same_value",
    "seconds_until_free",
    "server_of",
    "tally",
    "timing",
    "undo_late_set",
    "validity_left",
]

#: Per-master deadline when none is given (capped at a tenth of the TTL for very short TTLs).
#: It runs from the moment the master's command is written, so it measures the master's answer
#: (plus this process's scheduling), not the time spent getting a connection to it.
DEFAULT_NODE_TIMEOUT = 0.1
#: How long a master that has no idle connection gets to be connected (TCP, TLS, HELLO, AUTH)
#: before its command is written, when none is given: at most a quarter of the TTL, at least
#: ``node_timeout``. A cold pool (the first rounds, or a burst of concurrent acquires needing more
#: connections than are stocked) is not a silent master. A master whose last call failed gets only
#: ``node_timeout`` for connect and answer together, so a master that is down keeps costing each
#: round no more than that.
DEFAULT_CONNECT_TIMEOUT = 1.0


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


def default_connect_timeout(ttl: float, node_timeout: float) -> float:
    """How long a master gets to be connected: :data:`DEFAULT_CONNECT_TIMEOUT`, at most a quarter
    of the TTL (most of the validity time is left), never less than ``node_timeout``."""
    return max(node_timeout, min(DEFAULT_CONNECT_TIMEOUT, ttl / 4))


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


def reason(reply: Any) -> str:
    if isinstance(reply, BaseException):
        return f"{type(reply).__name__}: {reply}"
    return f"unexpected reply {reply!r}"


def round1(reply: Any) -> tuple[bool | None, Any]:
    """REDLOCK_ACQUIRE: {1, counter} acquired; {0, pttl} held by someone else."""
    if isinstance(reply, list | tuple) and len(reply) == 2 and isinstance(reply[1], int):
        if reply[0] == 1:
            return True, int(reply[1])
        if reply[0] == 0:
            return False, int(reply[1])
    return None, reason(reply)


def flag(reply: Any) -> tuple[bool | None, Any]:
    """Scripts that answer 1 (done) / 0 (not ours), or a positive TTL / 0 for extend."""
    if isinstance(reply, int) and not isinstance(reply, bool):
        return (reply > 0), reply
    return None, reason(reply)


def decided_by(classify: Classifier, need: int) -> Callable[[list[Any]], bool]:
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


def same_value(stored: Any, values: tuple[bytes, bytes]) -> bool:
    if isinstance(stored, str):
        stored = stored.encode()
    return stored in values


# -- identity of a master ------------------------------------------------------------------------
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


def server_of(client: Any) -> tuple[Any, ...]:
    kwargs: dict[str, Any] = getattr(client.connection_pool, "connection_kwargs", {}) or {}
    if kwargs.get("path"):
        return ("unix", kwargs["path"])
    host = str(kwargs.get("host", "localhost")).lower()
    return ("tcp", "127.0.0.1" if host in _LOOPBACK else host, int(kwargs.get("port", 6379)))


@dataclass(eq=False)
class AttemptState:
    """Shared with the late-reply hooks (the reaper thread, or the event loop's callbacks):
    replies that arrive after we stopped waiting check ``finished`` (the attempt failed or the
    hold ended) and undo a late SET on that same connection.

    A round-1 SET granted late while the attempt was still open is left in place (the hold may
    need it), and its master is remembered in ``kept``: if the attempt then fails, :meth:`finish`
    hands those masters back so that the undo reaches them too. Without that, a master that
    answered round 1 just after the quorum, while round 2 was under way, kept a key nobody
    deleted when round 2 fell short.
    """

    release: Op
    finished: bool = False
    kept: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def finish(self) -> set[int]:
        """Mark the attempt (or its hold) over; the masters whose late SET was left in place."""
        with self.lock:
            self.finished = True
            kept, self.kept = self.kept, set()
        return kept


def undo_late_set(state: AttemptState, index: int, reply: Any) -> Op | None:
    """What follows a round-1 SET answered after the quorum (``reply``, from master ``index``) on
    its connection: the undo once the attempt has failed or its hold has ended, or when no
    answer came at all; else nothing now, and the master is remembered (see AttemptState)."""
    with state.lock:
        if state.finished or isinstance(reply, NoReply):
            return state.release
        if round1(reply)[0] is True:
            state.kept.add(index)
        return None


@dataclass
class NoVerdict(Attempt):
    """A failed attempt after which a majority gave no verdict: ``error`` is raised once the
    caller stops trying (a non-blocking acquire, or ``blocking_timeout`` passed)."""

    error: Exception | None = None


class QuorumLoop(AcquireLoop):
    """The acquire loop of a Redlock: a round that got no verdict (a majority silent, slow, or
    still connecting) is retried like a lock held by someone else, with the jittered backoff,
    until ``blocking_timeout``; :class:`QuorumNotReached` only when the caller gives up (the
    deadline passed, or a non-blocking call). A loaded host's scheduler is not a failed master."""

    __slots__ = ()

    @classmethod
    def of(cls, loop: AcquireLoop) -> QuorumLoop:
        """``loop``'s rules (the same deadline, backoff and state), as a QuorumLoop."""
        made = cls.__new__(cls)
        for slot in AcquireLoop.__slots__:
            setattr(made, slot, getattr(loop, slot))
        return made

    def after_failure(self, attempt: Attempt) -> float | str:
        step = super().after_failure(attempt)
        if step is GIVE_UP and isinstance(attempt, NoVerdict) and attempt.error is not None:
            raise attempt.error
        return step


class RetriesNoVerdict:
    """Mixin for the blocking and the asyncio Redlock: their acquire loops are QuorumLoops."""

    def _plan_acquire(self, *args: Any) -> tuple[str, AcquireLoop]:
        owner, loop = super()._plan_acquire(*args)  # type: ignore[misc]
        return owner, QuorumLoop.of(loop)


def check_number(
    option: str, value: Any, *, low: float, high: float | None, low_ok: bool = True
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ConfigurationError(f"{option} must be a number, got {value!r}")
    if value < low or (value == low and not low_ok) or (high is not None and value >= high):
        bound = f">= {low}" if low_ok else f"> {low}"
        if high is not None:
            bound += f" and < {high}"
        raise ConfigurationError(f"{option} must be {bound}, got {value!r}")


def owner_of(value: bytes) -> bytes:
    """The owner token of a stored value ``<owner>#<fence>`` (what the scripts check)."""
    return value.rsplit(b"#", 1)[0]


@dataclass(frozen=True)
class Timing:
    """A Redlock's clock-drift allowance and per-master deadline, checked (see :func:`timing`)."""

    drift: float  # seconds subtracted from the validity time
    drift_factor: float
    drift_extra_ms: float
    node_timeout: float  # seconds each master gets to answer each round
    connect_timeout: float  # seconds a master without an idle connection gets to be connected


def timing(
    ttl: float,
    drift_factor: Any,
    drift_extra_ms: Any,
    node_timeout: Any,
    connect_timeout: Any = None,
) -> Timing:
    """The Redlock constructor's timing options, checked, with their defaults applied."""
    check_number("drift_factor", drift_factor, low=0.0, high=1.0)
    check_number("drift_extra_ms", drift_extra_ms, low=0.0, high=None)
    if node_timeout is not None:
        check_number("node_timeout", node_timeout, low=0.0, high=None, low_ok=False)
    if connect_timeout is not None:
        check_number("connect_timeout", connect_timeout, low=0.0, high=None, low_ok=False)
    drift = drift_for(ttl, float(drift_factor), float(drift_extra_ms))
    if drift >= ttl:
        raise ConfigurationError(
            f"timeout={ttl} leaves no validity time after the clock-drift allowance of "
            f"{drift:.3f} s (drift_factor={drift_factor}, drift_extra_ms={drift_extra_ms}); "
            "use a longer timeout"
        )
    node = default_node_timeout(ttl) if node_timeout is None else float(node_timeout)
    connect = (
        default_connect_timeout(ttl, node) if connect_timeout is None else float(connect_timeout)
    )
    return Timing(drift, float(drift_factor), float(drift_extra_ms), node, connect)


def clients_from(
    clients: Any,
    *,
    kind: str,
    accepts: Callable[[Any], bool],
    from_url: Callable[[str], Any],
) -> list[Any]:
    """The masters' clients from ``clients`` (``kind`` clients, e.g. "redis-py client
    (redis.Redis)", or URLs made into clients by ``from_url``), each a different server, or a
    ConfigurationError naming the entry."""
    if isinstance(clients, str | bytes) or not isinstance(clients, Sequence):
        raise ConfigurationError(
            f"clients must be a list of {kind.split(' (')[0]}s or Redis URLs (one per master), "
            f"got {clients!r}"
        )
    made: list[Any] = []
    seen: dict[tuple[Any, ...], int] = {}
    for index, item in enumerate(clients):
        option = f"clients[{index}]"
        if isinstance(item, str):
            validate_url(item, option, single_server=True)
            client = from_url(item)
        elif accepts(item):
            client = item
        else:
            raise ConfigurationError(
                f"{option} must be a {kind} or a Redis URL, got {type(item).__name__}"
            )
        server = server_of(client)
        if server in seen:
            raise ConfigurationError(
                f"clients[{seen[server]}] and {option} are the same Redis server "
                f"({describe_client(client)}): Redlock needs independent masters, each listed "
                "once"
            )
        seen[server] = index
        made.append(client)
    return made


@dataclass
class Quorum:
    """What each kind of round decides for one Redlock, from its replies (one per master)."""

    name: str
    labels: list[str]  # one per master, for messages
    quorum: int
    node_timeout: float
    ttl: float
    drift: float
    drift_factor: float
    drift_extra_ms: float

    @property
    def n(self) -> int:
        return len(self.labels)

    def error(self, doing: str, verdicts: Tally) -> QuorumNotReached:
        failures = {self.labels[i]: why for i, why in sorted(verdicts.failed.items())}
        listed = "; ".join(f"{label}: {why}" for label, why in failures.items())
        return QuorumNotReached(
            f"Redlock {self.name!r}: {len(failures)} of {self.n} masters gave no verdict while "
            f"{doing}, so no quorum ({self.quorum} of {self.n}) could be formed: {listed}. Check "
            "that the masters are running and reachable; a master slower than "
            f"node_timeout={self.node_timeout * 1000:.0f} ms counts as failed (a blocking "
            "acquire retries until its blocking_timeout; raise node_timeout on a loaded host)",
            failures,
        )

    def _yes_no(self, verdicts: Tally, doing: str) -> bool:
        if verdicts.reached(self.quorum):
            return True
        if verdicts.refused(self.n, self.quorum):
            return False
        raise self.error(doing, verdicts)

    def failed_attempt(self, verdicts: Tally) -> Attempt:
        """An acquire attempt that did not get the lock: :class:`NoVerdict` (carrying the
        QuorumNotReached to raise if the caller stops trying) when a majority gave no verdict,
        else how long the holder's keys last (the waiter's sleep cap)."""
        if verdicts.unreachable(self.quorum):
            return NoVerdict(False, error=self.error("acquiring", verdicts))
        held = list(verdicts.no.values())
        free = self.n - len(held) - len(verdicts.failed)
        return Attempt(False, holder_ttl=seconds_until_free(held, free, self.quorum))

    def released(self, results: Sequence[Any]) -> bool:
        """A release round: True on a quorum, False when a quorum said "not ours"."""
        return self._yes_no(tally(results, flag), "releasing (the keys expire with their TTL)")

    def extended(self, results: Sequence[Any], seconds: float, elapsed: float) -> bool:
        """An extend round: True when a quorum now has a TTL still valid after ``elapsed``."""
        verdicts = tally(results, flag)
        if verdicts.reached(self.quorum):
            ttl = (quorum_ttl(verdicts.yes.values(), self.quorum) or 0) / 1000
            drift = drift_for(ttl, self.drift_factor, self.drift_extra_ms)
            return validity_left(ttl, elapsed, drift) > 0
        if verdicts.undecided(self.n, self.quorum):
            raise self.error("extending", verdicts)
        return False

    def renewed(self, results: list[Any], elapsed: float) -> Outcome:
        """The watchdog's verdict on a renewal round."""
        verdicts = tally(results, flag)
        if verdicts.reached(self.quorum) and validity_left(self.ttl, elapsed, self.drift) > 0:
            return Outcome.RENEWED
        if verdicts.refused(self.n, self.quorum):
            return Outcome.LOST
        return Outcome.UNREACHABLE

    def locked(self, results: Sequence[Any]) -> bool:
        """EXISTS on every master: True if so many hold it that nobody could take a quorum."""
        verdicts = tally(results, flag)
        if len(verdicts.yes) >= self.n - self.quorum + 1:
            return True
        if len(verdicts.no) >= self.quorum:
            return False
        raise self.error("reading the lock", verdicts)

    def stored_is(self, results: Sequence[Any], value: bytes) -> bool:
        """GET on every master: True if a quorum stores ``value`` (or the attempt's variant)."""
        values = (owner_of(value), value)

        def ours(reply: Any) -> tuple[bool | None, Any]:
            if reply is None or isinstance(reply, bytes | str):
                return same_value(reply, values), reply
            return None, reason(reply)

        return self._yes_no(tally(results, ours), "reading the lock")

    def holder(self, gets: Sequence[Any], ttls: Sequence[Any]) -> tuple[bytes | None, int | None]:
        """From GET and PTTL on every master: the value most masters hold (the holder's,
        normally) and the ms until expiry alone would free a quorum; (None, None) if free."""
        found = Counter(
            (v.encode() if isinstance(v, str) else v) for v in gets if isinstance(v, bytes | str)
        )
        if not found:
            return None, None
        held = [t for t in ttls if isinstance(t, int) and not isinstance(t, bool)]
        free = sum(1 for t in held if t == -2)
        seconds = seconds_until_free([t for t in held if t != -2], free, self.quorum)
        return found.most_common(1)[0][0], None if seconds is None else int(seconds * 1000)
