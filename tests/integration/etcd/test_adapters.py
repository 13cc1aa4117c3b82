"""Celery and RQ with their locks on etcd: the broker and the job store stay on Redis (they are
the framework's), ``tasklock_url`` / ``TASKLOCK_URL`` name etcd, and every option works there:
``on_duplicate``, ``dedupe_enqueue`` markers and fencing (``limit`` is in test_semaphore's
task-level tests when the etcd Semaphore is present). The scenarios are
:mod:`tests.integration.store_adapters`'s, shared with ZooKeeper."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from celery import Celery
from rq import Queue

from tests.integration import store_adapters as scenarios
from tests.integration.etcd.conftest import EtcdServer
from tests.support.servers import RedisServer

app = Celery("tl_etcd_tests", set_as_current=False)
tasks = scenarios.define_tasks(app, "etcd")


def etcd_url(etcd: EtcdServer) -> str:
    return "etcd://" + etcd.url.removeprefix("http://")


def etcd_has(etcd: EtcdServer, key: str) -> bool:
    reply = httpx.post(
        f"{etcd.url}/v3/kv/range",
        json={"key": base64.b64encode(key.encode()).decode(), "count_only": True},
    ).json()
    return int(reply.get("count", 0)) > 0


@pytest.fixture(scope="module")
def worker(redis_server: RedisServer, etcd: EtcdServer) -> Iterator[Any]:
    yield from scenarios.celery_worker(app, redis_server, etcd_url(etcd))


def test_celery_skips_a_duplicate_with_increasing_fences_on_etcd(
    worker: Any, redis_server: RedisServer, etcd: EtcdServer
) -> None:
    scenarios.celery_skips_a_duplicate(tasks, redis_server, lambda key: etcd_has(etcd, key))


def test_celery_dedupes_enqueue_with_markers_on_etcd(worker: Any, etcd: EtcdServer) -> None:
    scenarios.celery_dedupes_enqueue(tasks, lambda key: etcd_has(etcd, key))


# -- RQ ------------------------------------------------------------------------------------------
@pytest.fixture
def queue(
    redis_server: RedisServer, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Queue]:
    yield from scenarios.rq_queue(redis_server, etcd_url(etcd), monkeypatch)


def test_rq_runs_fenced_and_skips_a_duplicate_on_etcd(queue: Queue, etcd: EtcdServer) -> None:
    scenarios.rq_runs_fenced_and_skips_a_duplicate(queue, "tasklock.etcd.lock")


def test_rq_dedupe_enqueue_markers_live_on_etcd(
    queue: Queue, etcd: EtcdServer, redis_server: RedisServer
) -> None:
    scenarios.rq_markers_live_on_the_store(queue, redis_server, lambda key: etcd_has(etcd, key))
