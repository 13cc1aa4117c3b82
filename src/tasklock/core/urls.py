"""Redis URLs, checked part by part where they are given.

URL forms (``s`` after ``redis`` means TLS; user and password are optional, percent-encoded)::

    redis://[[user]:password@]host[:port][/db][?option=value&...]    one server (redis-py's form)
    rediss://...                                                      one server over TLS
    unix://[[user]:password@]/path/to/redis.sock[?db=N&...]           one server on a Unix socket
    redis+cluster://[[user]:password@]host[:port][,host[:port]...][?options]
                                                  Redis Cluster, from these startup nodes
    rediss+cluster://...                          the same over TLS
    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db][?options]
                                                  the master Sentinel names for ``service_name``
    rediss+sentinel://...                         the same over TLS (to the sentinels and master)

The cluster and sentinel forms follow the ``limits`` library's. Ports default to 6379 (26379 for
sentinels). Query options are redis-py connection options (``socket_timeout``, ``client_name``,
``ssl_cert_reqs``, ...). In a sentinel URL the user and password are the master's, as in
redis-py's ``Sentinel(..., password=...)``; sentinels that require their own credentials take
``sentinel_username=`` / ``sentinel_password=`` in the query.

:func:`validate_url` checks every part when an option is set (decoration, construction, Django
checks), so a bad port or database fails at import time with a :class:`ConfigurationError`
naming the option and the part, never later as a bare ``ValueError`` from urllib in a worker.
"""

from __future__ import annotations

import codecs
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

import redis.connection as redis_connection
import redis.exceptions as redis_errors

from tasklock.errors import ConfigurationError

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_SENTINEL_PORT",
    "RedisURL",
    "parse_redis_url",
    "redacted",
    "validate_url",
    "without_query_option",
]

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379

#: scheme -> (kind, TLS)
_SCHEMES: dict[str, tuple[str, bool]] = {
    "redis": ("server", False),
    "rediss": ("server", True),
    "unix": ("server", False),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}
_HOST = re.compile(r"[A-Za-z0-9._~%-]+")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(%[A-Za-z0-9._~-]+)?")
_UNEXPECTED_KEYWORD = re.compile(r"unexpected keyword argument '(\w+)'")
#: Query values that mean "off" to a person and "on" to redis-py where it has no parser.
_OFF = ("false", "0", "no", "off", "n", "f")
#: Query options a sentinel URL takes for the sentinels themselves (the rest go to the master).
_SENTINEL_QUERY = {"sentinel_username": "username", "sentinel_password": "password"}
#: Query options that are a number of seconds and must be > 0: redis-py takes -1 only to fail
#: every command with a bare ValueError, and 0 as a non-blocking socket that fails every command.
_SECONDS_QUERY = ("socket_timeout", "socket_connect_timeout")


# --- URLs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedisURL:
    """What a Redis URL asks for, every part checked.

    ``kind`` is ``"server"`` (redis://, rediss://, unix://), ``"cluster"`` or ``"sentinel"``.
    ``nodes`` are (host, port) pairs: the server (empty for a Unix socket), the cluster's startup
    nodes, or the sentinels. ``options`` are the connection options for the server(s) that hold
    the locks (credentials and query options); ``sentinel_options`` the sentinels' own.
    """

    url: str
    kind: str
    tls: bool
    nodes: tuple[tuple[str, int], ...]
    service: str | None = None
    db: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)
    sentinel_options: Mapping[str, Any] = field(default_factory=dict)


class _Bad(Exception):
    """One wrong part of a URL; :func:`parse_redis_url` adds the option and the URL."""


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``, for messages that may reach logs."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, at, hosts = rest[:end].rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{hosts}{rest[end:]}"


def parse_redis_url(url: object, option: str = "url", *, etcd_too: bool = False) -> RedisURL:
    """Parse and check ``url``; a ConfigurationError names ``option``, the URL and the bad part.
    ``etcd_too``: where ``option`` takes the other backends' URLs as well (etcd, ZooKeeper), the
    error says so."""
    what = "a Redis, etcd or ZooKeeper URL" if etcd_too else "a Redis URL"
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"{option} must be {what} string, got {url!r}")
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in _SCHEMES:
        etcd = (
            ", or etcd:// / etcds:// for etcd (etcd://h1:2379,h2:2379), or zookeeper:// for "
            "ZooKeeper (zookeeper://zk1:2181,zk2:2181/tasklock)"
            if etcd_too
            else ""
        )
        raise ConfigurationError(
            f"{option}={redacted(url)!r} is not {what}: it must start with redis://, "
            f"rediss://, unix://, redis+cluster:// or redis+sentinel:// (for example "
            f"redis://localhost:6379/0){etcd}"
        )
    kind, tls = _SCHEMES[scheme]
    try:
        if kind == "server":
            return _parse_server(url, scheme, tls)
        return _parse_deployment(url, kind, tls)
    except _Bad as exc:
        raise ConfigurationError(f"{option}={redacted(url)!r} {exc}") from None


def without_query_option(url: str, name: str) -> str:
    """``url`` with the query option ``name`` left out (the rest as written)."""
    base, sep, query = url.partition("?")
    if not sep:
        return url
    fragment = ""
    if "#" in query:
        query, fragment = query.split("#", 1)
        fragment = "#" + fragment
    kept = [part for part in query.split("&") if part.split("=", 1)[0] != name]
    return base + (("?" + "&".join(kept)) if kept else "") + fragment


def validate_url(
    url: object, option: str = "url", *, single_server: bool = False, etcd_too: bool = False
) -> str:
    """Return ``url`` if it is a Redis URL tasklock can use; else a ConfigurationError naming
    ``option``, the URL (password hidden) and the part that is wrong.

    ``single_server``: only redis://, rediss:// and unix:// URLs, as Redlock needs (its masters
    must be independent and must not fail over). ``etcd_too``: ``option`` takes etcd URLs too
    (checked elsewhere), and the error says so.
    """
    parsed = parse_redis_url(url, option, etcd_too=etcd_too)
    if single_server and parsed.kind != "server":
        raise ConfigurationError(
            f"{option}={redacted(parsed.url)!r} is a Redis {parsed.kind.title()} URL, but "
            "Redlock needs independent single masters without failover: a master promoted by a "
            "failover may not have had the lock yet, and a cluster is one deployment, not "
            "independent masters. List one redis://, rediss:// or unix:// URL per master"
        )
    return parsed.url


def _split_netloc(url: str) -> tuple[str, str, str, str]:
    """(userinfo, hosts, path, query) by hand: urllib cannot split ``host1:1,host2:2``."""
    rest = url.partition("://")[2]
    rest, _, _fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    return userinfo, hosts, slash + path, query


def _credentials(userinfo: str) -> dict[str, str]:
    user, _, password = userinfo.partition(":")
    found = {}
    if user:
        found["username"] = unquote(user)
    if password:
        found["password"] = unquote(password)
    return found


def _port(text: str, default: int) -> int:
    if not text:
        return default
    if not (text.isascii() and text.isdigit()):
        raise _Bad(f"has port {text!r}: a port is a number from 1 to 65535")
    port = int(text)
    if not 1 <= port <= 65535:
        raise _Bad(f"has port {port}: a port is a number from 1 to 65535")
    return port


def _host_port(item: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``[ipv6]`` or ``[ipv6]:port``; an empty host is returned empty."""
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket or not _IPV6.fullmatch(host) or (rest and not rest.startswith(":")):
            raise _Bad(f"has host {item!r}: write an IPv6 address in brackets, as [::1]:6379")
        return host, _port(rest[1:], default_port)
    host, _, port_text = item.partition(":")
    if ":" in port_text:
        raise _Bad(f"has host {item!r}: write an IPv6 address in brackets, as [::1]:6379")
    if host and not _HOST.fullmatch(host):
        raise _Bad(
            f"has host {host!r}: a host name has only letters, digits, '-', '.' and '_' (an IPv6 "
            "address goes in brackets: [::1])"
        )
    return host, _port(port_text, default_port)


def _database(text: str, where: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise _Bad(f"has database {text!r} {where}: a database is a number, 0 or more")
    return int(text)


def _parse_server(url: str, scheme: str, tls: bool) -> RedisURL:
    """redis://, rediss://, unix://: checked here, then by redis-py's own parser and connection
    class, so that nothing redis-py would refuse later gets through."""
    _, hosts, path, query = _split_netloc(url)
    nodes: tuple[tuple[str, int], ...] = ()
    if scheme == "unix":
        if not unquote(path).strip("/"):
            raise _Bad("has no socket path: write unix:///path/to/redis.sock[?db=N]")
    else:
        host, port = _host_port(hosts, DEFAULT_PORT)
        nodes = ((host or "localhost", port),)
        text = unquote(path).removeprefix("/")
        if text and not (text.isascii() and text.isdigit()):
            raise _Bad(
                f"has database {path!r} in its path: the path is the database number, /0 or more "
                "(or nothing, for 0)"
            )
    _query_options(query)  # its own messages, before redis-py's
    try:
        kwargs: dict[str, Any] = redis_connection.parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise _Bad(f"is refused by redis-py: {exc}") from None
    connection_class = kwargs.pop("connection_class", redis_connection.Connection)
    db = kwargs.get("db", 0)
    if not isinstance(db, int) or db < 0:
        raise _Bad(f"has database {db!r}: a database is a number, 0 or more")
    _check_connection_options(kwargs, connection_class)
    options = {k: v for k, v in kwargs.items() if k not in ("host", "port", "db", "path")}
    return RedisURL(url, "server", tls, nodes, db=db, options=options)


def _parse_deployment(url: str, kind: str, tls: bool) -> RedisURL:
    """redis+cluster:// and redis+sentinel:// (and their TLS forms)."""
    userinfo, hosts, path, query = _split_netloc(url)
    default_port = DEFAULT_SENTINEL_PORT if kind == "sentinel" else DEFAULT_PORT
    what = "sentinels" if kind == "sentinel" else "startup nodes"
    if not hosts:
        raise _Bad(f"names no host: list the {what} as host:port[,host:port...]")
    nodes = []
    for item in hosts.split(","):
        host, port = _host_port(item, default_port)
        if not host:
            raise _Bad(f"has an empty host in its list of {what} ({hosts!r})")
        nodes.append((host, port))
    options = {**_credentials(userinfo), **_query_options(query)}
    sentinel_options = {
        _SENTINEL_QUERY[name]: options.pop(name)
        for name in list(options)
        if name in _SENTINEL_QUERY
    }
    service: str | None = None
    if kind == "sentinel":
        service, db = _sentinel_path(unquote(path))
        db = options.pop("db", db)
        if db < 0:
            raise _Bad(f"has database {db}: a database is a number, 0 or more")
    else:
        db = _cluster_path(unquote(path), options.pop("db", 0))
        _check_cluster_options(options)
    connection_class = redis_connection.SSLConnection if tls else redis_connection.Connection
    _check_connection_options(options, connection_class)
    return RedisURL(url, kind, tls, tuple(nodes), service, db, options, sentinel_options)


def _check_cluster_options(options: Mapping[str, Any]) -> None:
    """RedisCluster passes only the options it knows to its nodes and drops the rest silently."""
    from redis.cluster import REDIS_ALLOWED_KEYS

    for name in options:
        if name not in REDIS_ALLOWED_KEYS:
            raise _Bad(
                f"has unknown option {name!r} in its query: redis-py's RedisCluster would drop it "
                "without a word (it passes on options such as socket_timeout, client_name and "
                "ssl_cert_reqs)"
            )


def _sentinel_path(path: str) -> tuple[str, int]:
    parts = path.strip("/").split("/") if path.strip("/") else []
    if not parts:
        raise _Bad(
            "names no service name: write redis+sentinel://host:port[,...]/service_name[/db]"
        )
    if len(parts) > 2:
        raise _Bad(f"has path {path!r}: a sentinel URL's path is /service_name or /service_name/db")
    db = _database(parts[1], "after the service name") if len(parts) == 2 else 0
    return parts[0], db


def _cluster_path(path: str, db: Any) -> int:
    if path.strip("/") not in ("", "0") or db != 0:
        raise _Bad(
            f"has database {path or db!r}: Redis Cluster has only database 0, so a cluster URL "
            "names no database"
        )
    return 0


def _query_options(query: str) -> dict[str, Any]:
    """Query options converted as redis-py converts them in its own URLs."""
    parsers: Mapping[str, Callable[[str], Any]] = getattr(
        redis_connection, "URL_QUERY_ARGUMENT_PARSERS", {}
    )
    options: dict[str, Any] = {}
    for name, values in parse_qs(query).items():
        value = values[0]
        if name == "decode_responses" and value.strip().lower() in _OFF:
            # redis-py has no parser for it and passes the text on, which is true: the URL
            # would turn on what it names as off (and `tasklock ls` would meet keys that are not
            # UTF-8 as a UnicodeDecodeError).
            raise _Bad(
                f"has decode_responses={value!r} in its query, which redis-py takes as on (it "
                "passes the text, and any text is true): leave the option out to keep replies "
                "as bytes"
            )
        parser = parsers.get(name)
        if parser is None or name in _SENTINEL_QUERY:
            options[name] = value
        else:
            try:
                options[name] = parser(value)
            except (TypeError, ValueError):
                raise _Bad(f"has an invalid value for {name!r} in its query: {value!r}") from None
        problem = _query_value_problem(name, options[name])
        if problem:
            raise _Bad(f"has {name}={value!r} in its query: {problem}")
    return options


def _query_value_problem(name: str, value: Any) -> str | None:
    """What redis-py would accept here and fail on at the first command (or the server refuse
    on every connection), or None."""
    if name in _SECONDS_QUERY and not (isinstance(value, int | float) and 0 < value < math.inf):
        return "it must be a number of seconds > 0 (leave it out for tasklock's default)"
    if name == "max_connections" and not (isinstance(value, int) and value >= 1):
        return "it must be a whole number >= 1"
    if name == "client_name" and not all("!" <= char <= "~" for char in str(value)):
        return "Redis refuses client names with spaces, newlines or characters outside ASCII"
    if name == "encoding":
        try:
            codecs.lookup(str(value))
        except LookupError:
            return "Python knows no such encoding (e.g. utf-8)"
    return None


def _check_connection_options(options: Mapping[str, Any], connection_class: Any) -> None:
    """Make (without connecting) the connection redis-py would make: it refuses unknown options
    and bad values only when the first command runs, which is too late."""
    kwargs = {k: v for k, v in options.items() if k != "max_connections"}
    try:
        connection_class(**kwargs)
    except TypeError as exc:
        match = _UNEXPECTED_KEYWORD.search(str(exc))
        name = match.group(1) if match else "?"
        raise _Bad(
            f"has unknown option {name!r} in its query: redis-py connections take options such as "
            "socket_timeout, socket_connect_timeout, client_name, health_check_interval and "
            "ssl_cert_reqs"
        ) from None
    except (ValueError, redis_errors.RedisError) as exc:
        bad = next((n for n in options if n in str(exc)), None)
        named = f" for {bad!r}" if bad else ""
        raise _Bad(f"has an invalid value{named} in its query: {exc}") from None
