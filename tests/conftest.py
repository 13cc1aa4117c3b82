"""Shared fixtures: real redis-server processes, one per test module (N for Redlock tests), and
the other topologies of the server matrix (a 3-master Redis Cluster, Sentinel with a replica, a
TLS server), each started once per module that asks for it and torn down after it.

The Celery fixtures come from ``celery.contrib.pytest`` (``-p no:celery`` in the pytest options
keeps pytest-celery 1.x's Docker-based plugin out, should it be installed).
"""

from __future__ import annotations

import importlib.util
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tasklock import fleet
from tasklock.core.watchdog import get_watchdog
from tests.support.brokers import start_rabbitmq
from tests.support.databases import MariaDB, start_mariadb
from tests.support.servers import (
    RedisClusterServers,
    RedisServer,
    SentinelServers,
    start_servers,
    start_tls_server,
)

# The core tests run without Celery installed; with it, its in-process worker fixtures load.
pytest_plugins = ("celery.contrib.pytest",) if importlib.util.find_spec("celery") else ()


@pytest.fixture(scope="module", autouse=True)
def fleet_counts_stay_in_their_module() -> Iterator[None]:
    """Forget the fleet counts a module leaves unwritten: bound for a server that stopped with
    the module, they would be retried, and warned about, in later modules, whose tests may
    assert that tasklock logged no warning."""
    yield
    fleet.forget()


@pytest.fixture(scope="module", autouse=True)
def holds_stay_in_their_module() -> Iterator[None]:
    """Stop renewing the holds a module leaves behind: their servers stop with the module, and
    the watchdog's renewals would retry against them in later modules. redis-py's retry backoff
    draws from the global ``random``, and a draw on the watchdog's thread while a Hypothesis test
    generates its data made Hypothesis warn "Do not use the `random` module inside strategies"
    in whichever property test happened to run then."""
    yield
    get_watchdog().forget()


@pytest.fixture(scope="module", autouse=True)
def zookeeper_clients_stay_in_their_module() -> Iterator[None]:
    """Close every ZooKeeper client a module made, directly or through the per-URL cache: its
    servers stop with the module, and kazoo would go on reconnecting to them, on a thread of its
    own, for the rest of the run (its backoff's jitter also draws from the global ``random``,
    which made Hypothesis warn in whichever property test was generating data then)."""
    if importlib.util.find_spec("kazoo") is None:
        yield
        return
    from tasklock.zookeeper import client as zookeeper_client

    made: weakref.WeakSet[Any] = weakref.WeakSet()
    original = zookeeper_client.Client.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.add(self)

    zookeeper_client.Client.__init__ = recording_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        zookeeper_client.Client.__init__ = original  # type: ignore[method-assign]
        for client in [*zookeeper_client._clients.forget(), *made]:
            client.close()


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def resp(request: pytest.FixtureRequest) -> Iterator[int]:
    """The test runs twice: every client ``RedisServer.client()`` makes (``r``, Redlock's
    masters', the test's own) and every client made from ``RedisServer.url`` (``ar``, a guard's
    ``url``, ``TASKLOCK_URL``) speaks RESP2 in one run and RESP3 in the other. A module opts in
    with ``pytestmark = pytest.mark.usefixtures("resp")`` (set up before the test's clients).
    redis-py 8 speaks RESP3 unless told otherwise, older ones RESP2: users bring both."""
    RedisServer.protocol = request.param
    try:
        yield request.param
    finally:
        RedisServer.protocol = None


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server for the whole module."""
    with start_servers(1) as servers:
        yield servers[0]


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client to the module's server, emptied before each test."""
    if not redis_server.running:
        redis_server.start()
    elif redis_server.paused:
        redis_server.resume()
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="module")
def redis_nodes_5() -> Iterator[list[RedisServer]]:
    """Five independent redis-server processes (Redlock masters) for the module."""
    with start_servers(5) as servers:
        yield servers


@pytest.fixture
def nodes(redis_nodes_5: list[RedisServer]) -> Iterator[list[RedisServer]]:
    """The module's five masters, all running and empty before each test."""
    for server in redis_nodes_5:
        if not server.running:
            server.start()
        elif server.paused:
            server.resume()
        client = server.client()
        client.flushall()
        client.close()
    yield redis_nodes_5
    for server in redis_nodes_5:
        if server.paused:
            server.resume()


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A real 3-master Redis Cluster (the suite's binary), slots assigned, every node ok."""
    cluster = RedisClusterServers().start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def redis_sentinel() -> Iterator[SentinelServers]:
    """A master, its replica and 3 sentinels (quorum 2), settled: every sentinel lists the
    replica and knows the other sentinels."""
    servers = SentinelServers().start()
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="module")
def tls_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A TLS-only redis-server with a throw-away CA (trustme); skipped, saying why, when no
    binary at hand was built with TLS. ``.url`` is ``rediss://...?ssl_ca_certs=<ca.pem>``."""
    server = start_tls_server(tmp_path_factory.mktemp("tls"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDB]:
    """The suite's own MariaDB (started once, on a free loopback port): the fencing and Django
    tests each make a database of their own on it."""
    with start_mariadb() as server:
        yield server


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """The suite's own RabbitMQ node (started once, on free loopback ports), as an AMQP URL."""
    with start_rabbitmq() as url:
        yield url
