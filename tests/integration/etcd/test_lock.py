"""tasklock.etcd.Lock against a real single-node etcd (see conftest.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tasklock.core.clock import use_clock
from tasklock.errors import (
    BackendUnavailable,
    ConfigurationError,
    LockError,
    LockLostError,
    LockNotOwnedError,
)
from tasklock.etcd import Client, Lock
from tasklock.etcd.protocol import b64
from tests.integration.etcd.conftest import EtcdServer
from tests.support.clocks import ClockAhead
from tests.support.polling import eventually, holds_for
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[3]


def lock_name() -> str:
    return f"etcd-test:{uuid.uuid4().hex[:8]}"


def holder_lease(etcd: EtcdServer, name: str) -> int:
    reply = httpx.post(f"{etcd.url}/v3/kv/range", json={"key": b64(name.encode())}, timeout=5)
    return int(reply.json()["kvs"][0]["lease"])


class CountingClient(Client):
    """Counts the gateway requests by path, and the watches opened."""

    def __init__(self, endpoints: str) -> None:
        super().__init__(endpoints)
        self.requests: Counter[str] = Counter()
        self.watching = threading.Event()

    def raw(self, path: str, body: dict[str, Any], what: str) -> tuple[int, bytes, str]:
        self.requests[path] += 1
        return super().raw(path, body, what)

    def wait_for_delete(
        self, key: bytes, start_revision: int, timeout: float, *, range_end: bytes | None = None
    ) -> bool:
        self.requests["watch"] += 1
        self.watching.set()
        return super().wait_for_delete(key, start_revision, timeout, range_end=range_end)


def test_acquire_release_and_context_manager(etcd: EtcdServer) -> None:
    name = lock_name()
    lock = Lock(etcd.url, name, timeout=10)
    assert lock.acquire(blocking_timeout=5)
    assert lock.owned()
    assert lock.locked()
    assert isinstance(lock.fence, int)
    assert lock.fence > 0
    holder, ttl = lock.peek()
    assert holder is not None
    assert holder.fence == lock.fence
    assert holder.meta["pid"] > 0
    assert ttl is not None
    assert 0 < ttl <= 10
    lock.release()
    assert not lock.locked()
    assert lock.fence is None
    with Lock(f"etcd://127.0.0.1:{etcd.client_port}", name, owner_info={"task": "t-1"}) as held:
        holder, _ = held.peek()
        assert holder is not None
        assert holder.meta["task"] == "t-1"
    assert not held.locked()


def test_a_waiter_watches_and_is_woken_by_the_release(etcd: EtcdServer) -> None:
    name = lock_name()
    holder = Lock(etcd.url, name, timeout=60)  # far longer than the test may take
    assert holder.acquire()
    client = CountingClient(etcd.url)
    waiter = Lock(client, name, timeout=10, blocking_timeout=30, thread_local=False)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire()))
    thread.start()
    assert client.watching.wait(10), "the waiter never started watching"
    before = dict(client.requests)
    holder.release()
    thread.join(20)
    assert got == [True], "the waiter was not woken by the release"
    waiter.release()
    # Two attempts before the watch (the first, and the one after subscribing), one after it;
    # one watch: no polling while the holder held on.
    assert before["/v3/kv/txn"] == 2
    assert client.requests["watch"] == 1
    assert client.requests["/v3/kv/txn"] == 3 + 1  # + the release
    assert client.requests["/v3/kv/range"] == 0


def test_non_blocking_and_blocking_timeout(etcd: EtcdServer) -> None:
    name = lock_name()
    with Lock(etcd.url, name, timeout=30, blocking_timeout=5):
        other = Lock(etcd.url, name, timeout=30)
        assert other.acquire(blocking=False) is False
        assert other.acquire(blocking_timeout=0.2) is False
        with pytest.raises(LockError), Lock(etcd.url, name, blocking_timeout=0.1):
            pass
        assert Lock(etcd.url, name, blocking=False).acquire() is False
    # The failed attempts left no lease holding the key.
    assert Lock(etcd.url, name, blocking=False).acquire()


def test_fence_increases_across_holders_and_an_etcd_restart(etcd: EtcdServer) -> None:
    name = lock_name()
    fences: list[int] = []
    for _ in range(3):
        with Lock(etcd.url, name, timeout=10, blocking_timeout=5) as lock:
            assert lock.fence is not None
            fences.append(lock.fence)
        with Lock(etcd.url, lock_name(), timeout=10, blocking_timeout=5) as unrelated:
            assert unrelated.fence is not None
            fences.append(unrelated.fence)
    etcd.restart()
    with Lock(etcd.url, name, timeout=10, blocking_timeout=5) as lock:
        assert lock.fence is not None
        fences.append(lock.fence)
    assert fences == sorted(set(fences)), fences


def test_release_by_a_holder_that_is_no_longer_the_owner(etcd: EtcdServer) -> None:
    name = lock_name()
    first = Lock(etcd.url, name, timeout=30)
    assert first.acquire()
    etcd.revoke_lease(holder_lease(etcd, name))  # its lease is gone: the key with it
    second = Lock(etcd.url, name, timeout=30)
    assert second.acquire(blocking=False)
    assert not first.owned()
    with pytest.raises(LockNotOwnedError):
        first.release()
    assert second.owned()  # the stale release did not delete the new holder's key
    with pytest.raises(LockError):
        Lock(etcd.url, name).release()  # never acquired
    # raise_on_release_error=False: a context manager that lost the lock exits quietly.
    second.release()
    quiet = Lock(etcd.url, name, timeout=30, raise_on_release_error=False)
    with quiet:
        etcd.revoke_lease(holder_lease(etcd, name))
    assert not quiet.locked()


def test_extend_keeps_the_fence(etcd: EtcdServer) -> None:
    name = lock_name()
    with Lock(etcd.url, name, timeout=5) as lock:
        fence = lock.fence
        assert lock.extend(20)
        _, ttl = lock.peek()
        assert ttl is not None
        assert ttl > 5
        assert lock.reacquire()
        _, ttl = lock.peek()
        assert ttl is not None
        assert ttl <= 5
        assert lock.owned()
        assert lock.fence == fence
        holder, _ = lock.peek()
        assert holder is not None
        assert holder.fence == fence


def test_a_sigkilled_holder_frees_the_lock_within_its_lease(etcd: EtcdServer) -> None:
    name = lock_name()
    code = (
        "import sys, threading\n"
        "from tasklock.etcd import Lock\n"
        f"lock = Lock({etcd.url!r}, {name!r}, timeout=2, watchdog=True)\n"
        "assert lock.acquire()\n"
        "print('held', flush=True)\n"
        "threading.Event().wait()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held"
        assert Lock(etcd.url, name).acquire(blocking=False) is False
        child.kill()
        child.wait(10)
        eventually(lambda: not Lock(etcd.url, name).locked(), timeout=10, interval=0.05)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    with Lock(etcd.url, name, blocking=False):
        pass


def test_the_watchdog_keeps_a_short_lease_alive(etcd: EtcdServer) -> None:
    name = lock_name()
    with Lock(etcd.url, name, timeout=2, watchdog=True) as lock:
        other = Lock(etcd.url, name, timeout=2)
        checks = holds_for(
            lambda: lock.owned() and not other.acquire(blocking=False), 5.0, interval=0.25
        )
        assert checks > 5
        assert not lock.lost


def test_a_revoked_lease_is_reported_lost(etcd: EtcdServer) -> None:
    name = lock_name()
    called = threading.Event()
    lock = Lock(etcd.url, name, timeout=3, watchdog=True, on_lost=lambda _: called.set())
    assert lock.acquire()
    etcd.revoke_lease(holder_lease(etcd, name))
    assert called.wait(10), "on_lost was not called"
    assert lock.lost
    assert lock.lost.reason
    with pytest.raises(LockLostError):
        lock.release()


def test_unreachable_endpoints_are_named(etcd: EtcdServer) -> None:
    closed = [free_port(), free_port()]
    lock = Lock(f"etcd://127.0.0.1:{closed[0]},127.0.0.1:{closed[1]}", lock_name())
    with pytest.raises(BackendUnavailable) as caught:
        lock.acquire()
    for port in closed:
        assert f"127.0.0.1:{port}" in str(caught.value)
    # A closed endpoint before a live one: the request goes on to the live one.
    with Lock([f"http://127.0.0.1:{closed[0]}", etcd.url], lock_name(), timeout=5) as held:
        assert held.owned()


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis://127.0.0.1:2379", "redis://"),
        ("etcd://", "etcd://"),
        ("etcd://127.0.0.1:99999", "99999"),
        ("etcd://127.0.0.1:2379/path", "/path"),
        ("127.0.0.1:2379", "127.0.0.1:2379"),
        ("etcd://a:2379,,b:2379", "a:2379,,b:2379"),
    ],
)
def test_bad_urls_are_configuration_errors(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Lock(url, "x")


def test_bad_arguments_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="whole seconds"):
        Lock("etcd://127.0.0.1:2379", "x", timeout=0.5)
    with pytest.raises(ConfigurationError, match="endpoints_or_client"):
        Lock(42, "x")  # type: ignore[arg-type]


def test_lost_reads_the_lease_off_this_process_clock(etcd: EtcdServer) -> None:
    """As every holder's: a lease run out by this process's clock is lost at once, before any
    keep-alive could tell (tests/integration/test_lost_by_clock.py has the paused processes)."""
    lock = Lock(Client(etcd.url), lock_name(), timeout=5)
    assert lock.acquire()
    previous = use_clock(ClockAhead(5))
    try:
        assert lock.lost
        assert lock.lost.reason.startswith("lease ran out by this process's clock")
    finally:
        use_clock(previous)
    assert not lock.lost
    lock.release()
