"""1,000 deduplicated enqueues, counted on the server: no connection per call, one script per
claim, under RESP2 and RESP3 alike.

redis-py 8 speaks RESP3 unless told otherwise. The hot path's own connections (the lanes) once
spoke whatever the client's pool spoke and parsed only RESP2, so under RESP3 the claim's ``nil``
(``_``) was taken for a broken connection: the lane hung up, the claim was sent again through the
pool (a second run of a script that had already run), and the next call opened a new connection.
The server's own counters are the witness here: ``total_connections_received`` and the slow log
(every command, with its arguments, at a threshold of 0 us).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from rq import Queue

from tasklock.celery import singleton_task
from tasklock.compat.celery_once import QueueOnce
from tasklock.compat.celery_singleton import Singleton
from tasklock.core.redis_backend import RedisMarkers
from tasklock.core.scripts import CLAIM
from tasklock.guard import reset_all
from tests.integration.celery.support import configure
from tests.integration.rq import jobs
from tests.support.servers import RedisServer

CALLS = 1000


@pytest.fixture
def counted(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """An admin client (RESP2) to the module's server, emptied, with every command logged."""
    admin = redis_server.client(protocol=2)
    admin.flushall()
    admin.config_set("slowlog-log-slower-than", 0)
    admin.config_set("slowlog-max-len", 20 * CALLS)
    admin.slowlog_reset()
    yield admin
    admin.config_set("slowlog-log-slower-than", 10000)
    admin.slowlog_reset()
    admin.close()
    reset_all()


def connections_received(admin: redis.Redis) -> int:
    return int(admin.info("stats")["total_connections_received"])


def claims_run(admin: redis.Redis) -> int:
    """The CLAIM scripts the server ran (EVALSHA of its SHA, from any client)."""
    entries = admin.slowlog_get(20 * CALLS)
    sha = CLAIM.sha.encode()
    return sum(
        1
        for entry in entries
        if len(entry["command"].split()) > 1
        and entry["command"].split()[0].upper() == b"EVALSHA"
        and entry["command"].split()[1] == sha
    )


def broker(url: str) -> str:
    """The broker's URL (kombu takes no ``protocol``: only tasklock's clients are counted)."""
    return url.partition("?")[0]


def celery_enqueuer(url: str) -> Callable[[int], Any]:
    app = configure(Celery(f"enqueue{id(object())}", set_as_current=False), broker(url))

    @singleton_task(app=app, shared=False, key=["n"], dedupe_enqueue=True, url=url)
    def settle(n: int) -> None: ...

    return settle.delay


def celery_once_enqueuer(url: str) -> Callable[[int], Any]:
    app = configure(Celery(f"once{id(object())}", set_as_current=False), broker(url))
    app.conf.ONCE = {"backend": "celery_once.backends.Redis", "settings": {"url": url}}

    @app.task(name=f"once{id(app)}", base=QueueOnce, shared=False)
    def settle(n: int) -> None: ...

    return settle.delay


def celery_singleton_enqueuer(url: str) -> Callable[[int], Any]:
    app = configure(Celery(f"single{id(object())}", set_as_current=False), broker(url))
    app.conf.singleton_backend_url = url

    @app.task(name=f"single{id(app)}", base=Singleton, shared=False)
    def settle(n: int) -> None: ...

    return settle.delay


def rq_enqueuer(url: str) -> Callable[[int], Any]:
    queue = Queue("enqueue-connections", connection=redis.Redis.from_url(url))
    return lambda n: jobs.deduped.enqueue(queue, f"call-{n}")


@pytest.mark.parametrize("protocol", ["2", "3", "default"])
@pytest.mark.parametrize(
    "enqueuer",
    [celery_enqueuer, celery_once_enqueuer, celery_singleton_enqueuer, rq_enqueuer],
    ids=["dedupe_enqueue", "celery_once", "celery_singleton", "rq"],
)
def test_deduplicated_enqueues_share_connections_and_run_one_claim_each(
    counted: redis.Redis,
    redis_server: RedisServer,
    protocol: str,
    enqueuer: Callable[[str], Callable[[int], Any]],
) -> None:
    # "default": no protocol in the URL, as most users write it (RESP3 from redis-py 8 on).
    query = "" if protocol == "default" else f"?protocol={protocol}"
    enqueue = enqueuer(f"{redis_server.url}{query}")
    enqueue(-1)  # the clients' pools and the lanes' first connections are made
    counted.slowlog_reset()
    before = connections_received(counted)
    for n in range(CALLS):
        enqueue(n)
    opened = connections_received(counted) - before
    claims = claims_run(counted)
    assert opened <= 10, f"{CALLS} enqueues opened {opened} connections (protocol {protocol})"
    assert claims == CALLS, f"{CALLS} enqueues ran the claim {claims} times (protocol {protocol})"


def test_a_marker_is_renewed_in_one_round_trip(
    counted: redis.Redis, redis_server: RedisServer, resp: int
) -> None:
    """A run of the drop-ins renews its marker as it starts (and a queued ``until_start`` run
    while it waits): one script, which gives a marker that is ours a full TTL from now (it was a
    claim and then a PEXPIRE: two round trips per run)."""
    markers = RedisMarkers(redis_server.client())
    assert markers.claim("tasklock:{t}:pending:1", "run-1", 1000, "claiming") is None
    counted.slowlog_reset()
    assert markers.renew("tasklock:{t}:pending:1", "run-1", 600_000, "renewing") is None
    entries = [e for e in counted.slowlog_get(100) if not e["command"].startswith(b"SLOWLOG")]
    # A script's own commands are logged without a client address.
    sent = [e["command"].split()[0] for e in entries if e["client_address"] != b"?:0"]
    inside = [e["command"].split()[0] for e in entries if e["client_address"] == b"?:0"]
    assert sent == [b"EVALSHA"], f"the renewal sent {sent}"
    assert b"PEXPIRE" in inside, inside
    assert counted.pttl("tasklock:{t}:pending:1") > 1000
    # Another's marker is neither renewed nor taken.
    assert markers.renew("tasklock:{t}:pending:1", "run-2", 600_000, "renewing") == "run-1"
