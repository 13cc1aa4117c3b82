"""Cleanup of what tasklock leaves on ZooKeeper: lock directories and expired enqueue markers.

A lock name's contenders live in a persistent directory (``<chroot>/tasklock/locks/<name>``),
and ``dedupe_enqueue`` markers are persistent nodes (``<chroot>/tasklock/markers/<key>``) with
an expiry in their data (ZooKeeper has no TTL on a plain node). Left alone, a long-running
system would keep one directory for every name it ever locked and every marker nobody claimed
again. Two ways they go:

* **In process, off the hot path.** Each release (and each waiter that gives up) notes its
  directory with its :class:`~tasklock.zookeeper.client.Client` (a dict write); a thread of the
  client removes the directory once it has been idle :attr:`Client.prune_after
  <tasklock.zookeeper.client.Client.prune_after>` seconds (30 by default), if it is empty. No
  round trip is added to an acquire or a release.
* **A sweep** (:func:`sweep`, run by ``tasklock doctor --url zookeeper://...``): every empty lock
  directory and every expired marker, for what crashed processes left.

Both are safe against a contender creating at the same moment. ZooKeeper deletes a node only
if it has no children, atomically: a create either lands first (the delete fails with
NotEmpty, and the directory stays) or after (the create fails with NoNode, and the contender
makes the directory again and retries, a bounded number of times:
``tasklock.zookeeper.lock.Lock._create_in_new_directory``). No version is needed for that
(and ZooKeeper's ``delete(version=)`` compares the data version, never the children's
``cversion``). A directory made again counts its sequence numbers from 0 anew, which the
no-read uncontended acquire allows for (``tasklock.zookeeper.lock._alone_since``). A marker is
deleted by the version that was read as expired, so one claimed or renewed meanwhile stays.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazoo.exceptions import NoNodeError

from tasklock.zookeeper.client import Client
from tasklock.zookeeper.markers import Markers

__all__ = ["Swept", "sweep"]


@dataclass(frozen=True)
class Swept:
    """What a :func:`sweep` removed, and the directories it left (in use)."""

    directories: int
    markers: int
    kept: int


def sweep(client: Client) -> Swept:
    """Remove every empty lock directory and every expired enqueue marker under the client's
    chroot (safe while locks are in use: see the module)."""
    root = client.path("tasklock", "locks")
    try:
        names = client.call("listing lock directories", "get_children", root)
    except NoNodeError:
        names = []
    removed = sum(1 for name in names if client.prune_directory(f"{root}/{name}"))
    return Swept(removed, Markers(client).prune(), len(names) - removed)
