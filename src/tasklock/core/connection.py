"""Clients from URLs, and redis-py errors mapped to :class:`BackendUnavailable` at the boundary.

Every call the core makes to Redis goes through :func:`backend_errors`, so a user never has to
catch redis-py's exception zoo to learn that "Redis is not there": they get one error that names
the server and says what to check, with the original chained as ``__cause__``.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.exceptions as redis_errors

from tasklock.errors import BackendUnavailable, ConfigurationError

__all__ = ["backend_errors", "client_for_url", "describe_client", "validate_url"]

# Short enough that a dead server is noticed well within a 30 s TTL, long enough for a busy one.
DEFAULT_SOCKET_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0
_SCHEMES = ("redis", "rediss", "unix")
# Server replies that mean "this server cannot take lock writes now", not "you made a mistake".
_UNAVAILABLE_REPLIES = ("READONLY", "OOM", "MISCONF", "LOADING", "MASTERDOWN", "CLUSTERDOWN")

_clients: dict[tuple[int, str, float, float], redis.Redis] = {}
_clients_lock = threading.Lock()


def validate_url(url: object, option: str = "url") -> str:
    """Return ``url`` if it is a Redis URL redis-py accepts; else a ConfigurationError naming it."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"{option} must be a Redis URL string, got {url!r}")
    scheme = urlsplit(url).scheme
    if scheme not in _SCHEMES:
        raise ConfigurationError(
            f"{option}={url!r} is not a Redis URL: it must start with redis://, rediss:// or "
            "unix:// (for example redis://localhost:6379/0)"
        )
    return url


def client_for_url(
    url: str,
    *,
    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
) -> redis.Redis:
    """One client (and so one connection pool) per URL and timeouts per process, created on
    first use. Redlock asks for timeouts equal to its per-node deadline."""
    validate_url(url)
    key = (os.getpid(), url, float(socket_timeout), float(connect_timeout))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = redis.Redis.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=connect_timeout,
                health_check_interval=30,
            )
            _clients[key] = client
        return client


def describe_client(client: Any) -> str:
    """A short "where" for messages: ``redis://host:port/db`` or the socket path."""
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {}) or {}
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    host = kwargs.get("host", "localhost")
    port = kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{kwargs.get('db', 0)}"


class backend_errors:  # named as the function it replaced: ``with backend_errors(...)``
    """Map redis-py's connection-level errors raised inside the block to BackendUnavailable.

    A class rather than a generator context manager: it wraps every lock call, and this costs a
    fraction of what ``@contextmanager`` does on the hot path.
    """

    __slots__ = ("client", "doing")

    def __init__(self, client: Any, doing: str) -> None:
        self.client = client
        self.doing = doing

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        if isinstance(exc, BackendUnavailable):
            return  # already mapped (nested blocks)
        if isinstance(exc, redis_errors.ConnectionError | redis_errors.TimeoutError):
            detail = str(exc).rstrip(". ")
            raise BackendUnavailable(
                f"Redis at {describe_client(self.client)} did not answer while {self.doing}: "
                f"{detail}. Check that redis-server is running and reachable from this host, and "
                "that the URL, port, password and TLS settings are right."
            ) from exc
        if isinstance(exc, redis_errors.ResponseError) and (
            str(exc).split(" ", 1)[0] in _UNAVAILABLE_REPLIES
        ):
            raise BackendUnavailable(
                f"Redis at {describe_client(self.client)} refused a lock write while "
                f"{self.doing}: {exc}. Check that it is a writable master with free memory "
                "(maxmemory) and working persistence."
            ) from exc
