"""A singleton task with RabbitMQ as the broker and the test's redis-server for locks and results.

The suite starts its own RabbitMQ node (``tests/support/brokers.py``; skipped, naming the install
line, only where RabbitMQ is not installed).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from tasklock.celery import DUPLICATE, singleton_task
from tasklock.errors import ConfigurationError
from tests.integration.celery.support import in_process_worker
from tests.support.polling import eventually
from tests.support.servers import RedisServer

#: An AMQP URL that is never connected to (the error names it, with the password hidden).
RABBITMQ = "amqp://guest:guest@localhost:5672//"

pytestmark = [pytest.mark.rabbitmq]

QUEUE = f"tasklock-test-{uuid.uuid4().hex[:12]}"
app = Celery("tl_rabbitmq", broker=RABBITMQ, set_as_current=False)
entered, finish = threading.Event(), threading.Event()


@singleton_task(app=app, name="rmq.settle", key=["account"], fencing=True)
def settle(account: int, hold: bool = False, fence_token: int | None = None) -> int | None:
    if hold:
        entered.set()
        assert finish.wait(30)
    return fence_token


@pytest.fixture(scope="module")
def worker(redis_server: RedisServer, rabbitmq_url: str) -> Iterator[Any]:
    app.conf.update(
        broker_url=rabbitmq_url,
        result_backend=redis_server.url,
        tasklock_url=redis_server.url,  # the broker is not Redis: the lock's Redis is explicit
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # With AMQP the worker's event loop may sleep 10 s between checks for shutdown; the
        # heartbeat timer wakes it every second, so the module's teardown is quick.
        broker_heartbeat=2,
    )
    try:
        with in_process_worker(app, without_heartbeat=False) as running:
            yield running
    finally:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_delete(QUEUE)


def test_singleton_task_with_a_rabbitmq_broker(worker: Any) -> None:
    first = settle.delay(1)
    assert isinstance(first.get(timeout=30), int)
    holder = settle.delay(1, hold=True)
    assert entered.wait(30)
    try:
        twin = settle.delay(1)
        eventually(lambda: twin.state == DUPLICATE, timeout=30)
    finally:
        finish.set()
    assert holder.get(timeout=30) > first.get()
    assert twin.info["holder"]


def test_an_amqp_broker_does_not_serve_as_the_lock_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TASKLOCK_URL", raising=False)
    bare = Celery("tl_rabbitmq_bare", broker=RABBITMQ, set_as_current=False)

    @singleton_task(app=bare, shared=False)
    def orphan(x: int) -> int:
        return x

    with pytest.raises(ConfigurationError, match=r"amqp://guest:\*\*@localhost"):
        orphan(1)
