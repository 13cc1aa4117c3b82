"""The ZooKeeper lock and semaphore: an ephemeral sequential node per contender, on kazoo's
basic calls (not its ``Lock`` recipe: kazoo #732 orphan nodes, #282/#482 hangs after
reconnects).

Layout: every contender for ``name`` creates an ephemeral sequential node in the directory
``<chroot>/tasklock/locks/<name, percent-encoded>``, named ``lock-<marker>-<seq>`` or
``sem<limit>-<marker>-<seq>`` (``marker``: unique per attempt, so a create whose answer was lost
can be found again and deleted), holding the holder's owner token. In sequence order:

* a ``lock-`` node holds when it is the first; a ``sem<limit>-`` node holds when fewer than
  ``limit`` nodes come before it and none of them is a ``lock-`` node. So a Lock and a Semaphore
  of one name exclude each other, and the queue is first come, first served.
* A waiter keeps its node and watches only the node just before it (no herd: a release wakes
  one waiter); a semaphore waiter watches the directory, as any of ``limit`` holders leaving
  may let it in.
* A non-blocking attempt that does not hold deletes its node at once.
* Release deletes the hold's own node with its version (its path is unique: no other holder's
  node can be deleted by it).
* The fence is the node's creation zxid (``czxid``): ZooKeeper's own total order of writes,
  strictly increasing across holders and across restarts of the ensemble, with no clock.

What ``ttl``, the watchdog and ``extend`` mean on a session store: the node lives as long as the
session that created it, so a dead holder's lock frees when ZooKeeper expires its session
(``session_timeout`` after its last heartbeat), whatever the ``ttl``. ``ttl`` is how long this
process trusts a hold without a confirmation, at most the session timeout: the watchdog (on by
default here) confirms every ``ttl``/3 that the node is still there (a ``sync`` then an
``exists``: read through the leader, not a lagging follower), and ``lost`` turns true when a
confirmation finds it gone, or when ``ttl`` passed since the last one (a process paused past its
session learns it from its own clock, before it acts). ``extend``/``reacquire`` are such a
confirmation: they cannot make a node outlive its session.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from kazoo.exceptions import BadVersionError, NoNodeError

from tasklock.core.base import BaseLock, _Waiter
from tasklock.core.batches import HoldScript, judge_hold, sync_renewer
from tasklock.core.clock import clock
from tasklock.core.lease import Attempt, Number
from tasklock.core.owner import Holder, parse_value, token_id
from tasklock.core.permits import check_limit
from tasklock.core.watchdog import Renewal
from tasklock.zookeeper.client import Client, as_client

__all__ = ["Lock", "Node", "Semaphore", "holders_among", "lock_directory", "sequence_of"]

LOCK, PERMIT = "lock", "sem"
#: How a contender's node is created: ephemeral, sequential, answered with its stat (czxid).
_CREATE = {"ephemeral": True, "sequence": True, "include_data": True}
#: Numbers the attempts of this process (with the token's random part: a node's marker).
_attempts = itertools.count()


def lock_directory(client: Client, name: str) -> str:
    """The directory of ``name``'s contenders (its name percent-encoded: a ``/`` is no level)."""
    encoded = quote(name, safe="")
    if set(encoded) <= {"."}:
        encoded = encoded.replace(".", "%2E")
    return client.path("tasklock", "locks", encoded)


def sequence_of(child: str) -> int:
    """The sequence number ZooKeeper appended to a node's name (10 digits)."""
    return int(child[-10:])


def holders_among(ordered: Sequence[str]) -> list[str]:
    """The nodes that hold, of a directory's children in sequence order: a ``lock-`` node when
    it is the first; a ``sem<limit>-`` node when no ``lock-`` node is before it and fewer than
    its own ``limit`` nodes are (each permit's limit is in its name, so a reader needs no
    other state)."""
    held: list[str] = []
    for index, child in enumerate(ordered):
        if child.startswith(LOCK + "-"):
            if index == 0:
                held.append(child)
            break
        if index < _limit_of(child):
            held.append(child)
    return held


def _limit_of(child: str) -> int:
    digits = child[len(PERMIT) : child.find("-")]
    return int(digits) if digits.isdigit() else 1


@dataclass(frozen=True, slots=True)
class Node:
    """One contender's node: its path, name, creation zxid (the fence) and session."""

    path: str
    czxid: int
    session: int
    #: What it holds: the owner token it was created with.
    data: bytes
    #: The directory held this node alone right after its create (see ``_release_value``).
    alone: bool = False

    @property
    def child(self) -> str:
        return self.path.rpartition("/")[2]


class Lock(BaseLock):
    """A lock on ZooKeeper with the API of :class:`tasklock.Lock`.

    ``url_or_client``: ``"zookeeper://h1:2181,h2:2181/chroot"`` or a
    :class:`tasklock.zookeeper.client.Client`. The other parameters mean what they mean for
    :class:`tasklock.Lock`, except (see the module):

    * ``timeout`` (the ttl) is capped at the URL's session timeout: a node lives as long as its
      session, and the ttl is how long this process trusts the hold without a confirmation.
    * ``watchdog`` defaults to on: it is the confirmation (one ``sync`` and ``exists``).
    * No ``fence_key``: the fence is the node's creation zxid; no ``fair``: the queue is fair.
    """

    _kind = LOCK
    #: How many may hold at once (a Lock: one).
    limit = 1

    @property
    def _prefix(self) -> str:
        """The first part of a contender's node name: ``lock``, or ``sem<limit>``."""
        return LOCK if self._kind == LOCK else f"{PERMIT}{self.limit}"

    def __init__(
        self,
        url_or_client: str | Client,
        name: str,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        watchdog: bool | None = None,
        on_lost: Callable[[BaseLock], Any] | None = None,
        owner_info: Mapping[str, Any] | None = None,
    ) -> None:
        self.client = as_client(url_or_client)
        super().__init__(
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
            watchdog=True if watchdog is None else watchdog,
            on_lost=on_lost,
            owner_info=owner_info,
        )
        self.ttl = min(self.ttl, self.client.session_timeout)
        self._dir = lock_directory(self.client, name)
        #: The node of each hold (by its hold value).
        self._nodes: dict[bytes, Node] = {}
        #: A waiting acquire's node (by token id) and what it watches.
        self._queued: dict[str, Node] = {}
        self._watch: dict[str, str] = {}
        # A waiter's node keeps its place by itself: it re-checks on its own only this rarely.
        self._renew_every = max(1.0, self.client.session_timeout)
        self._acquiring = f"acquiring {self._kind_word} {name!r}"

    @property
    def _kind_word(self) -> str:
        return "lock" if self._kind == LOCK else "semaphore"

    # -- acquire -------------------------------------------------------------------------------
    def _create(self, token: str) -> tuple[Node, list[str]]:
        """A new node for ``token``, and the directory's children as of its create.

        Usually the ``get_children`` goes right behind the create (one round trip, see
        :meth:`Client.send`). When this client's last release in the directory left it empty,
        it is not sent at all: the node's sequence number then says whether anyone came since
        (:meth:`Client.expect_alone`), and only a surprise costs the read."""
        # Unique per attempt (the token's random part and a counter), so that a node whose
        # create was applied without its answer can be found by name (kazoo #732).
        marker = f"{token_id(token)[:12]}{next(_attempts):x}"
        prefix = f"{self._dir}/{self._prefix}-{marker}-"
        client, what = self.client, self._acquiring
        expected = client.take_alone(self._dir)
        try:
            created = client.send(what, "create", prefix, token.encode(), **_CREATE)
            listed = None if expected is not None else client.send(what, "get_children", self._dir)
            try:
                path, stat = client.answer(what, created)
            except NoNodeError:  # the name's first create: make its directory, then again
                client.call(what, "ensure_path", self._dir)
                path, stat = client.call(what, "create", prefix, token.encode(), **_CREATE)
        except BaseException:
            client.forget_later(self._dir, marker)  # (kazoo #732: applied, answer lost?)
            raise
        if listed is None and sequence_of(path) == expected:
            # Nobody came since this client's last release: alone, with no read.
            return Node(path, stat.czxid, stat.ephemeralOwner, token.encode(), True), [
                path.rpartition("/")[2]
            ]
        node = Node(path, stat.czxid, stat.ephemeralOwner, token.encode())
        try:
            try:
                if listed is None:
                    raise NoNodeError
                children = client.answer(what, listed)
            except NoNodeError:  # (not sent, or sent before the create made the directory)
                children = client.call(what, "get_children", self._dir)
        except BaseException:
            self._delete_quietly(node)
            raise
        if children == [node.child]:
            node = Node(node.path, node.czxid, node.session, node.data, True)
        return node, children

    def _position(self, node: Node, children: Sequence[str]) -> tuple[bool, str | None]:
        """Whether ``node`` holds among ``children``, and which node it then waits for (None:
        its own is gone)."""
        ordered = sorted(children, key=sequence_of)
        if node.child not in ordered:
            return False, None
        ahead = ordered[: ordered.index(node.child)]
        if self._kind == LOCK:
            return not ahead, ahead[-1] if ahead else ""
        blocked = any(child.startswith(LOCK + "-") for child in ahead) or len(ahead) >= self.limit
        return not blocked, ""  # a permit waiter watches the directory (any holder may leave)

    def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        tid = token_id(token)
        node = self._queued.pop(tid, None)
        if node is None:
            node, children = self._create(token)
        else:
            try:
                children = self.client.call(self._acquiring, "get_children", self._dir)
            except BaseException:
                self._delete_quietly(node)
                raise
        held, ahead = self._position(node, children)
        if held:
            value = node.data + b"#%d" % node.czxid
            self._nodes[value] = node
            self._watch.pop(tid, None)
            return Attempt(True, value, node.czxid)
        if ahead is None:  # our node went with an expired session: a new one at once
            return Attempt(False, holder_ttl=0.0)
        if not waiting:
            self._delete_quietly(node)
            return Attempt(False)
        self._queued[tid] = node
        self._watch[tid] = f"{self._dir}/{ahead}" if ahead else self._dir
        return Attempt(False)

    def _early_waiter(self, token: str) -> _Waiter | None:
        return _WatchWaiter(self, token)  # (a watch costs nothing until the first failure)

    def _waiter(self, token: str) -> _Waiter:
        return _WatchWaiter(self, token)

    def _leave_queue(self, token: str) -> None:
        node = self._queued.pop(token_id(token), None)
        self._watch.pop(token_id(token), None)
        if node is not None:
            self._delete_quietly(node)

    def _delete_quietly(self, node: Node) -> None:
        try:
            self._delete(node, f"leaving the queue of {self._kind_word} {self.name!r}")
        except Exception:
            self.client.forget_later(self._dir, node.child.split("-")[1])

    def _delete(self, node: Node, what: str) -> bool:
        try:
            self.client.call(what, "delete", node.path, version=0)
        except (NoNodeError, BadVersionError):
            return False
        return True

    # -- release / extend / renewal ------------------------------------------------------------
    def _release_value(self, value: bytes) -> bool:
        node = self._nodes.pop(value, None)
        if node is None:
            return False
        if not self._delete(node, f"releasing {self._kind_word} {self.name!r}"):
            return False
        if node.alone:
            # The directory held this node alone when it was read right after its create. The
            # sequence ZooKeeper appends counts the creates in the directory (deletes do not
            # move it), so if the next create there gets exactly the number after this one,
            # nobody created a node meanwhile, every node there then was this one, and it is
            # deleted: the new node is alone, with no read. Any other number (someone came; a
            # server that counts otherwise) costs the read, never a wrong answer.
            self.client.expect_alone(self._dir, sequence_of(node.child) + 1)
        return True

    def _confirm(self, value: bytes, what: str) -> bool:
        """Whether the hold's node is still there, on its session (read through the leader)."""
        node = self._nodes.get(value)
        if node is None:
            return False
        synced = self.client.send(what, "sync", node.path)
        exists = self.client.send(what, "exists", node.path)
        self.client.answer(what, synced)
        stat = self.client.answer(what, exists)
        return stat is not None and stat.czxid == node.czxid

    def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        return self._confirm(value, f"extending {self._kind_word} {self.name!r}")

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Confirm the hold (see the module): the node lives as long as its session, so the
        lease this process counts is capped at ``ttl`` from now."""
        sent = clock.monotonic()
        done = super().extend(additional_time, replace_ttl)
        hold = self._hold()
        if hold is not None:
            hold.expires_at = min(hold.expires_at, sent + self.ttl)
        return done

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        call = (sync_renewer(self.client, _confirm_hold), _CONFIRM, (self.name,), (self, value))
        return Renewal(self.name, self.ttl, [call], judge_hold, on_lost)

    # -- reads ---------------------------------------------------------------------------------
    def _children(self, what: str) -> list[str]:
        try:
            children = self.client.call(what, "get_children", self._dir)
        except NoNodeError:
            return []
        return sorted(children, key=sequence_of)

    def _holding(self) -> list[str]:
        """The nodes that hold now, in order."""
        return holders_among(self._children(f"reading {self._kind_word} {self.name!r}"))

    def locked(self) -> bool:
        """True if the name is held by anyone (a lock, or any permit of a semaphore of it)."""
        return bool(self._holding())

    def _stored_value_is(self, value: bytes) -> bool:
        return self._confirm(value, f"reading {self._kind_word} {self.name!r}")

    def _holder_values(self) -> list[bytes]:
        what = f"reading {self._kind_word} {self.name!r}"
        values: list[bytes] = []
        for child in self._holding():
            try:
                data, stat = self.client.call(what, "get", f"{self._dir}/{child}")
            except NoNodeError:
                continue
            values.append(bytes(data) + b"#%d" % stat.czxid)
        return values

    def _peek(self) -> tuple[bytes | None, int | None]:
        values = self._holder_values()
        return (values[0], -1) if values else (None, None)


class Semaphore(Lock):
    """At most ``limit`` holders of ``name`` at once, on ZooKeeper: the surface of
    :class:`tasklock.zookeeper.Lock` with ``limit`` after the name, ``locked()`` True when no
    permit is free, and :meth:`holders`. A Lock of the same name counts as holding every
    permit; the fence is strictly increasing per name across permits and locks."""

    _kind = PERMIT

    def __init__(
        self,
        url_or_client: str | Client,
        name: str,
        limit: int,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        watchdog: bool | None = None,
        on_lost: Callable[[BaseLock], Any] | None = None,
        owner_info: Mapping[str, Any] | None = None,
    ) -> None:
        self.limit = check_limit(limit)
        super().__init__(
            url_or_client,
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

    def locked(self) -> bool:
        """True when no permit can be taken now."""
        held = self._holding()
        return bool(held) and (held[0].startswith(LOCK + "-") or len(held) >= self.limit)

    def holders(self) -> list[tuple[Holder, float | None]]:
        """Who holds the permits now (or the lock of the same name), in the order they came;
        no time left (a node lives as long as its holder's session)."""
        return [(parse_value(value), None) for value in self._holder_values()]

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} limit={self.limit} ttl={self.ttl} "
            f"fence={self.fence}>"
        )


class _WatchWaiter:
    """Waits for what the last failed attempt named: the node just before this waiter's (a
    lock), or the directory's children (a permit), with a one-shot ZooKeeper watch."""

    def __init__(self, lock: Lock, token: str) -> None:
        self._lock = lock
        self._tid = token_id(token)

    def arm(self) -> None:
        pass

    def wait(self, timeout: float) -> bool:
        target = self._lock._watch.get(self._tid)
        if target is None or timeout <= 0:
            return False
        woken = threading.Event()
        client = self._lock.client
        try:
            if target == self._lock._dir:
                client.call("watching a semaphore", "get_children", target, watch=_set(woken))
            elif client.call("watching a lock", "exists", target, watch=_set(woken)) is None:
                return True  # gone already
        except Exception:
            # No watch (ZooKeeper going away): back off, then the next attempt says what is wrong.
            threading.Event().wait(min(timeout, float(self._lock.sleep)))
            return False
        return woken.wait(timeout)

    def close(self) -> None:
        self._lock._watch.pop(self._tid, None)


def _set(event: threading.Event) -> Callable[[Any], None]:
    return lambda _: event.set()


# -- watchdog ----------------------------------------------------------------------------------
# The thread watchdog renews ZooKeeper holds with one confirmation each, through the per-hold
# batches of tasklock.core.batches, so they get the same scheduling, late warnings and lost
# verdicts as the others.

_CONFIRM = HoldScript("ZooKeeper hold confirmation", "-- tasklock.zookeeper confirm")


def _confirm_hold(lock: Lock, value: bytes) -> int:
    """Confirm the hold's node: 1 while it is there, 0 when gone or released meanwhile."""
    if value not in lock._nodes:
        return 0
    return 1 if lock._confirm(value, f"renewing {lock._kind_word} {lock.name!r}") else 0
