"""The queue of a ZooKeeper lock or semaphore name: who holds, and what each waiter watches.

The contenders of a name are the ephemeral sequential nodes of its directory, in sequence order
(see :mod:`tasklock.zookeeper.lock`). A ``lock-`` node holds when it is the first; a
``sem<limit>-`` node when no ``lock-`` node and fewer than ``limit`` nodes are before it. The
nodes before a node only ever leave (a new node is always last), so a waiter's lot changes only
when a node before it is deleted, and a node that holds keeps holding until it goes.

**No herd.** One release must wake one waiter, not all of them. What a waiter watches
(:func:`position`), as kazoo's ``Semaphore`` recipe and Curator's ``InterProcessSemaphoreV2`` do
it (there, only the holder of an internal mutex watches the lease pool; the others queue on the
mutex, each watching its predecessor), but in the one directory, without the second lock:

* a lock waiter watches the node just before it (an ``exists`` watch): it cannot hold while any
  node is before it, so the one before it leaving is the only news that matters;
* a permit waiter whose predecessor is a permit *waiter* of the same limit watches that
  predecessor, for its deletion **or its promotion**: while the predecessor waits, so must it
  (every node before the predecessor is before it too, and the predecessor itself);
* the first permit waiter in line (its predecessor holds, or is of another kind or limit)
  watches the directory's children and wakes only when a node before it is gone (a new node
  behind it re-arms the watch without an attempt).

A permit waiter that finds it holds, on a listing that shows nodes after it, *touches* its node
(``set_data`` by version: version 0 -> 1) so that the waiter behind it, which watched it as a
waiter, wakes and becomes the first in line. One release so wakes the first waiter, and, if it
gets in, the one behind it: two waiters whatever the queue's length.

**No waiter is stranded** (each case is a test in ``tests/integration/zookeeper/test_queue.py``):

* A holder that is not the first waiter's predecessor leaves: the first waiter watches the
  directory, which any deletion fires.
* A watch armed late: arming reads the state it watches; a predecessor already gone or already
  touched (version 0 no more), or a node before a first waiter already missing, wakes at once.
* The promoted predecessor's listing did not show the waiter (the waiter's create came later in
  ZooKeeper's order): then the waiter's own listing, later still, shows the predecessor holding,
  so it never watched it as a waiter.
* A waiter gives up (``blocking_timeout``, cancellation) or is killed: its node is deleted (by
  it, or by ZooKeeper when its session expires), which wakes the one behind it; the first waiter
  leaving wakes the next, who then watches the directory.
* A session expires or a connection drops: kazoo fires every watch of the client with a state
  event, and the waiter tries again at once (its node gone, it queues anew at the end).
* Should any of this fail anyway, a waiter re-checks on its own every session timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import EventType

from tasklock.zookeeper.client import Client

__all__ = [
    "LOCK",
    "PERMIT",
    "Watch",
    "about_session",
    "holders_among",
    "position",
    "sequence_of",
    "shows_later",
]

LOCK, PERMIT = "lock", "sem"


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
class Watch:
    """What a waiter waits for: a node (``exists`` watch) or the directory (``get_children``)."""

    #: The watched node's path, or the directory's.
    path: str
    #: For a directory watch: the nodes before the waiter (one of them gone: wake).
    ahead: frozenset[str] = frozenset()
    #: For a node watch: wake when the node changes too (a permit predecessor promoted).
    on_change: bool = False

    @property
    def directory(self) -> bool:
        return bool(self.ahead)

    def arm(
        self, client: Client, on_event: Callable[[Any], None], what: str = "watching the queue"
    ) -> bool:
        """Set the watch (``on_event`` runs once, on kazoo's thread); True when what it waits
        for happened already (then the caller tries again at once)."""
        if self.directory:
            try:
                children = client.call(what, "get_children", self.path, watch=on_event)
            except NoNodeError:
                return True
            return not self.ahead <= set(children)
        stat = client.call(what, "exists", self.path, watch=on_event)
        return stat is None or (self.on_change and stat.version != 0)

    def wakes(self, event: Any) -> bool:
        """Whether a fired watch is news for the waiter (else it re-arms, with no attempt): a
        deletion, the session's state (connection lost, session expired), a promotion it waits
        for. A new node behind a first waiter re-arms (:meth:`arm` then re-checks the nodes
        before it)."""
        kind = getattr(event, "type", None)
        if kind == EventType.CHILD:
            return False
        if kind == EventType.CHANGED:
            return bool(self.on_change)
        return True


def about_session(event: Any) -> bool:
    """Whether a fired watch was kazoo's state event (connection lost, session expired): the
    waiter then waits for the session to be back (:meth:`Client.wait_connected`) first."""
    return bool(getattr(event, "type", None) == EventType.NONE)


def position(
    prefix: str, limit: int, own: str, children: Sequence[str], directory: str
) -> tuple[bool, Watch | None]:
    """Whether the node ``own`` (of kind ``prefix``: ``lock`` or ``sem<limit>``) holds among
    ``children``, and if not what it watches (None: its own node is gone). See the module."""
    ordered = sorted(children, key=sequence_of)
    if own not in ordered:
        return False, None
    index = ordered.index(own)
    ahead = ordered[:index]
    if prefix == LOCK:
        return not ahead, Watch(f"{directory}/{ahead[-1]}") if ahead else None
    if not any(child.startswith(LOCK + "-") for child in ahead) and len(ahead) < limit:
        return True, None
    before = ahead[-1]
    if before.startswith(LOCK + "-"):
        return False, Watch(f"{directory}/{before}")  # blocked while it is there, whatever else
    if before.startswith(prefix + "-") and before not in holders_among(ordered[:index]):
        return False, Watch(f"{directory}/{before}", on_change=True)
    return False, Watch(directory, ahead=frozenset(ahead))


def shows_later(own: str, children: Sequence[str]) -> bool:
    """Whether a listing shows a node created after ``own`` (someone may watch ``own``)."""
    mine = sequence_of(own)
    return any(sequence_of(child) > mine for child in children)
