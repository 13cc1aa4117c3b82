"""Cleanup on a real ZooKeeper: a lock directory goes once idle, a contender racing its removal
makes it again, the no-read uncontended acquire stays right across a directory made anew, and a
sweep removes empty directories and expired markers but nothing in use."""

from __future__ import annotations

import uuid

from tasklock.zookeeper import Lock, Semaphore
from tasklock.zookeeper.cleanup import sweep
from tasklock.zookeeper.client import Client
from tasklock.zookeeper.lock import lock_directory
from tasklock.zookeeper.markers import Markers
from tests.support.polling import eventually


def test_an_idle_lock_directory_is_removed_and_made_again_on_the_next_acquire(url: str) -> None:
    client = Client(url)
    client.prune_after = 0.0
    try:
        lock = Lock(client, f"idle:{uuid.uuid4().hex}")
        directory = lock_directory(client, lock.name)
        assert lock.acquire()
        first = lock.fence
        lock.release()
        eventually(lambda: client.kazoo.exists(directory) is None, what="the directory pruned")
        assert lock.acquire()  # (its create finds no directory: made again)
        assert (lock.fence or 0) > (first or 0)
        lock.release()
        eventually(lambda: client.kazoo.exists(directory) is None, what="pruned again")
    finally:
        client.close()


def test_the_no_read_acquire_is_not_fooled_by_a_directory_made_anew(url: str) -> None:
    """A's last release left the directory empty, so A's next create expects sequence 1 and
    sends no read. The directory is removed (as another process's prune would) and B makes it
    anew and holds there with sequence 0: A's create gets sequence 1 all the same, and must not
    take that for being alone."""
    first, second = Client(url), Client(url)
    first.prune_after = second.prune_after = None
    try:
        name = f"anew:{uuid.uuid4().hex}"
        a, b = Lock(first, name), Lock(second, name)
        assert a.acquire()
        a.release()
        first.kazoo.delete(lock_directory(first, name))
        assert b.acquire()
        assert not a.acquire(blocking=False)
        b.release()
        assert a.acquire(blocking=False)
        a.release()
    finally:
        first.close()
        second.close()


def test_a_sweep_removes_empty_directories_and_expired_markers_only(url: str) -> None:
    client = Client(url)
    client.prune_after = None
    try:
        tag = uuid.uuid4().hex
        idle, busy = Lock(client, f"swept:{tag}"), Semaphore(client, f"kept:{tag}", 2)
        assert idle.acquire()
        idle.release()
        assert busy.acquire()
        markers = Markers(client)
        assert markers.claim(f"expired:{tag}", "t-1", 0, "a test") is None
        assert markers.claim(f"live:{tag}", "t-2", 60_000, "a test") is None
        swept = sweep(client)
        assert swept.directories >= 1
        assert swept.markers >= 1
        assert client.kazoo.exists(lock_directory(client, idle.name)) is None
        assert client.kazoo.exists(lock_directory(client, busy.name)) is not None
        assert busy.owned()
        assert markers.claim(f"live:{tag}", "t-3", 60_000, "a test") == "t-2"  # kept
        assert markers.claim(f"expired:{tag}", "t-4", 60_000, "a test") is None  # gone
        busy.release()
    finally:
        client.close()


def test_the_negotiated_session_timeout_is_read(url: str) -> None:
    """The check of session_timeout against the servers' bounds reads the timeout the server
    granted through kazoo's private connection step (``client._catch_negotiated``): if a kazoo
    upgrade changes that step, this fails loudly instead of the check going quiet."""
    client = Client(url)
    try:
        assert client.kazoo.connected
        assert client.negotiated_timeout == 1.0
    finally:
        client.close()
