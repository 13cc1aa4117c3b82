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
* A waiter keeps its node and watches one thing, so that a release wakes one waiter (a
  semaphore's: at most two), not the herd: a lock waiter the node just before it; a permit
  waiter the permit waiter just before it, or, first in line, the directory (the rules, and why
  no waiter is stranded: :mod:`tasklock.zookeeper.queue`).
* A non-blocking attempt that does not hold deletes its node at once.
* Release deletes the hold's own node with its version (its path is unique: no other holder's
  node can be deleted by it).
* Empty directories do not pile up: a directory this client used is removed once it has been
  idle a while, off the hot path (:mod:`tasklock.zookeeper.cleanup`); a create that finds it
  gone makes it again.
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
from collections.abc import Callable, Mapping
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
from tasklock.zookeeper.queue import (
    LOCK,
    PERMIT,
    Watch,
    about_session,
    holders_among,
    position,
    sequence_of,
    shows_later,
)

__all__ = [
    "LOCK",
    "Lock",
    "Node",
    "Semaphore",
    "holders_among",
    "lock_directory",
    "sequence_of",
]

#: How a contender's node is created: ephemeral, sequential, answered with its stat (czxid).
_CREATE = {"ephemeral": True, "sequence": True, "include_data": True}
#: Numbers the attempts of this process (with the token's random part: a node's marker).
_attempts = itertools.count()
#: Creates in a directory that a prune keeps removing before giving up (see _create).
_DIRECTORY_TRIES = 5


def _alone_since(expected: tuple[int, int], path: str, czxid: int) -> bool:
    """Whether a node created at ``path`` with ``czxid`` is alone in its directory, with no
    read, given what this client's last release there noted: ``(sequence, czxid)``, the
    sequence the next create gets if nobody else creates there, and the released node's czxid.

    The sequence ZooKeeper appends counts the creates in the directory (deletes do not move
    it). So within one life of the directory, getting exactly the number after the released
    node's means nobody created a node since, and every node there then (the released one
    alone) is gone. But a directory pruned and made again counts from 0 anew, and could reach
    the same number with someone holding in it. That takes at least ``sequence + 3`` writes
    between the two creates (the released node's delete, the directory's delete and create,
    ``sequence`` creates; each a transaction, hence a zxid, of its own), so a zxid gap below
    that rules it out; a busier ensemble's larger gap costs the read, never a wrong answer."""
    sequence, released = expected
    return sequence_of(path) == sequence and czxid - released < sequence + 4


def lock_directory(client: Client, name: str) -> str:
    """The directory of ``name``'s contenders (its name percent-encoded: a ``/`` is no level)."""
    encoded = quote(name, safe="")
    if set(encoded) <= {"."}:
        encoded = encoded.replace(".", "%2E")
    return client.path("tasklock", "locks", encoded)


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
    #: The node's data version: 0, or 1 once touched (a permit waiter promoted, see ``queue``).
    version: int = 0

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
        self._watch: dict[str, Watch] = {}
        # A waiter's node keeps its place by itself: it re-checks on its own only this rarely.
        self._renew_every = max(1.0, self.client.session_timeout)
        self._acquiring = f"acquiring {self._kind_word} {name!r}"
        self._releasing = f"releasing {self._kind_word} {name!r}"
        self._renewer: Any = None
        self._keys = (name,)

    @property
    def _kind_word(self) -> str:
        return "lock" if self._kind == LOCK else "semaphore"

    # -- acquire -------------------------------------------------------------------------------
    def _create(self, tid: str, data: bytes) -> tuple[Node, list[str]]:
        """A new node for ``token``, and the directory's children as of its create.

        Usually the ``get_children`` goes right behind the create (one round trip, see
        :meth:`Client.send`). When this client's last release in the directory left it empty,
        it is not sent at all: the node's sequence number and creation zxid then say whether
        anyone came since (:meth:`Client.expect_alone`), and only a surprise costs the read."""
        # Unique per attempt (the token's random part and a counter), so that a node whose
        # create was applied without its answer can be found by name (kazoo #732).
        marker = f"{tid[:12]}{next(_attempts):x}"
        prefix = f"{self._dir}/{self._prefix}-{marker}-"
        client, what = self.client, self._acquiring
        expected = client.take_alone(self._dir)
        try:
            created = client.send(what, "create", prefix, data, **_CREATE)
            listed = None if expected is not None else client.send(what, "get_children", self._dir)
            try:
                path, stat = client.answer(what, created)
            except NoNodeError:  # no directory (the name's first create, or it was pruned)
                path, stat = self._create_in_new_directory(prefix, data)
        except BaseException:
            client.forget_later(self._dir, marker)  # (kazoo #732: applied, answer lost?)
            raise
        if listed is None and expected is not None and _alone_since(expected, path, stat.czxid):
            # Nobody came since this client's last release: alone, with no read. (One Node
            # made per cycle, not two: this is the uncontended hot path.)
            node = Node(path, stat.czxid, stat.ephemeralOwner, data, True)
            return node, [path.rpartition("/")[2]]
        node = Node(path, stat.czxid, stat.ephemeralOwner, data)
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

    def _create_in_new_directory(self, prefix: str, data: bytes) -> Any:
        """Make the directory, then create in it; again while a prune removes it in between
        (its delete and our create race: ZooKeeper deletes only an empty directory, so either
        our create comes first and the prune fails, or it comes after and gets NoNode here)."""
        what = self._acquiring
        for _ in range(_DIRECTORY_TRIES):
            self.client.call(what, "ensure_path", self._dir)
            try:
                return self.client.call(what, "create", prefix, data, **_CREATE)
            except NoNodeError:
                continue
        raise self.client.unreachable(
            what, RuntimeError(f"{self._dir} was removed {_DIRECTORY_TRIES} times in a row")
        )

    def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        tid = token_id(token)
        node = self._queued.pop(tid, None)
        if node is None:
            node, children = self._create(tid, token.encode())
        else:
            try:
                children = self.client.call(self._acquiring, "get_children", self._dir)
            except NoNodeError:  # our node went with its session, and the directory after it
                children = []
            except BaseException:
                self._delete_quietly(node)
                raise
        if node.alone:  # the only node: it holds, a lock's or a permit's (see position)
            held, watch = True, None
        else:
            held, watch = position(self._prefix, self.limit, node.child, children, self._dir)
        if held:
            if self._kind != LOCK and not node.alone and shows_later(node.child, children):
                node = self._touch(node)
                if node is None:  # gone meanwhile (its session expired): a new one at once
                    return Attempt(False, holder_ttl=0.0)
            value = node.data + b"#%d" % node.czxid
            self._nodes[value] = node
            self._watch.pop(tid, None)
            return Attempt(True, value, node.czxid)
        if watch is None:  # our node went with an expired session: a new one at once
            return Attempt(False, holder_ttl=0.0)
        if not waiting:
            self._delete_quietly(node)
            return Attempt(False)
        self._queued[tid] = node
        self._watch[tid] = watch
        return Attempt(False)

    def _touch(self, node: Node) -> Node | None:
        """Tell the waiter behind a permit that it holds now (see :mod:`queue`): its node's
        version goes 0 -> 1, which fires that waiter's watch. None when the node is gone. If
        the touch gets no answer, the permit is given back (its deletion wakes that waiter
        too) and the error raised: a hold nobody behind it knows of would strand the queue."""
        if node.version != 0:
            return node
        what = self._acquiring
        try:
            stat = self.client.call(what, "set", node.path, node.data, version=0)
        except (NoNodeError, BadVersionError):
            return None
        except BaseException:
            self._delete_quietly(node)
            raise
        return Node(node.path, node.czxid, node.session, node.data, node.alone, stat.version)

    def _early_waiter(self, token: str) -> _Waiter | None:
        return _WatchWaiter(self, token)  # (a watch costs nothing until the first failure)

    def _waiter(self, token: str) -> _Waiter:
        return _WatchWaiter(self, token)

    def _leave_queue(self, token: str) -> None:
        node = self._queued.pop(token_id(token), None)
        self._watch.pop(token_id(token), None)
        if node is not None:
            self._delete_quietly(node)
            self.client.prune_later(self._dir)

    def _delete_quietly(self, node: Node) -> None:
        try:
            self._delete(node, f"leaving the queue of {self._kind_word} {self.name!r}")
        except Exception:
            self.client.forget_later(self._dir, node.child.split("-")[1])

    def _delete(self, node: Node, what: str) -> bool:
        try:
            self.client.call(what, "delete", node.path, version=node.version)
        except (NoNodeError, BadVersionError):
            return False
        return True

    # -- release / extend / renewal ------------------------------------------------------------
    def _release_value(self, value: bytes) -> bool:
        node = self._nodes.pop(value, None)
        if node is None:
            return False
        if not self._delete(node, self._releasing):
            return False
        if node.alone:
            # The directory held this node alone when it was read right after its create: the
            # next create here is alone too if nobody came meanwhile (see _alone_since).
            self.client.expect_alone(self._dir, sequence_of(node.child) + 1, node.czxid)
        self.client.prune_later(self._dir)
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
        renewer = self._renewer
        if renewer is None:  # (looked up once per lock: its client is fixed)
            renewer = self._renewer = sync_renewer(self.client, _confirm_hold)
        call = (renewer, _CONFIRM, self._keys, (self, value))
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
    """Waits for what the last failed attempt named (see :mod:`tasklock.zookeeper.queue`), with
    one-shot ZooKeeper watches; an event that is no news for it re-arms without an attempt."""

    def __init__(self, lock: Lock, token: str) -> None:
        # (Made for every blocking acquire, before its first attempt, and most never wait:
        # the token's id is worked out only when needed.)
        self._lock = lock
        self._token = token

    def arm(self) -> None:
        pass

    def wait(self, timeout: float) -> bool:
        watch = self._lock._watch.get(token_id(self._token))
        if watch is None or timeout <= 0:
            return False
        deadline = clock.monotonic() + timeout
        while True:
            woken = threading.Event()
            events: list[Any] = []
            try:
                if watch.arm(self._lock.client, _note(events, woken.set)):
                    return True
            except Exception:
                # No watch (ZooKeeper going away): back off, then the next attempt says why.
                threading.Event().wait(min(timeout, float(self._lock.sleep)))
                return False
            if not woken.wait(max(0.0, deadline - clock.monotonic())):
                return False
            if about_session(events[0]):
                self._lock.client.wait_connected(max(0.0, deadline - clock.monotonic()))
                return True
            if watch.wakes(events[0]):
                return True

    def close(self) -> None:
        watches = self._lock._watch
        if watches:
            watches.pop(token_id(self._token), None)


def _note(events: list[Any], wake: Callable[[], Any]) -> Callable[[Any], None]:
    """A watch callback that keeps the event and wakes the waiter."""

    def fired(event: Any) -> None:
        events.append(event)
        wake()

    return fired


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
