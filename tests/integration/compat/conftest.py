"""One redis-server and one ``celery worker --pool=prefork`` for every compat test module: the
worker app (:mod:`tests.integration.compat.compat_app`) is one object in this process, whose
broker connections must not outlive the server they point at."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.integration.celery.support import WorkerProcess
from tests.integration.compat import compat_app
from tests.support.servers import RedisServer


@pytest.fixture(scope="package")
def compat_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="package")
def worker(
    compat_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    app = compat_app.app
    url = compat_server.url
    app.conf.update(broker_url=url, result_backend=url, singleton_backend_url=url)
    app.conf.ONCE = {"backend": "celery_once.backends.Redis", "settings": {"url": url}}
    directory = tmp_path_factory.mktemp("compat")
    process = WorkerProcess(
        "tests.integration.compat.compat_app", {"TL_TEST_URL": url}, directory / "worker.log"
    )
    try:
        yield process.start(app)
    finally:
        process.stop()


@pytest.fixture
def rc(compat_server: RedisServer, worker: WorkerProcess) -> Iterator[redis.Redis]:
    client = compat_server.client()
    yield client
    client.close()
