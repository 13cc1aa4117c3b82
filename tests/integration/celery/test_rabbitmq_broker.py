"""A singleton task with RabbitMQ as the broker and the test's redis-server for locks and results.

Needs a RabbitMQ on localhost:5672 (guest/guest); skipped, saying so, when nothing answers there.
The queue has a unique name and is deleted afterwards, so a shared RabbitMQ is left as it was.
"""

from __future__ import annotations

import socket
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

RABBITMQ = "amqp://guest:guest@localhost:5672//"


def _rabbitmq_answers() -> bool:
    try:
        with socket.create_connection(("localhost", 5672), timeout=1):
            return True
    except OSError:
        return False


pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.skipif(
        not _rabbitmq_answers(), reason="no RabbitMQ answers on localhost:5672 (amqp broker test)"
    ),
]

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
def worker(redis_server: RedisServer) -> Iterator[Any]:
    app.conf.update(
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
