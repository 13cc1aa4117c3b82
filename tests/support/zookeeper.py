"""Real ZooKeeper servers for tests: Debian's ``libzookeeper-java`` run by a headless JRE, on free
loopback ports with data directories of their own.

* :class:`ZooKeeperServer`: one standalone server (the ``zookeeper`` fixture in
  ``tests/integration/zookeeper/conftest.py``).
* :class:`ZooKeeperEnsemble`: 3 servers forming one ensemble, for the fault tests: SIGKILL a
  member (:meth:`~ZooKeeperEnsemble.kill`), start it again on its data
  (:meth:`~ZooKeeperEnsemble.start_member`).

``tickTime`` is 100 ms, so the sessions the server allows last 0.2 s to 2 s (2 and 20 ticks):
a dead holder's lock frees within about a second. Every wait is a poll with a deadline. Without
Java or the jars, the tests are skipped with a reason that names the install command.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.polling import eventually
from tests.support.servers import HOST, free_port

__all__ = [
    "INSTALL",
    "TICK_MS",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "classpath",
    "running_ensemble",
]

INSTALL = "apt-get install -y --no-install-recommends default-jre-headless libzookeeper-java"
#: The server's tick: session timeouts are bounded to [2, 20] ticks.
TICK_MS = 100
JARS = Path(os.environ.get("TASKLOCK_TEST_ZOOKEEPER_JARS", "/usr/share/java"))
#: The jars the server needs beside zookeeper.jar (Debian's package names).
_NEEDED = (
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
    "netty-handler.jar",
    "netty-common.jar",
    "netty-buffer.jar",
    "netty-transport.jar",
    "netty-codec.jar",
    "netty-resolver.jar",
    "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar",
    "commons-cli.jar",
    "commons-io.jar",
    "metrics-core.jar",
    "snappy-java.jar",
)
_SHM = Path("/dev/shm")


def classpath() -> str:
    """The server's classpath; skips the test (naming the install command) when Java or the
    jars are missing."""
    if shutil.which("java") is None or not (JARS / "zookeeper.jar").exists():
        pytest.skip(f"no ZooKeeper (java and /usr/share/java/zookeeper.jar): {INSTALL}")
    return ":".join(str(JARS / jar) for jar in _NEEDED if (JARS / jar).exists())


def _root() -> Path:
    where = _SHM if _SHM.is_dir() and os.access(_SHM, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="tasklock-zk-", dir=where))


def _answers(port: int) -> bool:
    """Whether the server on ``port`` serves clients (the ``srvr`` four-letter word)."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as sock:
            sock.sendall(b"srvr")
            reply = sock.recv(4096)
    except OSError:
        return False
    return b"Mode:" in reply


@dataclass(eq=False)
class Member:
    """One server: its ports and data stay the same across restarts."""

    myid: int
    client_port: int
    quorum_port: int
    election_port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self) -> str:
        try:
            return (self.data_dir / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""


@dataclass(eq=False)
class ZooKeeperEnsemble:
    """``size`` ZooKeeper servers on 127.0.0.1 (``size=1``: standalone). :meth:`start` returns
    once every member serves clients; :meth:`close` ends them and removes the data."""

    size: int = 3
    root: Path = field(default_factory=_root)
    members: list[Member] = field(default_factory=list)

    def __post_init__(self) -> None:
        taken: set[int] = set()
        for myid in range(1, self.size + 1):
            ports = [_distinct_port(taken) for _ in range(3)]
            self.members.append(Member(myid, *ports, self.root / f"m{myid}"))

    @property
    def hosts(self) -> str:
        """``127.0.0.1:a,127.0.0.1:b,...``, members in order."""
        return ",".join(member.address for member in self.members)

    def url(self, chroot: str = "") -> str:
        """``zookeeper://<hosts><chroot>``."""
        return f"zookeeper://{self.hosts}{chroot}"

    def _config(self, member: Member) -> Path:
        member.data_dir.mkdir(parents=True, exist_ok=True)
        (member.data_dir / "myid").write_text(f"{member.myid}\n")
        lines = [
            f"tickTime={TICK_MS}",
            "initLimit=50",
            "syncLimit=10",
            f"dataDir={member.data_dir}",
            f"clientPort={member.client_port}",
            f"clientPortAddress={HOST}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "maxClientCnxns=0",
            "forceSync=no",
        ]
        if self.size > 1:
            lines += [
                f"server.{m.myid}={HOST}:{m.quorum_port}:{m.election_port}" for m in self.members
            ]
        config = member.data_dir / "zoo.cfg"
        config.write_text("\n".join(lines) + "\n")
        return config

    def _spawn(self, member: Member) -> None:
        assert not member.running, f"member {member.myid} is already running"
        command = [
            "java",
            "-Xmx128m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.admin.enableServer=false",
            "-cp",
            classpath(),
        ]
        main = "org.apache.zookeeper.server." + (
            "quorum.QuorumPeerMain" if self.size > 1 else "ZooKeeperServerMain"
        )
        with open(member.data_dir / "server.log", "ab") as log:
            member.process = subprocess.Popen(
                [*command, main, str(self._config(member))], stdout=log, stderr=subprocess.STDOUT
            )

    def start(self) -> ZooKeeperEnsemble:
        try:
            for member in self.members:
                self._config(member)
            for member in self.members:
                self._spawn(member)
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def wait_ready(self, members: list[Member] | None = None) -> None:
        for member in members or [m for m in self.members if m.process is not None]:
            eventually(
                lambda member=member: self._ready(member),
                timeout=60,
                interval=0.05,
                what=f"ZooKeeper member {member.myid} serving on {member.address}",
            )

    def _ready(self, member: Member) -> bool:
        assert member.process is not None
        if member.process.poll() is not None:
            raise RuntimeError(f"ZooKeeper exited: {member.log_tail()}")
        return _answers(member.client_port)

    def start_member(self, member: Member) -> None:
        self._spawn(member)
        self.wait_ready([member])

    def kill(self, member: Member) -> None:
        """SIGKILL one member: gone at once."""
        if member.process is not None:
            if member.process.poll() is None:
                member.process.send_signal(signal.SIGCONT)
                member.process.kill()
            member.process.wait(10)
            member.process = None

    def close(self) -> None:
        for member in self.members:
            self.kill(member)
        shutil.rmtree(self.root, ignore_errors=True)


class ZooKeeperServer(ZooKeeperEnsemble):
    """One standalone server."""

    def __init__(self) -> None:
        super().__init__(size=1)

    @property
    def member(self) -> Member:
        return self.members[0]


def _distinct_port(taken: set[int]) -> int:
    for _ in range(100):
        port = free_port()
        if port not in taken:
            taken.add(port)
            return port
    raise RuntimeError("no distinct free port")  # pragma: no cover


@contextlib.contextmanager
def running_ensemble(size: int = 3) -> Iterator[ZooKeeperEnsemble]:
    """A :class:`ZooKeeperEnsemble` started for the ``with`` block, closed after it."""
    ensemble = ZooKeeperEnsemble(size=size).start()
    try:
        yield ensemble
    finally:
        ensemble.close()
