"""Bad input fails where it is given, as a ConfigurationError or KeyEncodingError that names it.

A URL, a timeout, a lock name or a task argument that cannot work must not get through
decoration or construction and then fail at run time with a bare ``ValueError`` from urllib,
a ``ResponseError`` from Redis or a ``UnicodeDecodeError``: by then it is 3 a.m. in a worker.
"""

from __future__ import annotations

import decimal
from typing import Any

import pytest
import redis
import redis.sentinel

from tasklock import Lock, Redlock
from tasklock.config import check_options
from tasklock.core import connection
from tasklock.errors import BackendUnavailable, ConfigurationError, KeyEncodingError
from tasklock.guard import Guard
from tasklock.signature import CallKey, canonical_json
from tests.support.servers import free_port


def settle(account_id: Any, day: str = "today") -> None: ...


BAD_URLS = [
    # (url, what the message must name)
    ("redis://:badport", "port 'badport'"),
    ("redis://localhost:70000/0", "port 70000"),
    ("redis://localhost:0/0", "port 0"),
    ("redis://localhost:6379/abc", "database '/abc'"),
    ("redis://localhost:6379/-1", "database '/-1'"),
    ("redis://localhost:6379/0/1", "database '/0/1'"),
    ("redis://localhost:6379?db=x", "'db'"),
    ("redis://localhost:6379/0?socket_timeout=abc", "'socket_timeout'"),
    ("redis://localhost:6379/0?bogus=1", "unknown option 'bogus'"),
    ("redis://localhost:6379/0?timeout=3", "unknown option 'timeout'"),
    ("redis://localhost:6379/0?protocol=4", "'protocol'"),
    ("redis://localhost:6379/0?decode_responses=false", "redis-py takes as on"),
    ("redis+cluster://a:7000?decode_responses=0", "redis-py takes as on"),
    ("redis://local host:6379/0", "host 'local host'"),
    ("unix://", "socket path"),
    ("unix:///tmp/redis.sock?db=x", "'db'"),
    ("http://localhost:6379/0", "is not a Redis URL"),
    ("redis://localhost:6379/0?socket_timeout=-1", "socket_timeout='-1' in its query: it must be"),
    ("redis://localhost:6379/0?socket_timeout=0", "socket_timeout='0' in its query: it must be"),
    ("redis://localhost:6379/0?socket_connect_timeout=-5", "socket_connect_timeout='-5'"),
    ("redis://localhost:6379/0?socket_timeout=inf", "socket_timeout='inf'"),
    ("redis+cluster://a:7000?socket_timeout=-1", "socket_timeout='-1'"),
    ("redis://localhost:6379/0?max_connections=-1", "max_connections='-1' in its query"),
    ("redis://localhost:6379/0?client_name=a%20b", "client_name='a b' in its query: Redis refuses"),
    ("redis://localhost:6379/0?encoding=nope", "encoding='nope' in its query"),
    ("redis+cluster://", "names no host"),
    ("redis+cluster://a:7000,b:badport", "port 'badport'"),
    ("redis+cluster://a:7000,,b:7001", "empty host"),
    ("redis+cluster://a:7000/3", "database"),
    ("redis+cluster://a:7000?bogus=1", "unknown option 'bogus'"),
    ("redis+sentinel://s1:26379", "service name"),
    ("redis+sentinel://s1:26379,s2:99999/mymaster", "port 99999"),
    ("redis+sentinel://s1:26379/mymaster/x", "database 'x'"),
    ("redis+sentinel://s1:26379/mymaster/0/extra", "path '/mymaster/0/extra'"),
    ("redis+sentinel://s1:26379/mymaster?bogus=1", "unknown option 'bogus'"),
]


@pytest.mark.parametrize(("url", "fragment"), BAD_URLS)
def test_a_bad_url_is_refused_naming_the_option_the_url_and_the_part(
    url: str, fragment: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        connection.validate_url(url, "url")
    message = str(info.value)
    assert message.startswith("url=")
    assert fragment in message
    assert type(info.value) is ConfigurationError  # not a ValueError from urllib or redis-py


def test_a_password_never_appears_in_the_message() -> None:
    with pytest.raises(ConfigurationError) as info:
        connection.validate_url("redis://user:hunter2@localhost:70000/0")
    assert "hunter2" not in str(info.value)
    assert "user:***@localhost:70000" in str(info.value)


@pytest.mark.parametrize("url", [u for u, _ in BAD_URLS[:6]])
def test_task_options_refuse_a_bad_url_at_decoration(url: str) -> None:
    with pytest.raises(ConfigurationError, match="url="):
        Guard(settle, "app.settle", {"url": url})


def test_django_check_reports_the_same_problem_as_e006() -> None:
    problems = check_options({"url": "redis://:badport"}, "TASKLOCK")
    assert [(p.option, p.code) for p in problems] == [("url", "E006")]
    assert "port 'badport'" in problems[0].message
    problems = check_options({"urls": ["redis://a:1/0", "redis://b:70000/0", "redis://c:1/0"]})
    assert [(p.option, p.code) for p in problems] == [("urls", "E006")]
    assert "urls[1]=" in problems[0].message
    assert "port 70000" in problems[0].message


def test_redlock_needs_single_servers_not_clusters_or_sentinels() -> None:
    problems = check_options(
        {"urls": ["redis://a:1/0", "redis+sentinel://s:26379/mymaster", "redis://c:1/0"]}
    )
    assert [(p.option, p.code) for p in problems] == [("urls", "E006")]
    assert "urls[1]=" in problems[0].message
    assert "failover" in problems[0].message


def test_redlock_refuses_a_bad_url_at_construction() -> None:
    with pytest.raises(ConfigurationError, match=r"clients\[1\]=.*port 'badport'"):
        Redlock(["redis://127.0.0.1:1/0", "redis://:badport", "redis://127.0.0.1:2/0"], "x")


GOOD_URLS = [
    # (url, kind, tls, nodes, service, db)
    ("redis://localhost", "server", False, (("localhost", 6379),), None, 0),
    ("redis://", "server", False, (("localhost", 6379),), None, 0),
    ("redis://h:6380/2", "server", False, (("h", 6380),), None, 2),
    ("redis://h:6380?db=3", "server", False, (("h", 6380),), None, 3),
    ("rediss://u:p@h:6380/0?ssl_cert_reqs=none", "server", True, (("h", 6380),), None, 0),
    ("redis://[::1]:6379/1", "server", False, (("::1", 6379),), None, 1),
    ("unix:///tmp/redis.sock?db=4", "server", False, (), None, 4),
    ("redis+cluster://a:7000,b:7001", "cluster", False, (("a", 7000), ("b", 7001)), None, 0),
    ("rediss+cluster://u:p@a?client_name=x", "cluster", True, (("a", 6379),), None, 0),
    ("redis+cluster://[::1]:7000/", "cluster", False, (("::1", 7000),), None, 0),
    (
        "redis+sentinel://s1:26379,s2:26380/mymaster",
        "sentinel",
        False,
        (("s1", 26379), ("s2", 26380)),
        "mymaster",
        0,
    ),
    ("rediss+sentinel://:pw@s1/mymaster/2", "sentinel", True, (("s1", 26379),), "mymaster", 2),
]


@pytest.mark.parametrize(("url", "kind", "tls", "nodes", "service", "db"), GOOD_URLS)
def test_good_urls_parse_into_what_they_ask_for(
    url: str, kind: str, tls: bool, nodes: tuple[Any, ...], service: str | None, db: int
) -> None:
    assert connection.validate_url(url) == url
    parsed = connection.parse_redis_url(url)
    assert (parsed.kind, parsed.tls, parsed.nodes, parsed.service, parsed.db) == (
        kind,
        tls,
        nodes,
        service,
        db,
    )


def test_url_credentials_and_query_options_become_connection_options() -> None:
    parsed = connection.parse_redis_url("redis+cluster://al%40ice:s%3Acret@a:7000?client_name=w1")
    assert parsed.options == {"username": "al@ice", "password": "s:cret", "client_name": "w1"}
    parsed = connection.parse_redis_url(
        "redis+sentinel://:master-pw@s1:26379/mymaster?sentinel_password=sentinel-pw"
    )
    assert parsed.options == {"password": "master-pw"}
    assert parsed.sentinel_options == {"password": "sentinel-pw"}


def test_a_sentinel_url_builds_a_master_client_of_that_service() -> None:
    url = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/mymaster/2"
    client = connection.client_for_url(url)  # Sentinel connects lazily: nothing is reached yet
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert pool.connection_kwargs["db"] == 2
    sentinels = pool.sentinel_manager.sentinels
    assert len(sentinels) == 2
    assert sentinels[0].connection_pool.connection_kwargs["socket_timeout"] == (
        connection.DEFAULT_SOCKET_TIMEOUT
    )
    assert connection.describe_client(client) == url
    assert connection.client_for_url(url) is client


def test_an_unreachable_cluster_is_backend_unavailable_naming_the_url() -> None:
    url = f"redis+cluster://127.0.0.1:{free_port()}"
    with pytest.raises(BackendUnavailable, match=url.replace("+", r"\+")):
        connection.client_for_url(url)


@pytest.mark.parametrize("timeout", [10**20, 1e300, 366 * 86400])
def test_a_ttl_beyond_a_year_is_refused_at_construction(timeout: float) -> None:
    with pytest.raises(ConfigurationError, match=r"timeout must be at most 31536000 seconds"):
        Lock(redis.Redis(), "x", timeout=timeout)
    with pytest.raises(ConfigurationError, match=r"timeout must be at most 31536000 seconds"):
        Redlock(["redis://127.0.0.1:1/0"], "x", timeout=timeout)
    Lock(redis.Redis(), "x", timeout=365 * 86400)  # a year is fine


@pytest.mark.parametrize("option", ["ttl", "pending_ttl"])
def test_task_ttls_beyond_a_year_are_refused(option: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"{option} must be at most 31536000 seconds"):
        Guard(settle, "app.settle", {option: 10**20})


def test_a_lock_name_that_is_not_utf8_is_refused_naming_name() -> None:
    with pytest.raises(ConfigurationError, match=r"name must be text.*UTF-8"):
        Lock(redis.Redis(), b"\xff\xfeinvoice")
    assert Lock(redis.Redis(), "façade".encode()).name == "façade"


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), -float("inf"), decimal.Decimal("NaN"), decimal.Decimal("-Inf")],
)
def test_nan_and_infinity_are_named_as_such_not_as_a_type(value: Any) -> None:
    key = CallKey(settle, "app.settle")
    with pytest.raises(KeyEncodingError) as info:
        key.digest((value,), {})
    message = str(info.value)
    assert "argument 'account_id'" in message
    assert "NaN and infinity cannot be part of a call key" in message
    assert "type float" not in message
    assert "type Decimal" not in message


def test_nan_inside_a_structure_or_a_key_callable_is_named_by_its_path() -> None:
    key = CallKey(settle, "app.settle")
    with pytest.raises(
        KeyEncodingError, match=r"argument 'account_id'\[1\] is nan \(a float\): NaN"
    ):
        key.digest(([1, float("nan")],), {})
    with pytest.raises(
        KeyEncodingError, match=r"a dict key in argument 'account_id' is inf \(a float\)"
    ):
        key.digest(({float("inf"): 1},), {})
    by_callable = CallKey(settle, "app.settle", key=lambda account_id, day="": account_id)
    with pytest.raises(KeyEncodingError, match=r"the value returned by key\(\) is nan \(a float\)"):
        by_callable.digest((float("nan"),), {})
    with pytest.raises(KeyEncodingError, match=r"value is inf \(a float\): NaN and infinity"):
        canonical_json(float("inf"))


# Replies the integration tests cannot make a real server give on demand (a long script, a
# cluster migrating a slot, a replica without its master): the table that maps them, exercised
# with the exceptions redis-py builds from those replies. OOM, READONLY, MISCONF, NOPERM, a wrong
# password and a missing database are tested against real servers in test_error_mapping.py.
UNAVAILABLE_REPLIES = [
    (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), "loading"),
    (redis.exceptions.MasterDownError("Link with MASTER is down"), "lost its link to the master"),
    (redis.exceptions.ClusterDownError("The cluster is down"), "the cluster is down"),
    (redis.exceptions.TryAgainError("Multiple keys request during rehashing"), "moving"),
    (redis.exceptions.ResponseError("BUSY Redis is busy running a script."), "SCRIPT KILL"),
    (redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas"), "min-replicas"),
]


@pytest.mark.parametrize(("error", "fragment"), UNAVAILABLE_REPLIES)
def test_a_server_that_cannot_take_writes_now_is_backend_unavailable(
    error: Exception, fragment: str
) -> None:
    client = redis.Redis(host="10.0.0.7", port=6380, db=2)
    with pytest.raises(BackendUnavailable) as info, connection.backend_errors(client, "doing x"):
        raise error
    message = str(info.value)
    assert message.startswith("Redis at redis://10.0.0.7:6380/2 refused a write while doing x: ")
    assert fragment in message
    assert info.value.__cause__ is error
