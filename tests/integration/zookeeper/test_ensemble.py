"""A 3-node ZooKeeper ensemble: a minority down keeps locks working (and a hold held through it),
the majority down is :class:`BackendUnavailable`, named, in bounded time."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator

import pytest

from tasklock.errors import BackendUnavailable
from tasklock.zookeeper import Lock
from tasklock.zookeeper.client import Client
from tests.support.polling import eventually
from tests.support.servers import HOST
from tests.support.zookeeper import Member, ZooKeeperEnsemble

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ensemble() -> Iterator[ZooKeeperEnsemble]:
    pytest.importorskip("kazoo")
    ensemble = ZooKeeperEnsemble(size=3)
    try:
        ensemble.start()
        yield ensemble
    finally:
        ensemble.close()


def mode(member: Member) -> str:
    try:
        with socket.create_connection((HOST, member.client_port), timeout=1) as sock:
            sock.sendall(b"srvr")
            reply = sock.recv(4096).decode(errors="replace")
    except OSError:
        return ""
    return next((line.split(":")[1].strip() for line in reply.splitlines() if "Mode" in line), "")


def test_a_minority_down_keeps_working_and_the_majority_down_is_unavailable(
    ensemble: ZooKeeperEnsemble,
) -> None:
    url = ensemble.url() + "?session_timeout=2"
    name = f"ensemble:{uuid.uuid4().hex}"
    client = Client(url)
    holder = Lock(client, name)
    assert holder.acquire()
    fence = holder.fence
    leader = eventually(
        lambda: next((m for m in ensemble.members if mode(m) == "leader"), None),
        timeout=20,
        what="an elected leader",
    )
    ensemble.kill(leader)  # a minority, and the leader at that: a new one is elected

    def still_works() -> bool:
        try:
            return not Lock(client, name).acquire(blocking=False) and holder.owned()
        except BackendUnavailable:
            return False  # (the election, or the reconnect, is still under way)

    eventually(still_works, timeout=20, interval=0.1, what="locks answering on 2 of 3")
    other = Lock(client, f"{name}:other")
    assert other.acquire(blocking=False)
    assert other.fence is not None
    assert fence is not None
    assert other.fence > fence
    other.release()

    survivors = [m for m in ensemble.members if m.running]
    ensemble.kill(survivors[0])  # now the majority is down
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="unreachable"):
        Lock(client, f"{name}:late").acquire(blocking=False)
    assert time.monotonic() - started < 10
    with pytest.raises(BackendUnavailable, match="unreachable"):
        Lock(Client(url), name).acquire(blocking=False)  # a new session cannot even open
    eventually(lambda: bool(holder.lost), timeout=10, what="the holder told it lost")
    client.close()
