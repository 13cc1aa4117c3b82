"""tasklock.etcd.Lock on a real 3-member etcd cluster under faults (issue 14): the leader
SIGKILLed while a lock is held, a minority member SIGSTOPped (a follower, and the member a
client is talking to), a holder process SIGKILLed, the whole cluster crashed and restarted on its
data, and contending processes while the leader dies, checked from their recorded histories.

What "never silently doubled" means here: a hold counts from ``acquire()`` returning until its
release, or until the watchdog reported it lost (``on_lost``), whichever came first; no two such
intervals of one name may overlap (:func:`tests.support.history.assert_no_overlap`). A hold that
the watchdog reported lost is allowed to end early: that is the report's purpose.

One cluster serves the module (tests/support/etcd_cluster.py: loopback ports, data on tmpfs,
50 ms heartbeats, 500 ms elections); each test gets it back with all three members running and
answering. Lock clients use a 2 s request timeout (1 s where a paused member is expected to
stall them), so a request stuck behind a dead or stalled member costs little time. There are no
timing assertions: every wait is an event or a poll with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pytest

from tasklock.errors import BackendUnavailable, LockError, LockLostError, LockNotOwnedError
from tasklock.etcd import Client, Lock
from tests.support.etcd_cluster import EtcdCluster, running_cluster
from tests.support.history import (
    FencedRegister,
    HistoryLog,
    Hold,
    assert_fences_increase,
    assert_later_holds_fenced_higher,
    assert_no_overlap,
    now_ns,
)
from tests.support.polling import eventually, holds_for

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[3]
TTL = 2  # seconds: a lease etcd lets lapse two seconds after its last keep-alive
CLIENT_TIMEOUT = 2.0  # an election with 500 ms timeouts is over well within this
STALL_TIMEOUT = 1.0  # the client timeout where a request is meant to hit a paused member


@pytest.fixture(scope="module")
def etcd_cluster() -> Iterator[EtcdCluster]:
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def cluster(etcd_cluster: EtcdCluster) -> Iterator[EtcdCluster]:
    """The module's cluster with all three members running and agreeing on a leader, before
    each test and after it (a test that failed half-way leaves no member dead or paused)."""
    etcd_cluster.restore()
    yield etcd_cluster
    etcd_cluster.restore()


@pytest.fixture
def scratch(etcd_cluster: EtcdCluster) -> Path:
    """A directory for histories and registers, on the cluster's tmpfs (SQLite fsyncs)."""
    path = etcd_cluster.root / f"scratch-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


def lock_name() -> str:
    return f"etcd-faults:{uuid.uuid4().hex[:8]}"


def make_lock(endpoints: str, name: str, timeout: float = CLIENT_TIMEOUT, **kwargs: Any) -> Lock:
    """A lock with its own client (``timeout``: the client's per-request timeout)."""
    kwargs.setdefault("timeout", TTL)
    return Lock(Client(endpoints, timeout=timeout), name, **kwargs)


class Watched:
    """A lock held with the watchdog on, and when (if ever) the watchdog reported it lost."""

    def __init__(self, endpoints: str, name: str, timeout: float = CLIENT_TIMEOUT) -> None:
        self.lost_at: int | None = None
        self.lock = make_lock(endpoints, name, timeout, watchdog=True, on_lost=self._lost)
        self.start = 0

    def _lost(self, lock: Any) -> None:
        self.lost_at = now_ns()

    def acquire(self) -> int:
        assert self.lock.acquire(blocking_timeout=10)
        self.start = now_ns()
        assert self.lock.fence is not None
        return self.lock.fence

    def finish(self) -> Hold:
        """Release; the hold as it counts for mutual exclusion: until the release, or until the
        watchdog reported it lost. A hold found gone that was never reported lost fails."""
        end = now_ns()
        try:
            self.lock.release()
        except LockLostError:
            lost_at = eventually(lambda: self.lost_at, timeout=5, what="on_lost ran")
            end = min(end, lost_at)
        except LockNotOwnedError as exc:
            raise AssertionError(f"the hold was lost and never reported lost: {exc}") from None
        return Hold(self.lock.name, None, self.start, end, os.getpid())


class Contender:
    """A thread that takes and releases the lock over and over (each time recording the hold)
    until stopped; a BackendUnavailable (an election, a dead or stalled member) only counts."""

    def __init__(self, endpoints: str, name: str, history: HistoryLog) -> None:
        self.lock = make_lock(endpoints, name, watchdog=True)
        self.history = history
        self.attempts = 0
        self.unavailable: list[str] = []
        self.errors: list[BaseException] = []
        self.acquired = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Contender:
        self._thread.start()
        eventually(lambda: self.attempts > 0, timeout=10, what="the contender tried once")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(3 * CLIENT_TIMEOUT + 5)
        assert not self._thread.is_alive(), "the contender did not stop"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.lock.acquire(blocking_timeout=0.3):
                    start = now_ns()
                    fence = self.lock.fence
                    end = now_ns()
                    lost = bool(self.lock.lost)
                    if not lost:
                        self.history.record(Hold(self.lock.name, fence, start, end, os.getpid()))
                    self.acquired.set()
                    self.lock.release()
            except BackendUnavailable as exc:
                self.unavailable.append(str(exc))
            except BaseException as exc:  # the test reports it
                self.errors.append(exc)
                return
            finally:
                self.attempts += 1


def in_thread(call: Callable[[], object], deadline: float) -> Any:
    """``call()`` in a thread; its result or exception, failing if it is not back by
    ``deadline`` seconds (i.e. it hung)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(deadline)
    assert not thread.is_alive(), f"still blocked after {deadline}s: {call}"
    if "error" in outcome:
        return outcome["error"]
    return outcome["value"]


# -- a) the leader dies while a lock is held -------------------------------------------------


def test_leader_killed_while_held(cluster: EtcdCluster, scratch: Path) -> None:
    name = lock_name()
    leader = cluster.leader()
    follower = next(m for m in cluster.members if m is not leader)
    history = HistoryLog(scratch / "history")
    # The holder talks to the leader: its death makes the holder's client fail over.
    holder = Watched(cluster.endpoints_from(leader), name)
    fence = holder.acquire()
    with Contender(cluster.endpoints_from(follower), name, history) as contender:
        cluster.kill(leader)
        elected = cluster.leader()
        assert elected is not leader
        # Hold on for two TTLs past the election: renewals now go through the others.
        holder.lock.lost.wait(2 * TTL)
        if not holder.lock.lost:
            assert holder.lock.owned()
            assert not contender.acquired.is_set()
        history.record(holder.finish())
        # Free again: the contender (on the surviving members) gets it.
        assert contender.acquired.wait(5 * TTL), contender.unavailable[-3:]
    assert not contender.errors, contender.errors
    holds = history.holds()
    assert_no_overlap(holds)
    assert all(h.fence is None or h.fence > fence for h in holds)
    # A fresh client whose first endpoint is the dead member fails over to the others.
    late = make_lock(cluster.endpoints_from(leader), name)
    assert late.acquire(blocking_timeout=5)
    assert late.fence is not None
    assert late.fence > max(h.fence or 0 for h in holds)
    late.release()
    assert not late.locked()
    cluster.start_member(leader)  # (the fixture would, too) three members for what follows
    assert all(m.running for m in cluster.members)


# -- b) a minority member stalls (SIGSTOP) ---------------------------------------------------


def test_paused_follower_leaves_locks_working(cluster: EtcdCluster) -> None:
    name = lock_name()
    leader = cluster.leader()
    paused = next(m for m in cluster.members if m is not leader)
    others = [m for m in cluster.members if m is not paused]
    cluster.pause(paused)
    try:
        first = make_lock(cluster.endpoints_from(others[0]), name)
        second = make_lock(cluster.endpoints_from(others[1]), name)
        fences = []
        for lock, rival in [(first, second), (second, first), (first, second)]:
            assert lock.acquire(blocking_timeout=5)
            assert rival.acquire(blocking=False) is False
            fences.append(lock.fence)
            lock.release()
        assert fences == sorted(set(fences))  # type: ignore[type-var]
    finally:
        cluster.resume(paused)


def test_client_on_a_paused_member_fails_in_time(cluster: EtcdCluster) -> None:
    """A stalled member accepts the connection and never answers: the acquire's lease grant is
    not sent again elsewhere (it may have been applied), so the acquire raises
    BackendUnavailable naming that member once its request timeout has passed (no hang); and
    the client's next request starts at the next member, so the stalled one does not pin it."""
    name = lock_name()
    paused = cluster.followers()[0]
    lock = make_lock(cluster.endpoints_from(paused), name, timeout=STALL_TIMEOUT)
    cluster.pause(paused)
    try:
        error = in_thread(lambda: lock.acquire(blocking_timeout=5), deadline=STALL_TIMEOUT + 10)
        assert isinstance(error, BackendUnavailable), error
        assert paused.url in str(error)
        assert lock.fence is None

        def take_and_release() -> bool:
            taken = lock.acquire(blocking_timeout=5)
            lock.release()
            return taken

        assert in_thread(take_and_release, deadline=10) is True  # through the next member
    finally:
        cluster.resume(paused)
    # Nothing was left held by the attempt that stalled (its lease, if granted, lapses).
    eventually(lambda: not make_lock(cluster.endpoints, name).locked(), timeout=3 * TTL)


def test_hold_through_a_paused_member_is_kept_or_reported_lost(
    cluster: EtcdCluster, scratch: Path
) -> None:
    """The holder's client talks to the member that stalls: its keep-alives get no answer. The
    hold must then either survive or be reported lost before anyone else holds the lock.

    (With a 1 s request timeout against a 2 s TTL, a keep-alive that stalls and then moves on
    to the next member may still come too late: both outcomes are allowed here; the next test
    gives the keep-alives room and requires the hold to survive.)"""
    name = lock_name()
    paused = cluster.followers()[0]
    history = HistoryLog(scratch / "history")
    holder = Watched(cluster.endpoints_from(paused), name, timeout=STALL_TIMEOUT)
    fence = holder.acquire()
    rivals_start = next(m for m in cluster.members if m is not paused)
    cluster.pause(paused)
    try:
        with Contender(cluster.endpoints_from(rivals_start), name, history) as contender:
            holder.lock.lost.wait(3 * TTL)
            if holder.lock.lost:
                # Reported lost: etcd let the lease lapse, and the lock is free for others.
                assert contender.acquired.wait(3 * TTL)
            else:
                assert not contender.acquired.is_set()
    finally:
        cluster.resume(paused)
    assert not contender.errors, contender.errors
    history.record(holder.finish())
    holds = history.holds()
    assert_no_overlap(holds)
    assert all(h.fence is None or h.fence > fence for h in holds)


def test_keepalives_move_past_a_stalled_member(cluster: EtcdCluster) -> None:
    """Keep-alives are safe to repeat: one that gets no answer from the stalled member goes on
    to the next, and later requests start there. With a TTL that leaves room for one request
    timeout, the hold survives the pause of the member its client talked to."""
    name = lock_name()
    paused = cluster.followers()[0]
    client = Client(cluster.endpoints_from(paused), timeout=STALL_TIMEOUT)
    holder = Lock(client, name, timeout=4, watchdog=True)
    assert holder.acquire(blocking_timeout=10)
    fence = holder.fence
    cluster.pause(paused)
    try:
        holds_for(lambda: not holder.lost, 3 * 4, interval=0.05, what="the hold kept")
        assert holder.owned()  # answered by another member
        rival = make_lock(cluster.endpoints_from(cluster.leader()), name)
        assert not rival.acquire(blocking=False)
    finally:
        cluster.resume(paused)
    holder.release()
    assert rival.acquire(blocking_timeout=10)
    assert rival.fence is not None
    assert fence is not None
    assert rival.fence > fence
    rival.release()


# -- c) a holder process dies ----------------------------------------------------------------

HOLDER = """
import sys
from tasklock.etcd import Lock
lock = Lock(sys.argv[1], sys.argv[2], timeout=2, watchdog=True)
assert lock.acquire(blocking_timeout=10)
print(lock.fence, flush=True)
sys.stdin.read()  # hold (the watchdog renews) until killed
"""


def test_sigkilled_holder_frees_the_lock_within_its_ttl(cluster: EtcdCluster) -> None:
    name = lock_name()
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, cluster.endpoints, name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        line = in_thread(process.stdout.readline, deadline=30)  # type: ignore[union-attr]
        assert isinstance(line, bytes)
        assert line.strip(), f"the holder printed no fence (exit code {process.poll()})"
        fence = int(line)
        watcher = make_lock(cluster.endpoints, name)

        def held_by_holder() -> bool:
            holder, _ = watcher.peek()
            return holder is not None and holder.fence == fence

        # Alive, it keeps the lock past its TTL (the watchdog renews the lease)...
        holds_for(held_by_holder, duration=1.5 * TTL, interval=0.1, what="the holder holds")
        process.kill()
        assert process.wait(10) == -9
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()
    # ...dead, its lease lapses within the TTL and a waiter is woken.
    successor = make_lock(cluster.endpoints, name)
    assert successor.acquire(blocking_timeout=4 * TTL)
    assert successor.fence is not None
    assert successor.fence > fence
    successor.release()


# -- d) the whole cluster crashes and restarts -----------------------------------------------


def test_fences_increase_across_a_cluster_restart(cluster: EtcdCluster) -> None:
    def cycle(name: str) -> int:
        lock = make_lock(cluster.endpoints, name)
        assert lock.acquire(blocking_timeout=5)
        fence = lock.fence
        assert fence is not None
        lock.release()
        return fence

    names = [lock_name() for _ in range(3)]
    before = [cycle(name) for name in names]
    # A hold whose lease outlives the restart (no watchdog, a long TTL).
    kept = make_lock(cluster.endpoints, lock_name(), timeout=30)
    assert kept.acquire(blocking_timeout=5)
    kept_fence = kept.fence
    assert kept_fence is not None

    cluster.restart_all()

    # etcd kept the key and its lease: the holder (whose client had connections to the dead
    # processes) still holds it, with the same fence, and nobody else can take it.
    assert kept.owned()
    assert kept.fence == kept_fence
    assert make_lock(cluster.endpoints, kept.name).acquire(blocking=False) is False
    kept.release()
    after = [cycle(name) for name in [*names, kept.name]]
    highest = max([kept_fence, *before])
    assert all(fence > highest for fence in after), (before, kept_fence, after)
    assert after == sorted(set(after))


# -- e) contending processes while the leader dies -------------------------------------------

CHURNERS = 4


def churn(
    endpoints: str, name: str, directory: str, stop: Any, client_timeout: float = CLIENT_TIMEOUT
) -> None:
    """One contender process: acquire, write through the fenced register, record, release,
    until ``stop`` is set. Holds reported lost go to a log of their own."""
    lock = Lock(Client(endpoints, timeout=client_timeout), name, timeout=TTL, watchdog=True)
    history = HistoryLog(Path(directory) / "history")
    lost_log = HistoryLog(Path(directory) / "lost")
    register = FencedRegister(Path(directory) / "register.db")
    while not stop.is_set():
        try:
            requested = now_ns()
            if not lock.acquire(blocking_timeout=1):
                continue
        except BackendUnavailable:
            continue
        start = now_ns()
        fence = lock.fence
        assert fence is not None
        register.write(name, fence, str(os.getpid()))
        end = now_ns()
        hold = Hold(name, fence, start, end, os.getpid(), requested)
        (lost_log if lock.lost else history).record(hold)
        with contextlib.suppress(LockError, BackendUnavailable):
            lock.release()  # (lost, or no answer: the lease lapses by itself)


def test_mutual_exclusion_while_the_leader_dies(cluster: EtcdCluster, scratch: Path) -> None:
    name = lock_name()
    history = HistoryLog(scratch / "history")
    lost_log = HistoryLog(scratch / "lost")
    FencedRegister(scratch / "register.db")  # (the table, before the processes race for it)
    ctx = get_context("spawn")
    stop = ctx.Event()
    # Each process starts at another member, so some of them talk to the leader that dies.
    starts = [cluster.members[i % len(cluster.members)] for i in range(CHURNERS)]
    processes = [
        ctx.Process(target=churn, args=(cluster.endpoints_from(m), name, str(scratch), stop))
        for m in starts
    ]
    for process in processes:
        process.start()
    try:
        eventually(lambda: len(history.holds()) >= 20, timeout=30, what="20 holds before")
        leader = cluster.leader()
        killed_at = now_ns()
        cluster.kill(leader)
        assert cluster.leader() is not leader

        def carried_on() -> bool:
            after = [h for h in history.holds() if h.start > killed_at]
            return len(after) >= 20 and len({h.pid for h in after}) == CHURNERS

        # Every process, those that were talking to the dead leader too, holds again.
        eventually(carried_on, timeout=30, what="20 holds after the leader died, by every process")
        stop.set()
        for process in processes:
            process.join(3 * CLIENT_TIMEOUT + 10)
            assert process.exitcode == 0, f"contender {process.pid} exited with {process.exitcode}"
    finally:
        stop.set()
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(5)
    holds = history.holds()
    lost = lost_log.holds()
    assert_no_overlap(holds)
    assert_fences_increase(holds)
    assert_later_holds_fenced_higher(holds + lost)
    fences = [h.fence for h in holds + lost]
    assert len(set(fences)) == len(fences), "a fence was issued twice"
    register = FencedRegister(scratch / "register.db")
    register.assert_consistent()
    kept = {h.fence for h in holds}
    assert all(w["accepted"] for w in register.writes() if w["fence"] in kept)
    cluster.start_member(leader)
