"""``tasklock.zookeeper.Lock`` and ``Semaphore`` on a real ZooKeeper: exclusion across processes,
fences from the nodes' creation zxids, a dead or paused holder, and the errors."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tasklock.errors import BackendUnavailable, ConfigurationError, LockNotOwnedError
from tasklock.zookeeper import Lock, Semaphore
from tasklock.zookeeper.client import Client
from tests.support.polling import eventually
from tests.support.servers import free_port
from tests.support.zookeeper import ZooKeeperServer

ROOT = str(Path(__file__).resolve().parents[3])


def child(code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([f"{ROOT}/src", ROOT])}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_acquire_release_wake_and_fence(url: str) -> None:
    name = f"job:{uuid.uuid4().hex}"
    first, second = Lock(url, name), Lock(url, name, thread_local=False)
    assert first.acquire()
    assert first.owned()
    assert first.locked()
    assert not second.acquire(blocking=False)
    holder, _ = second.peek()
    assert holder is not None
    assert holder.fence == first.fence
    got = threading.Event()
    thread = threading.Thread(target=lambda: second.acquire(blocking_timeout=10) and got.set())
    thread.start()
    fence = first.fence
    first.release()
    assert got.wait(10)  # woken by its watch on the node before it
    thread.join(10)
    assert second.fence is not None
    assert fence is not None
    assert second.fence > fence
    second.release()
    assert not first.locked()
    assert first.acquire()
    node = next(iter(first._nodes.values()))
    first.client.call("deleting the node in a test", "delete", node.path)  # (as `tasklock release`)
    with pytest.raises(LockNotOwnedError):  # (LockLostError, if the watchdog saw it first)
        first.release()


def test_semaphore_lets_limit_in_and_excludes_the_lock(url: str) -> None:
    name = f"sem:{uuid.uuid4().hex}"
    permits = [Semaphore(url, name, 2) for _ in range(3)]
    assert permits[0].acquire(blocking=False)
    assert permits[1].acquire(blocking=False)
    assert not permits[2].acquire(blocking=False)
    assert permits[2].locked()
    assert len(permits[0].holders()) == 2
    assert not Lock(url, name).acquire(blocking=False)
    permits[0].release()
    assert permits[2].acquire(blocking=False)
    permits[1].release()
    permits[2].release()
    lock = Lock(url, name)
    assert lock.acquire(blocking=False)
    assert not permits[0].acquire(blocking=False)  # a Lock holds every permit
    lock.release()


_CONTENDER = """
import sys, time
from tasklock.zookeeper import Lock
lock = Lock(sys.argv[1] if len(sys.argv) > 1 else {url!r}, {name!r})
for _ in range({rounds}):
    with lock:
        entered = time.monotonic()
        time.sleep(0.002)
        print(lock.fence, entered, time.monotonic(), flush=True)
"""


def test_no_overlap_and_increasing_fences_across_processes(url: str) -> None:
    name = f"contended:{uuid.uuid4().hex}"
    code = _CONTENDER.format(url=url, name=name, rounds=8)
    processes = [child(code) for _ in range(3)]
    rows = []
    for process in processes:
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        rows += [tuple(float(x) for x in line.split()) for line in out.splitlines()]
    assert len(rows) == 24
    rows.sort(key=lambda row: row[1])
    for before, after in itertools.pairwise(rows):
        assert before[2] <= after[1], f"two holders overlapped: {before} {after}"
        assert after[0] > before[0], f"fence went back: {before} {after}"


_HOLDER = """
import sys
from tasklock.zookeeper import Lock
lock = Lock({url!r}, {name!r})
lock.acquire()
print("held", lock.fence, flush=True)
sys.stdin.readline()
print("lost" if lock.lost else "not lost", flush=True)
"""


def test_a_sigkilled_holder_frees_the_lock_within_the_session_timeout(url: str) -> None:
    name = f"killed:{uuid.uuid4().hex}"
    process = child(_HOLDER.format(url=url, name=name))
    assert process.stdout is not None
    assert process.stdout.readline().startswith("held")
    process.kill()
    process.wait(10)
    killed = time.monotonic()
    lock = Lock(url, name)
    assert lock.acquire(blocking_timeout=10)
    # The session (1 s) expires on the server's ticks: within its timeout plus a tick or two.
    assert time.monotonic() - killed < 1.0 + 1.0
    lock.release()


def test_a_sigstopped_holder_is_told_it_lost_before_it_acts(url: str) -> None:
    name = f"paused:{uuid.uuid4().hex}"
    process = child(_HOLDER.format(url=url, name=name))
    assert process.stdout is not None
    assert process.stdin is not None
    first_fence = int(process.stdout.readline().split()[1])
    process.send_signal(signal.SIGSTOP)
    try:
        lock = Lock(url, name)
        assert lock.acquire(blocking_timeout=15)  # once the paused holder's session expired
        assert lock.fence is not None
        assert lock.fence > first_fence
    finally:
        process.send_signal(signal.SIGCONT)
    process.stdin.write("act\n")
    process.stdin.flush()
    assert process.stdout.readline().strip() == "lost"
    process.wait(10)
    lock.release()


def test_the_watchdog_keeps_a_hold_past_its_ttl_and_extend_confirms(url: str) -> None:
    lock = Lock(url, f"long:{uuid.uuid4().hex}", timeout=30)
    assert lock.ttl == 1.0  # capped at the session timeout
    with lock:
        deadline = time.monotonic() + 2.5
        eventually(lambda: time.monotonic() > deadline, timeout=5, interval=0.1)
        assert not lock.lost
        assert lock.extend(5)
        assert lock.lease_left() is not None
        assert lock.lease_left() <= 1.0  # type: ignore[operator]


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("zookeeper://", "names no server"),
        ("zookeeper://h:notaport", "is not host:port"),
        ("zookeeper://h:2181?session_timeout=abc", "session_timeout"),
        ("zookeeper://h:2181?nope=1", "unknown option"),
    ],
)
def test_bad_urls_are_configuration_errors(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Lock(url, "x")


def test_a_missing_chroot_is_named(zookeeper: ZooKeeperServer) -> None:
    client = Client(zookeeper.url("/no/such/chroot") + "?session_timeout=1")
    with pytest.raises(ConfigurationError, match="chroot '/no/such/chroot'.*does not exist"):
        Lock(client, "x").acquire()
    client.close()


def test_a_session_timeout_outside_the_servers_bounds_is_named(
    zookeeper: ZooKeeperServer,
) -> None:
    client = Client(zookeeper.url() + "?session_timeout=60")
    with pytest.raises(ConfigurationError, match="outside the ZooKeeper servers' bounds"):
        Lock(client, "x").acquire()
    client.close()


def test_an_unreachable_ensemble_is_backend_unavailable() -> None:
    client = Client(f"zookeeper://127.0.0.1:{free_port()}?session_timeout=1")
    with pytest.raises(BackendUnavailable, match="unreachable"):
        Lock(client, "x").acquire(blocking=False)
    client.close()
