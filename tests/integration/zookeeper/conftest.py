"""One real ZooKeeper per test module (Debian's libzookeeper-java on a headless JRE), on a free
loopback port with a data directory of its own; stopped (and the directory removed) after the
module. Skipped, naming the install command, where Java or the jars are missing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.zookeeper import ZooKeeperServer

pytest.importorskip("kazoo", reason="pip install kazoo (the test extra has it)")


@pytest.fixture(scope="module")
def zookeeper() -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def url(zookeeper: ZooKeeperServer) -> str:
    """The server with a 1 s session: a dead holder's lock frees within about a second."""
    return zookeeper.url() + "?session_timeout=1"
