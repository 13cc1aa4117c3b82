"""``tasklock.Leader`` on etcd: the same election, the term is etcd's revision."""

from __future__ import annotations

import threading

from tasklock import Leader
from tests.integration.etcd.conftest import EtcdServer


def test_an_election_on_etcd(etcd: EtcdServer) -> None:
    url = "etcd://" + etcd.url.removeprefix("http://")
    first, second = Leader(url, "cron:etcd", ttl=2), Leader(url, "cron:etcd", ttl=2)
    assert first.campaign()
    assert first.is_leader
    assert not second.campaign()
    term = first.fence
    elected = threading.Event()
    thread = threading.Thread(
        target=lambda: second.wait_for_leadership(timeout=20) and elected.set()
    )
    thread.start()
    first.resign()
    assert elected.wait(10)  # woken by the watch on the key's delete
    thread.join(10)
    assert second.fence is not None
    assert term is not None
    assert second.fence > term
    assert second.confirm()
    second.resign()
