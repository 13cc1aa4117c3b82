"""Celery and RQ with their locks on ZooKeeper: the broker and the job store stay on Redis (they
are the framework's), ``tasklock_url`` / ``TASKLOCK_URL`` name ZooKeeper, and ``on_duplicate``,
``dedupe_enqueue`` markers and fencing work there, under a real Celery worker and a real RQ
worker. The scenarios are :mod:`tests.integration.store_adapters`'s, shared with etcd."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from celery import Celery
from rq import Queue

from tasklock.zookeeper.client import client_for
from tasklock.zookeeper.lock import lock_directory
from tests.integration import store_adapters as scenarios
from tests.support.servers import RedisServer
from tests.support.zookeeper import ZooKeeperServer

app = Celery("tl_zk_tests", set_as_current=False)
tasks = scenarios.define_tasks(app, "zk")


def zk_url(zookeeper: ZooKeeperServer) -> str:
    return zookeeper.url() + "?session_timeout=1"


def zk_has(zookeeper: ZooKeeperServer, key: str) -> bool:
    """Whether ``key`` is held (a lock directory with a node) or marked (a marker node)."""
    client = client_for(zk_url(zookeeper))
    directory = lock_directory(client, key)
    client.call("testing", "sync", "/")
    if client.call("testing", "exists", directory) is not None:
        return bool(client.call("testing", "get_children", directory))
    marker = client.path("tasklock", "markers", quote(key, safe=""))
    return client.call("testing", "exists", marker) is not None


@pytest.fixture(scope="module")
def worker(redis_server: RedisServer, zookeeper: ZooKeeperServer) -> Iterator[Any]:
    yield from scenarios.celery_worker(app, redis_server, zk_url(zookeeper))


def test_celery_skips_a_duplicate_with_increasing_fences_on_zookeeper(
    worker: Any, redis_server: RedisServer, zookeeper: ZooKeeperServer
) -> None:
    scenarios.celery_skips_a_duplicate(tasks, redis_server, lambda key: zk_has(zookeeper, key))


def test_celery_dedupes_enqueue_with_markers_on_zookeeper(
    worker: Any, zookeeper: ZooKeeperServer
) -> None:
    scenarios.celery_dedupes_enqueue(tasks, lambda key: zk_has(zookeeper, key))


# -- RQ ------------------------------------------------------------------------------------------
@pytest.fixture
def queue(
    redis_server: RedisServer, zookeeper: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Queue]:
    yield from scenarios.rq_queue(redis_server, zk_url(zookeeper), monkeypatch)


def test_rq_runs_fenced_and_skips_a_duplicate_on_zookeeper(
    queue: Queue, zookeeper: ZooKeeperServer
) -> None:
    scenarios.rq_runs_fenced_and_skips_a_duplicate(queue, "tasklock.zookeeper.lock")


def test_rq_dedupe_enqueue_markers_live_on_zookeeper(
    queue: Queue, zookeeper: ZooKeeperServer, redis_server: RedisServer
) -> None:
    scenarios.rq_markers_live_on_the_store(queue, redis_server, lambda key: zk_has(zookeeper, key))
