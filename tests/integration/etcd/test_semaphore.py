"""tasklock.etcd.Semaphore against a real single-node etcd (see conftest.py)."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tasklock.errors import ConfigurationError, LockLostError, LockNotOwnedError
from tasklock.etcd import Client, Lock, Semaphore
from tasklock.etcd.protocol import b64
from tests.integration.etcd.conftest import EtcdServer
from tests.support.polling import eventually

ROOT = Path(__file__).resolve().parents[3]


def sem_name() -> str:
    return f"etcd-sem-test:{uuid.uuid4().hex[:8]}"


def permit_keys(etcd: EtcdServer, name: str) -> dict[str, int]:
    """The permit keys of ``name`` now, with their leases."""
    reply = httpx.post(
        f"{etcd.url}/v3/kv/range",
        json={"key": b64(f"{name}:permit:".encode()), "range_end": b64(f"{name}:permit;".encode())},
        timeout=5,
    ).json()
    return {base64.b64decode(kv["key"]).decode(): int(kv["lease"]) for kv in reply.get("kvs", [])}


class CountingClient(Client):
    """Counts the gateway requests by path, and the watches opened (with their ranges)."""

    def __init__(self, endpoints: str) -> None:
        super().__init__(endpoints)
        self.requests: Counter[str] = Counter()
        self.watches: list[tuple[bytes, bytes | None]] = []
        self.watching = threading.Event()

    def raw(self, path: str, body: dict[str, Any], what: str) -> tuple[int, bytes, str]:
        self.requests[path] += 1
        return super().raw(path, body, what)

    def wait_for_delete(
        self, key: bytes, start_revision: int, timeout: float, *, range_end: bytes | None = None
    ) -> bool:
        self.watches.append((key, range_end))
        self.watching.set()
        return super().wait_for_delete(key, start_revision, timeout, range_end=range_end)


def test_etcd_compares_a_range_as_no_key_when_it_is_empty(etcd: EtcdServer) -> None:
    """The Lock's exclusion of permits rests on this: CREATE == 0 over [start, end) holds only
    when no key is in the range (etcd 3.5 compares an empty range as one zero KeyValue)."""
    name = sem_name()
    start, end = f"{name}:permit:".encode(), f"{name}:permit;".encode()

    def none_in_range() -> bool:
        compare = {
            "target": "CREATE",
            "key": b64(start),
            "range_end": b64(end),
            "result": "EQUAL",
            "create_revision": "0",
        }
        reply = httpx.post(f"{etcd.url}/v3/kv/txn", json={"compare": [compare]}, timeout=5)
        return bool(reply.json().get("succeeded"))

    assert none_in_range()
    put = {"key": b64(start + b"3"), "value": b64(b"x")}
    httpx.post(f"{etcd.url}/v3/kv/put", json=put, timeout=5).raise_for_status()
    assert not none_in_range()
    # Keys next to the range do not count: the lock key itself, and "<name>:permit;..." past it.
    for beside in (name.encode(), end, end + b"0"):
        put = {"key": b64(beside), "value": b64(b"x")}
        httpx.post(f"{etcd.url}/v3/kv/put", json=put, timeout=5).raise_for_status()
    httpx.post(
        f"{etcd.url}/v3/kv/deleterange", json={"key": b64(start + b"3")}, timeout=5
    ).raise_for_status()
    assert none_in_range()


def test_limit_holders_at_once_and_the_next_is_refused(etcd: EtcdServer) -> None:
    name = sem_name()
    counting = CountingClient(etcd.url)
    first = Semaphore(counting, name, 3, timeout=30, owner_info={"task": "t-0"})
    assert first.acquire(blocking=False)
    # Uncontended: one lease grant and one transaction.
    assert counting.requests == Counter({"/v3/lease/grant": 1, "/v3/kv/txn": 1})
    others = [
        Semaphore(etcd.url, name, 3, timeout=30, owner_info={"task": f"t-{i}"}) for i in (1, 2)
    ]
    for other in others:
        assert other.acquire(blocking=False)
    held = [first, *others]
    assert all(s.owned() for s in held)
    assert sorted(permit_keys(etcd, name)) == [f"{name}:permit:{i}" for i in range(3)]
    assert len({s.fence for s in held}) == 3
    assert first.locked()
    late = Semaphore(etcd.url, name, 3, timeout=30)
    assert late.acquire(blocking=False) is False
    assert late.acquire(blocking_timeout=0.3) is False
    holders = late.holders()
    assert sorted(h.meta["task"] for h, _ in holders) == ["t-0", "t-1", "t-2"]
    assert sorted(h.fence for h, _ in holders) == sorted(s.fence for s in held)
    assert all(ttl is not None and 0 < ttl <= 30 for _, ttl in holders)
    holder, ttl = late.peek()
    assert holder is not None
    assert holder.meta["task"] in {"t-0", "t-1", "t-2"}
    assert ttl is not None
    others[0].release()
    assert not others[0].owned()
    assert not first.locked()
    assert late.acquire(blocking=False)
    assert len(permit_keys(etcd, name)) == 3
    for s in (first, others[1], late):
        s.release()
    assert permit_keys(etcd, name) == {}
    assert not late.locked()
    assert late.holders() == []
    assert late.peek() == (None, None)


def test_a_release_wakes_a_waiter_that_watches_the_permits(etcd: EtcdServer) -> None:
    name = sem_name()
    holders = [Semaphore(etcd.url, name, 2, timeout=60) for _ in range(2)]
    for s in holders:
        assert s.acquire()
    client = CountingClient(etcd.url)
    waiter = Semaphore(client, name, 2, timeout=10, blocking_timeout=30, thread_local=False)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire()))
    thread.start()
    assert client.watching.wait(10), "the waiter never started watching"
    before = client.requests["/v3/kv/txn"]
    holders[1].release()
    thread.join(20)
    assert got == [True], "the waiter was not woken by the release"
    # It watched the permit range, once: no polling while both permits were held.
    assert client.watches == [(f"{name}:permit:".encode(), f"{name}:permit;".encode())]
    assert client.requests["/v3/kv/range"] == 0
    assert client.requests["/v3/kv/txn"] - before <= 3
    waiter.release()
    holders[0].release()


def test_a_lock_and_a_semaphore_of_one_name_exclude_each_other(etcd: EtcdServer) -> None:
    name = sem_name()
    counting = CountingClient(etcd.url)
    lock = Lock(counting, name, timeout=30, owner_info={"task": "the-lock"})
    sem = Semaphore(etcd.url, name, 3, timeout=30, owner_info={"task": "a-permit"})
    assert lock.acquire(blocking=False)
    # The second compare (no permit) costs nothing: still one grant and one transaction.
    assert counting.requests == Counter({"/v3/lease/grant": 1, "/v3/kv/txn": 1})
    assert sem.acquire(blocking=False) is False
    assert sem.locked()
    [(holder, _)] = sem.holders()
    assert holder.meta["task"] == "the-lock"
    assert permit_keys(etcd, name) == {}
    lock.release()
    assert sem.acquire(blocking=False)
    other = Lock(etcd.url, name, timeout=30)
    assert other.acquire(blocking=False) is False
    assert other.locked()
    seen, _ = other.peek()
    assert seen is not None
    assert seen.meta["task"] == "a-permit"
    assert seen.fence == sem.fence
    sem.release()
    assert other.acquire(blocking=False)
    other.release()


def test_each_side_waits_for_the_other_and_is_woken(etcd: EtcdServer) -> None:
    name = sem_name()
    sem = Semaphore(etcd.url, name, 2, timeout=60)
    assert sem.acquire()
    lock_client = CountingClient(etcd.url)
    lock = Lock(lock_client, name, timeout=60, blocking_timeout=30, thread_local=False)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(lock.acquire()))
    thread.start()
    assert lock_client.watching.wait(10)
    # A Lock kept out by permits watches the permits, not its own key.
    assert lock_client.watches == [(f"{name}:permit:".encode(), f"{name}:permit;".encode())]
    sem.release()
    thread.join(20)
    assert got == [True], "the lock was not woken by the permit's release"

    sem_client = CountingClient(etcd.url)
    waiter = Semaphore(sem_client, name, 2, timeout=60, blocking_timeout=30, thread_local=False)
    got.clear()
    thread = threading.Thread(target=lambda: got.append(waiter.acquire()))
    thread.start()
    assert sem_client.watching.wait(10)
    assert sem_client.watches == [(name.encode(), None)]  # the lock key
    lock.release()
    thread.join(20)
    assert got == [True], "the semaphore was not woken by the lock's release"
    waiter.release()


def test_fences_strictly_increase_across_permits_and_the_lock(etcd: EtcdServer) -> None:
    name = sem_name()
    fences: list[int] = []
    for _ in range(3):
        held = [Semaphore(etcd.url, name, 2, timeout=10) for _ in range(2)]
        for s in held:
            assert s.acquire(blocking_timeout=5)
            assert s.fence is not None
            fences.append(s.fence)
        for s in held:
            holder, _ = s.peek()
            assert holder is not None
            s.release()
        with Lock(etcd.url, name, timeout=10, blocking_timeout=5) as lock:
            assert lock.fence is not None
            fences.append(lock.fence)
    assert fences == sorted(set(fences)), fences


def test_concurrent_acquirers_never_exceed_the_limit(etcd: EtcdServer) -> None:
    name = sem_name()
    limit = 2
    client = CountingClient(etcd.url)
    sem = Semaphore(client, name, limit, timeout=10, blocking_timeout=60)
    inside = 0
    most = 0
    counted = threading.Lock()
    acquired = Counter[str]()
    errors: list[BaseException] = []

    def worker() -> None:
        nonlocal inside, most
        try:
            for _ in range(4):
                assert sem.acquire()
                with counted:
                    inside += 1
                    most = max(most, inside)
                    acquired["n"] += 1
                with counted:
                    inside -= 1
                sem.release()
        except BaseException as exc:  # (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert acquired["n"] == 24
    assert 1 <= most <= limit
    assert permit_keys(etcd, name) == {}


def test_a_sigkilled_holder_frees_its_permit_within_its_lease(etcd: EtcdServer) -> None:
    name = sem_name()
    code = (
        "import threading\n"
        "from tasklock.etcd import Semaphore\n"
        f"s = Semaphore({etcd.url!r}, {name!r}, 1, timeout=2, watchdog=True)\n"
        "assert s.acquire()\n"
        "print('held', flush=True)\n"
        "threading.Event().wait()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held"
        assert Semaphore(etcd.url, name, 1).acquire(blocking=False) is False
        child.kill()
        child.wait(10)
        # A waiter is woken by the permit's delete when the lease runs out.
        waiter = Semaphore(etcd.url, name, 1, timeout=10, blocking_timeout=15)
        assert waiter.acquire()
        waiter.release()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_a_revoked_permit_lease_is_reported_lost(etcd: EtcdServer) -> None:
    name = sem_name()
    called = threading.Event()
    sem = Semaphore(etcd.url, name, 2, timeout=3, watchdog=True, on_lost=lambda _: called.set())
    assert sem.acquire()
    [lease] = permit_keys(etcd, name).values()
    etcd.revoke_lease(lease)
    assert called.wait(10), "on_lost was not called"
    assert sem.lost
    assert sem.lost.reason
    with pytest.raises(LockLostError):
        sem.release()


def test_extend_release_and_a_stale_holder(etcd: EtcdServer) -> None:
    name = sem_name()
    sem = Semaphore(etcd.url, name, 2, timeout=5)
    assert sem.acquire()
    fence = sem.fence
    assert sem.extend(20)
    holder, ttl = sem.peek()
    assert holder is not None
    assert holder.fence == fence
    assert ttl is not None
    assert ttl > 5
    assert sem.reacquire()
    _, ttl = sem.peek()
    assert ttl is not None
    assert ttl <= 5
    assert sem.owned()
    assert sem.fence == fence
    [lease] = permit_keys(etcd, name).values()
    etcd.revoke_lease(lease)
    assert not sem.owned()
    with pytest.raises(LockNotOwnedError):
        sem.release()
    assert "limit=2" in repr(sem)


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "2", None])
def test_a_bad_limit_is_a_configuration_error(limit: Any) -> None:
    with pytest.raises(ConfigurationError, match="limit"):
        Semaphore("etcd://127.0.0.1:2379", "x", limit)


def test_the_watchdog_keeps_a_short_permit_lease_alive(etcd: EtcdServer) -> None:
    """A holder's permit stays held while its process lives (the watchdog renews a lease
    shorter than the wait), so the SIGKILL test above frees it by the kill, not by chance."""
    name = sem_name()
    with Semaphore(etcd.url, name, 1, timeout=2, watchdog=True) as sem:
        other = Semaphore(etcd.url, name, 1, timeout=2)
        assert other.acquire(blocking_timeout=3.5) is False
        assert sem.owned()
        assert not sem.lost
    eventually(lambda: not other.locked(), timeout=5, interval=0.05)
