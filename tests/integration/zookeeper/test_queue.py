"""The queue of a ZooKeeper semaphore on a real server: one release wakes at most two waiters
(not the herd), first come first served, and no waiter is stranded when a holder that is not
its predecessor leaves, when a waiter gives up, is killed or has its session expired.

Each waiter has a session of its own (a :class:`Counting` client counts the watches that fire
for it), and its fallback re-check is pushed out of the test's reach (``_renew_every``), so a
waiter that no watch wakes stays stranded and fails the test instead of being rescued."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.states import Callback

from tasklock.zookeeper import Lock, Semaphore
from tasklock.zookeeper.client import Client
from tests.integration.zookeeper.test_lock import child
from tests.support.polling import eventually

#: Out of the tests' reach: only a watch can wake a waiter.
NO_FALLBACK = 3600.0


class Counting(Client):
    """A client (a session of its own) that counts the watches fired for it, through the
    public :meth:`Client.send` every request goes through."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.fired = 0
        self._count = threading.Lock()

    def send(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        watch = kwargs.get("watch")
        if watch is not None:

            def counted(event: Any, watch: Any = watch) -> None:
                with self._count:
                    self.fired += 1
                watch(event)

            kwargs["watch"] = counted
        return super().send(what, method, *args, **kwargs)

    def settle(self) -> None:
        """Every watch event the server sent this session before now has run its callback: a
        request's answer comes after the events before it, and kazoo runs callbacks in order."""
        self.kazoo.exists("/")
        done = threading.Event()
        self.kazoo.handler.dispatch_callback(Callback("barrier", done.set, ()))
        assert done.wait(10)


class Queue:
    """Waiters started one after the other (each queued before the next starts), each in a
    thread that holds what it got until :meth:`release`."""

    def __init__(self, url: str, name: str, limit: int) -> None:
        self.url, self.name, self.limit = url, name, limit
        self.probe = Semaphore(url, name, limit)
        self.clients: list[Counting] = []
        self.got: list[int] = []
        self.results: dict[int, bool] = {}
        self.threads: list[threading.Thread] = []
        self.done: list[threading.Event] = []

    def count(self) -> int:
        return len(self.probe._children("counting the queue"))

    def add(self, blocking_timeout: float = 30.0, kind: str = "sem") -> int:
        index, client = len(self.clients), Counting(self.url)
        self.clients.append(client)
        lock: Lock = (
            Semaphore(client, self.name, self.limit) if kind == "sem" else Lock(client, self.name)
        )
        lock._renew_every = NO_FALLBACK
        done = threading.Event()
        self.done.append(done)
        before = self.count()

        def run() -> None:
            got = lock.acquire(blocking_timeout=blocking_timeout)
            self.results[index] = got
            if got:
                self.got.append(index)
                done.wait(60)
                lock.release()

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()
        eventually(lambda: self.count() > before, what=f"waiter {index} queued")
        return index

    def release(self, index: int) -> None:
        self.done[index].set()

    def close(self) -> None:
        for done in self.done:
            done.set()
        for thread in self.threads:
            thread.join(60)
        for client in self.clients:
            client.close()


def holders(url: str, name: str, limit: int) -> list[Semaphore]:
    held = [Semaphore(url, name, limit, thread_local=False) for _ in range(limit)]
    assert all(permit.acquire(blocking=False) for permit in held)
    return held


def test_one_release_wakes_at_most_two_waiters_not_the_herd(url: str) -> None:
    name = f"herd:{uuid.uuid4().hex}"
    held = holders(url, name, 2)
    queue = Queue(url, name, 2)
    try:
        for _ in range(6):
            queue.add()
        for client in queue.clients:
            client.settle()  # (the first waiter re-arms as the others arrive)
        before = [client.fired for client in queue.clients]
        held[0].release()
        eventually(lambda: queue.got == [0], what="the first waiter got the permit")
        for client in queue.clients:
            client.settle()
        woken = [client.fired - was for client, was in zip(queue.clients, before, strict=True)]
        # The first waiter (its watch on the directory), then the one behind it (its watch on
        # the first, touched as it got in); the four others never hear of it.
        assert sum(woken) <= 2, woken
        assert woken[2:] == [0, 0, 0, 0], woken
        held[1].release()
        eventually(lambda: queue.got == [0, 1], what="the second waiter got the next permit")
    finally:
        for permit in held:
            if permit.owned():
                permit.release()
        queue.close()
    assert queue.got == [0, 1, 2, 3, 4, 5]  # first come, first served


def test_a_holder_that_is_not_the_predecessor_leaving_lets_the_first_waiter_in(url: str) -> None:
    name = f"order:{uuid.uuid4().hex}"
    held = holders(url, name, 2)
    queue = Queue(url, name, 2)
    try:
        for _ in range(3):
            queue.add()
        held[0].release()  # (waiter 0's predecessor is held[1])
        eventually(lambda: queue.got == [0])
        held[1].release()
        eventually(lambda: queue.got == [0, 1])
        queue.release(0)
        eventually(lambda: queue.got == [0, 1, 2])
    finally:
        queue.close()


def test_waiters_that_give_up_strand_nobody(url: str) -> None:
    name = f"give-up:{uuid.uuid4().hex}"
    held = holders(url, name, 1)
    queue = Queue(url, name, 1)
    try:
        first = queue.add(blocking_timeout=1.5)  # the first in line gives up
        queue.add()
        middle = queue.add(blocking_timeout=1.5)  # and one in the middle
        queue.add()
        eventually(lambda: first in queue.results and middle in queue.results, timeout=20)
        assert not queue.results[first]
        assert not queue.results[middle]
        held[0].release()
        eventually(lambda: queue.got == [1])
        queue.release(1)
        eventually(lambda: queue.got == [1, 3])
    finally:
        queue.close()


_WAITER = """
from tasklock.zookeeper import Semaphore
Semaphore({url!r}, {name!r}, 1).acquire()
"""


def test_a_killed_waiter_strands_nobody(url: str) -> None:
    name = f"killed-waiter:{uuid.uuid4().hex}"
    held = holders(url, name, 1)
    queue = Queue(url, name, 1)
    process = None
    try:
        queue.add()
        before = queue.count()
        process = child(_WAITER.format(url=url, name=name))
        eventually(lambda: queue.count() > before, what="the child queued")
        queue.add()  # watches the child's node
        process.kill()
        process.wait(10)
        eventually(lambda: queue.count() == before + 1, what="the child's session expired")
        held[0].release()
        eventually(lambda: queue.got == [0])
        queue.release(0)
        eventually(lambda: queue.got == [0, 1])
    finally:
        if process is not None and process.poll() is None:
            process.kill()
        queue.close()


def test_a_waiter_whose_session_expires_strands_nobody_and_queues_again(url: str) -> None:
    name = f"expired:{uuid.uuid4().hex}"
    held = holders(url, name, 1)
    queue = Queue(url, name, 1)
    try:
        queue.add()
        expiring = queue.add()
        queue.add()
        client = queue.clients[expiring]
        # Closing a second connection on the same session ends the session on the server.
        twin = KazooClient(hosts=client.target.hosts[0], client_id=client.kazoo.client_id)
        twin.start(timeout=10)
        twin.stop()
        twin.close()
        held[0].release()
        eventually(lambda: queue.got == [0])
        queue.release(0)
        eventually(lambda: queue.got[:2] == [0, 2], what="the waiter behind it got in")
        queue.release(2)
        eventually(lambda: queue.got == [0, 2, 1], what="the expired one queued again, got in")
    finally:
        queue.close()


def test_a_lock_and_permits_queue_together_first_come_first_served(url: str) -> None:
    name = f"mixed:{uuid.uuid4().hex}"
    held = holders(url, name, 2)
    queue = Queue(url, name, 2)
    try:
        queue.add()
        queue.add(kind="lock")
        queue.add()
        queue.add()
        held[0].release()
        eventually(lambda: queue.got == [0])  # a permit (the lock waits for both holders)
        held[1].release()
        queue.release(0)
        eventually(lambda: queue.got == [0, 1])  # the lock, alone
        queue.release(1)
        eventually(lambda: sorted(queue.got) == [0, 1, 2, 3])  # both permits at once
    finally:
        queue.close()
