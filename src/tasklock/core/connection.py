"""Clients made from Redis URLs (see :mod:`tasklock.core.urls`), and redis-py errors mapped at the
boundary.

Every call the core makes to Redis goes through :class:`backend_errors`, so a user never has to
catch redis-py's exception zoo. It maps by exception class, because redis-py strips the reply's
code word from the classes it knows (``OutOfMemoryError``, ``ReadOnlyError``, ...), and falls
back to the code word for replies it leaves as a plain ``ResponseError`` (``MISCONF``, ``BUSY``)
and for refusals inside a script on Redis < 7 ("Error running script ... -OOM ...").
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, cast

import redis
import redis.connection as redis_connection
import redis.exceptions as redis_errors

from tasklock.core.scripts import ACL_RULES
from tasklock.core.urls import RedisURL, parse_redis_url, redacted, validate_url
from tasklock.errors import BackendRefused, BackendUnavailable, TaskLockError

__all__ = [
    "RedisURL",
    "backend_errors",
    "client_for_url",
    "describe_client",
    "map_backend_error",
    "parse_redis_url",
    "redacted",
    "validate_url",
]

# Short enough that a dead server is noticed well within a 30 s TTL, long enough for a busy one.
DEFAULT_SOCKET_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0

_clients: dict[tuple[int, str, float, float], Any] = {}
_clients_lock = threading.Lock()


# --- clients ------------------------------------------------------------------------------------


def client_for_url(
    url: str,
    *,
    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
) -> redis.Redis:
    """One client (and so one connection pool) per URL and timeouts per process, created on
    first use. Redlock asks for timeouts equal to its per-node deadline.

    A redis+cluster:// URL gives a ``redis.cluster.RedisCluster`` (typed as ``redis.Redis``, whose
    commands it has, so callers need not widen their types); it connects to the cluster here,
    since redis-py reads the slot map when it is made, and a cluster that does not answer is
    :class:`BackendUnavailable`. A redis+sentinel:// URL gives the service's master client, which
    reaches nothing until its first command.
    """
    if not isinstance(url, str):
        parse_redis_url(url)  # raises the ConfigurationError that names it
    key = (os.getpid(), url, float(socket_timeout), float(connect_timeout))
    client = _clients.get(key)  # the hot path: a guard asks for its client on every run
    if client is not None:
        return cast(redis.Redis, client)
    parsed = parse_redis_url(url)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = _make_client(parsed, socket_timeout, connect_timeout)
        return cast(redis.Redis, client)


def _make_client(parsed: RedisURL, socket_timeout: float, connect_timeout: float) -> Any:
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": connect_timeout}
    if parsed.kind == "cluster":
        return _cluster_client(parsed, timeouts)
    if parsed.kind == "sentinel":
        return _sentinel_client(parsed, timeouts)
    return redis.Redis.from_url(parsed.url, **timeouts, health_check_interval=30)


def _cluster_client(parsed: RedisURL, timeouts: dict[str, float]) -> Any:
    from redis.cluster import ClusterNode, RedisCluster

    try:
        nodes = [ClusterNode(host, port) for host, port in parsed.nodes]  # type: ignore[no-untyped-call]
        return RedisCluster(
            startup_nodes=nodes,
            ssl=parsed.tls,
            **{**timeouts, **parsed.options},
        )
    except (redis_errors.RedisClusterException, redis_errors.RedisError, OSError) as exc:
        raise BackendUnavailable(
            f"Redis Cluster at {redacted(parsed.url)} did not answer: {exc}. Check that the "
            "startup nodes in the URL are running cluster nodes reachable from this host"
        ) from exc


def _sentinel_client(parsed: RedisURL, timeouts: dict[str, float]) -> Any:
    """The master of ``parsed.service``; Sentinel is asked for its address on each connect,
    so a failover is followed. Nothing is reached here."""
    from redis.sentinel import Sentinel

    tls = {"ssl": True} if parsed.tls else {}
    # The sentinels speak TLS when the master does, with the same certificate settings.
    ssl_options = {k: v for k, v in parsed.options.items() if k.startswith("ssl_")}
    sentinel_kwargs = {**timeouts, **tls, **ssl_options, **parsed.sentinel_options}
    sentinel = Sentinel(list(parsed.nodes), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    return sentinel.master_for(  # type: ignore[no-untyped-call]
        parsed.service,
        db=parsed.db,
        health_check_interval=30,
        **{**timeouts, **tls, **parsed.options},
    )


def _address(kwargs: Mapping[str, Any]) -> str:
    host = str(kwargs.get("host", "localhost"))
    return (
        f"[{host}]:{kwargs.get('port', 6379)}"
        if ":" in host
        else f"{host}:{kwargs.get('port', 6379)}"
    )


def describe_client(client: Any) -> str:
    """A short "where" for messages, in the URL forms above, never with a password."""
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:  # redis.cluster.RedisCluster
        nodes = ",".join(_address({"host": n.host, "port": n.port}) for n in _startup(manager))
        tls = bool(getattr(manager, "connection_kwargs", {}).get("ssl"))
        return f"{'rediss' if tls else 'redis'}+cluster://{nodes}"
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {}) or {}
    tls = _uses_tls(pool)
    scheme = "rediss" if tls else "redis"
    sentinel_manager = getattr(pool, "sentinel_manager", None)
    if sentinel_manager is not None:  # a master from redis.sentinel.Sentinel.master_for
        sentinels = ",".join(
            _address(s.connection_pool.connection_kwargs) for s in sentinel_manager.sentinels
        )
        return f"{scheme}+sentinel://{sentinels}/{pool.service_name}/{kwargs.get('db', 0)}"  # type: ignore[union-attr]
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    return f"{scheme}://{_address(kwargs)}/{kwargs.get('db', 0)}"


def _startup(manager: Any) -> list[Any]:
    nodes = getattr(manager, "startup_nodes", None) or {}
    return list(nodes.values()) if isinstance(nodes, Mapping) else list(nodes)


def _uses_tls(pool: Any) -> bool:
    connection_class = getattr(pool, "connection_class", None)
    return isinstance(connection_class, type) and issubclass(
        connection_class, redis_connection.SSLConnection
    )


# --- errors -------------------------------------------------------------------------------------

#: What each refusal means and what to check, by the reply's code word: the server is there but
#: cannot take lock writes now. :class:`BackendUnavailable`, so ``on_backend_error="run"`` and
#: Celery's ``acks_late`` hand-back apply, as when it does not answer at all.
_UNAVAILABLE: dict[str, str] = {
    "OOM": (
        "it is out of memory (used memory is over maxmemory and its maxmemory-policy may evict "
        "nothing). Free memory or raise maxmemory; keep noeviction on a lock Redis, since a "
        "policy that evicts keys with a TTL would evict held locks"
    ),
    "READONLY": (
        "it is a read-only replica. Point the URL at the master (after a failover, the new "
        "master), or use a redis+sentinel:// URL, which follows failovers"
    ),
    "MISCONF": (
        "it stopped accepting writes because its last RDB snapshot failed "
        "(stop-writes-on-bgsave-error). Check its disk space, directory permissions and log"
    ),
    "LOADING": "it is loading its dataset into memory after a start. Retry once it has loaded",
    "MASTERDOWN": (
        "it is a replica that lost its link to the master (replica-serve-stale-data no). Point "
        "the URL at the master, and check the master and the replication link"
    ),
    "CLUSTERDOWN": "the cluster is down (some hash slots are not served). Check CLUSTER INFO",
    "TRYAGAIN": "the cluster is moving the lock's hash slot between nodes. Retry shortly",
    "BUSY": (
        "it is busy running a long script or function (busy-reply-threshold). Wait, or end it "
        "with SCRIPT KILL / FUNCTION KILL"
    ),
    "NOREPLICAS": (
        "it has fewer good replicas than its min-replicas-to-write setting. Check its replicas"
    ),
}
#: redis-py classes for replies whose code word it strips (subclasses before their bases).
_CLASS_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (redis_errors.OutOfMemoryError, "OOM"),
    (redis_errors.ReadOnlyError, "READONLY"),
    (redis_errors.BusyLoadingError, "LOADING"),
    (redis_errors.MasterDownError, "MASTERDOWN"),
    (redis_errors.ClusterDownError, "CLUSTERDOWN"),
    (redis_errors.TryAgainError, "TRYAGAIN"),
    (redis_errors.NoPermissionError, "NOPERM"),
)
#: Redis < 7 wraps an error raised inside a script: "Error running script (call to f_...):
#: @user_script:11: @user_script: 11: -OOM command not allowed ...".
_SCRIPT_ERROR = re.compile(r"^Error running script .*?: -([A-Z]+) (.*)$", re.DOTALL)
#: A command a script calls that the user's ACL refuses is a plain ERR reply: "The user executing
#: the script can't run this command" (Redis 6.2, 7.0), "ACL failure in script: User w has no
#: permissions to run the 'incr' command" (Redis 7.2+, Valkey).
_SCRIPT_NOPERM = ("The user executing the script can't", "ACL failure in script")
_NO_DATABASE = ("DB index is out of range", "invalid DB index")
_LOCK_KEYS_PLACEHOLDER = "~<your lock names> ~{<your lock names>}:*"


def _code_and_reply(exc: BaseException) -> tuple[str | None, str]:
    """The reply's code word, by class where redis-py stripped it, and the reply as Redis sent
    it (code word first)."""
    text = str(exc)
    for cls, code in _CLASS_CODES:
        if isinstance(exc, cls):
            return code, f"{code} {text}"
    if not isinstance(exc, redis_errors.ResponseError):
        return None, text
    wrapped = _SCRIPT_ERROR.match(text)
    if wrapped:
        return wrapped.group(1), f"{wrapped.group(1)} {wrapped.group(2)}"
    for phrase in _SCRIPT_NOPERM:
        refused = text.find(phrase)
        if refused >= 0:
            return "NOPERM", text[refused:]
    word = text.split(" ", 1)[0]
    return (word if word.isupper() else None), text


def _user(client: Any) -> str:
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    return str(kwargs.get("username") or "default")


def _refused_permission(where: str, doing: str, user: str, reply: str, keys: Sequence[str]) -> str:
    grant = ACL_RULES  # the one rule, as doctor and the README give it
    if keys:
        grant = grant.replace(_LOCK_KEYS_PLACEHOLDER, " ".join(f"~{key}" for key in keys))
    return (
        f"Redis at {where} refused ACL user {user!r} while {doing}: {reply.rstrip('.')}. tasklock "
        "runs Lua scripts (EVALSHA, SCRIPT LOAD; Redis checks the commands they call too), reads "
        "its locks and publishes and subscribes on its wake-up channels, on its own keys and "
        "channels. Grant them with: "
        f"ACL SETUSER {user} {grant} (~tasklock:* covers task locks under the default "
        "key_prefix; a tasklock.Lock uses its name, and {name}:fence, {name}:queue and "
        "{name}:waiters beside it)"
    )


def _refused_credentials(where: str, doing: str, client: Any, reply: str) -> str:
    """The server answered and said no: say that (not "did not answer"), and whether the client
    sent a password at all, since "Authentication required" means it sent none."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if not kwargs.get("password") and not kwargs.get("credential_provider"):
        return (
            f"Redis at {where} requires a password, and the URL gives none (while {doing}): "
            f"{reply.rstrip('.')}. Put it in the URL (redis://:password@host:port/db, or "
            "redis://user:password@host:port/db for an ACL user) or pass the client's "
            "username=/password="
        )
    return (
        f"Redis at {where} refused the credentials of user {_user(client)!r} (authentication "
        f"failed) while {doing}: {reply.rstrip('.')}. Check the user name and password in the "
        "URL (redis://user:password@host:port/db) or the client's username=/password=, and that "
        "the ACL user exists and is enabled (ACL LIST on the server)"
    )


def _no_database(where: str, doing: str, client: Any) -> str:
    pool = getattr(client, "connection_pool", None)
    db = (getattr(pool, "connection_kwargs", None) or {}).get("db", "?")
    return (
        f"Redis at {where} has no database {db} (while {doing}): the database index is out of "
        "range. A server has as many databases as its `databases` setting (16 unless changed), "
        "numbered from 0: use a lower database number in the URL (e.g. /0), or raise `databases` "
        "in the server's configuration"
    )


#: What a failed TLS verification says (OpenSSL's reason, in redis-py's ConnectionError text).
_TLS_UNTRUSTED = "CERTIFICATE_VERIFY_FAILED"


def map_backend_error(
    exc: BaseException, client: Any, doing: str, keys: Sequence[str] = ()
) -> Exception | None:
    """The tasklock error for a redis-py error raised while ``doing``; None to let it through.

    * the server cannot take lock writes now (out of memory, read-only replica, failed snapshot,
      loading, ...), or does not answer: :class:`BackendUnavailable`;
    * a wrong password, an ACL user without a command or key tasklock needs, a database the server
      does not have, a server certificate the client does not trust: :class:`BackendRefused`, a
      :class:`ConfigurationError`. These are settings to fix, not outages: retrying
      (``acks_late``) would loop until someone fixes them, and ``on_backend_error="run"`` must
      not run every task unlocked because of a typo.
    """
    where = describe_client(client)
    if isinstance(
        exc, redis_errors.AuthenticationError | redis_errors.AuthenticationWrongNumberOfArgsError
    ):
        return BackendRefused(_refused_credentials(where, doing, client, str(exc)))
    code, reply = _code_and_reply(exc)
    if code == "NOPERM":
        return BackendRefused(_refused_permission(where, doing, _user(client), reply, keys))
    if code in _UNAVAILABLE:
        return BackendUnavailable(
            f"Redis at {where} refused a write while {doing}: {_UNAVAILABLE[code]}. (Redis said: "
            f"{reply})"
        )
    if isinstance(exc, redis_errors.ConnectionError) and _TLS_UNTRUSTED in str(exc):
        return BackendRefused(
            f"Redis at {where} presented a TLS certificate this client does not trust while "
            f"{doing}: {str(exc).rstrip('. ')}. Give the CA that signed the server's certificate "
            "(?ssl_ca_certs=/path/to/ca.pem in the URL, or ssl_ca_certs= on the client), and "
            "check that the host name matches the certificate"
        )
    if isinstance(exc, redis_errors.ConnectionError | redis_errors.TimeoutError):
        return BackendUnavailable(
            f"Redis at {where} did not answer while {doing}: {str(exc).rstrip('. ')}. Check that "
            "redis-server is running and reachable from this host, and that the URL, port and TLS "
            "settings are right."
        )
    if isinstance(exc, redis_errors.ResponseError) and str(exc).startswith(_NO_DATABASE):
        return BackendRefused(_no_database(where, doing, client))
    return None


class backend_errors:  # named as the function it replaced: ``with backend_errors(...)``
    """Map redis-py errors raised inside the block (see :func:`map_backend_error`).

    ``keys``, when given, are the keys the block touches, named in the ACL hint of a NOPERM.
    ``subject``, when given, is named after ``doing`` (``"acquiring lock" 'name'``): the text is
    only put together when an error passes, which a lock made per call would otherwise pay for
    on every use. A class rather than a generator context manager: it wraps every lock call, and
    this costs a fraction of what ``@contextmanager`` does on the hot path (``__exit__`` does
    work only when an exception passes).
    """

    __slots__ = ("client", "doing", "keys", "subject")

    def __init__(
        self, client: Any, doing: str, keys: Sequence[str] = (), subject: str | None = None
    ) -> None:
        self.client = client
        self.doing = doing
        self.keys = keys
        self.subject = subject

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None or isinstance(exc, TaskLockError):
            return  # no error, or already mapped (nested blocks)
        doing = self.doing if self.subject is None else f"{self.doing} {self.subject!r}"
        mapped = map_backend_error(exc, self.client, doing, self.keys)
        if mapped is not None:
            raise mapped from exc
