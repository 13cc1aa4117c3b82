"""The connection to a ZooKeeper ensemble: a ``zookeeper://`` URL parsed, a kazoo session opened
with clear errors, and every request bounded in time.

* :func:`parse_url`: ``zookeeper://h1:2181,h2:2181/chroot?session_timeout=10`` (``zk://`` too;
  the port defaults to 2181, the chroot to none, the session timeout to 10 s).
* :class:`Client`: one kazoo session per URL per process (:func:`client_for`), opened on first
  use and again in a forked child (a child must not share its parent's socket or session). The
  chroot is checked when the session opens (a chroot that does not exist is a
  :class:`~tasklock.ConfigurationError` naming it, not a ``NoNodeError`` later), and so is the
  session timeout the servers agreed to (a timeout outside the servers' bounds, which ZooKeeper
  would silently clamp, is a ConfigurationError naming both).
* :meth:`Client.call`: a request with a deadline (kazoo queues requests while it reconnects, and
  would wait forever for an ensemble that lost its majority): no answer in time, or the
  connection lost, is :class:`~tasklock.BackendUnavailable` naming the ensemble; no kazoo
  traceback reaches the caller.
* Kazoo's issue #732 (a create whose answer was lost leaves a node nobody knows of): a create
  that failed that way is remembered (:meth:`Client.forget_later`), and the node is looked up by
  the attempt's marker in its name and deleted as soon as the session is back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from tasklock.core.backend_hooks import PerUrl
from tasklock.errors import BackendUnavailable, ConfigurationError

try:
    from kazoo.client import KazooClient, KazooState
    from kazoo.exceptions import (
        BadVersionError,
        ConnectionClosedError,
        ConnectionLoss,
        NodeExistsError,
        NoNodeError,
        NotEmptyError,
        OperationTimeoutError,
        SessionExpiredError,
        ZookeeperError,
    )
    from kazoo.handlers.threading import KazooTimeoutError
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("tasklock.zookeeper needs kazoo: pip install 'tasklock[zookeeper]'") from exc

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_SESSION_TIMEOUT",
    "Client",
    "Target",
    "as_client",
    "client_for",
    "parse_url",
]

log = logging.getLogger("tasklock.zookeeper")

DEFAULT_PORT = 2181
#: Seconds a session outlives its last heartbeat: how long a dead holder's lock stays held.
DEFAULT_SESSION_TIMEOUT = 10.0
_SCHEMES = ("zookeeper://", "zk://")
#: Where one member's URL ends and the next one's begins, in ``urls=[...]`` joined by commas.
_MEMBER = re.compile(r"\s*,\s*(?=(?:zookeeper|zk)://)", re.IGNORECASE)
#: Directories a client remembers as left empty (the oldest forgotten first).
_ALONE_KEPT = 4096
_EXAMPLE = "zookeeper://zk1:2181,zk2:2181,zk3:2181/tasklock"
#: ZooKeeper's answers a caller judges itself (the node is gone, is there, has moved on).
_ANSWERS = (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError)
#: What kazoo raises when the ensemble does not answer.
_UNREACHABLE = (
    ConnectionLoss,
    ConnectionClosedError,
    SessionExpiredError,
    OperationTimeoutError,
    KazooTimeoutError,
)


@dataclass(frozen=True)
class Target:
    """A parsed ``zookeeper://`` URL."""

    hosts: tuple[str, ...]
    chroot: str
    session_timeout: float

    @property
    def where(self) -> str:
        return ",".join(self.hosts) + self.chroot


def _bad(url: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"{url!r} is not a usable ZooKeeper URL: {problem} (e.g. {_EXAMPLE})")


def parse_url(url: str) -> Target:
    """The hosts, chroot and session timeout of ``url``; a ConfigurationError saying what is
    wrong otherwise. Several ``zookeeper://`` URLs joined by commas (``urls=[...]`` listing the
    members) are one ensemble."""
    text = url.strip()
    lowered = text.lower()
    if not lowered.startswith(_SCHEMES):
        raise _bad(url, "it must start with zookeeper:// (or zk://)")
    members = _MEMBER.split(text)
    if len(members) > 1:  # urls=[...] joined: one URL per member, each with the scheme
        targets = [parse_url(member) for member in members]
        if len({(t.chroot, t.session_timeout) for t in targets}) > 1:
            raise _bad(url, "its members give different chroots or session timeouts")
        every = tuple(dict.fromkeys(host for t in targets for host in t.hosts))
        return Target(every, targets[0].chroot, targets[0].session_timeout)
    body = text.partition("://")[2]
    body, _, query = body.partition("?")
    hosts_part, slash, chroot = body.partition("/")
    hosts: list[str] = []
    for item in hosts_part.split(","):
        item = item.strip()
        if not item:
            continue
        host, colon, port = item.rpartition(":") if ":" in item else (item, "", "")
        if not host or (colon and not (port.isdigit() and 0 < int(port) < 65536)):
            raise _bad(url, f"{item!r} is not host:port")
        hosts.append(f"{host}:{port or DEFAULT_PORT}")
    if not hosts:
        raise _bad(url, "it names no server")
    chroot = "/" + chroot.strip("/") if slash and chroot.strip("/") else ""
    if any(part in ("", ".", "..") for part in chroot.split("/")[1:]):
        raise _bad(url, f"the chroot {chroot!r} is not a ZooKeeper path")
    session_timeout = DEFAULT_SESSION_TIMEOUT
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name != "session_timeout":
            raise _bad(url, f"unknown option {name!r} (the one option is session_timeout)")
        try:
            session_timeout = float(value)
        except ValueError:
            session_timeout = -1.0
        if not 0 < session_timeout <= 3600:
            raise _bad(url, f"session_timeout={value!r} must be seconds, above 0 (default 10)")
    return Target(tuple(dict.fromkeys(hosts)), chroot, session_timeout)


class Client:
    """One kazoo session on an ensemble, for every lock on one URL in this process."""

    def __init__(self, url: str, *, connect_timeout: float | None = None) -> None:
        self.url = url
        self.target = parse_url(url)
        self.session_timeout = self.target.session_timeout
        #: Seconds a request may wait for its answer (the session's own bound).
        self.request_timeout = max(1.0, self.session_timeout)
        self.connect_timeout = connect_timeout or max(2.0, self.session_timeout)
        self._lock = threading.Lock()
        self._kazoo: KazooClient | None = None
        self._pid = os.getpid()
        #: (directory, marker) of creates whose answer was lost: deleted once the session is back.
        self._orphans: set[tuple[str, str]] = set()
        #: Directories this client's last release left empty: the sequence expected next.
        self._alone: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<tasklock.zookeeper.Client {self.target.where}>"

    # -- the session -------------------------------------------------------------------------
    @property
    def kazoo(self) -> KazooClient:
        """The started kazoo client (opened on first use, and again in a forked child)."""
        kazoo, pid = self._kazoo, os.getpid()
        if kazoo is None or self._pid != pid:
            with self._lock:
                if self._kazoo is None or self._pid != pid:
                    self._kazoo = self._open()
                    self._pid = pid
                kazoo = self._kazoo
        return kazoo

    def _open(self) -> KazooClient:
        target = self.target
        kazoo = KazooClient(hosts=",".join(target.hosts), timeout=self.session_timeout)
        negotiated = _catch_negotiated(kazoo)
        try:
            kazoo.start(timeout=self.connect_timeout)
        except Exception as exc:
            kazoo.stop()
            kazoo.close()
            why = "" if isinstance(exc, KazooTimeoutError) else f" ({type(exc).__name__}: {exc})"
            raise BackendUnavailable(
                f"ZooKeeper ensemble {','.join(target.hosts)} unreachable: no server answered "
                f"within {self.connect_timeout:g} s{why} (check the hosts and ports in the URL, "
                "and that a majority of the ensemble is up)"
            ) from None
        try:
            self._check_session(kazoo, negotiated)
        except BaseException:
            kazoo.stop()
            kazoo.close()
            raise
        kazoo.add_listener(self._on_state)
        return kazoo

    def _check_session(self, kazoo: KazooClient, negotiated: list[float]) -> None:
        asked = self.session_timeout
        if negotiated and abs(negotiated[-1] - asked) > 0.001:
            given = negotiated[-1]
            bound = "minimum" if given > asked else "maximum"
            raise ConfigurationError(
                f"session_timeout={asked:g} s in {self.url!r} is outside the ZooKeeper servers' "
                f"bounds: they allow {given:g} s at the {bound} (minSessionTimeout and "
                "maxSessionTimeout, by default 2 and 20 ticks). Set session_timeout in that "
                "range, or change the servers' bounds"
            )
        chroot = self.target.chroot
        if chroot and kazoo.exists(chroot) is None:
            raise ConfigurationError(
                f"the chroot {chroot!r} in {self.url!r} does not exist on ZooKeeper: create it "
                f"(zkCli.sh create {chroot}) or drop it from the URL"
            )

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED and self._orphans:
            kazoo = self._kazoo
            if kazoo is not None:
                kazoo.handler.spawn(self._delete_orphans)

    def _delete_orphans(self) -> None:
        for directory, marker in list(self._orphans):
            try:
                self.delete_marked(directory, marker)
            except Exception as exc:  # (tried again at the next reconnect)
                log.debug("ZooKeeper: could not delete %s/*%s* yet: %s", directory, marker, exc)
            else:
                self._orphans.discard((directory, marker))

    def forget_later(self, directory: str, marker: str) -> None:
        """A create in ``directory`` whose node name holds ``marker`` may have been applied
        without its answer: delete that node now if possible, else once the session is back."""
        self._orphans.add((directory, marker))
        with contextlib.suppress(Exception):
            self.delete_marked(directory, marker)
            self._orphans.discard((directory, marker))

    def delete_marked(self, directory: str, marker: str) -> None:
        kazoo = self.kazoo
        try:
            children = kazoo.get_children_async(directory).get(timeout=self.request_timeout)
        except NoNodeError:
            return
        for child in children:
            if marker in child:
                with contextlib.suppress(NoNodeError):
                    kazoo.delete_async(f"{directory}/{child}").get(timeout=self.request_timeout)

    # -- what this client knows of a directory -----------------------------------------------
    def expect_alone(self, directory: str, sequence: int) -> None:
        """This client's last release in ``directory`` left it empty, and the next create there
        gets ``sequence`` if nothing else changes its children (a lock's uncontended cycle then
        needs no read: :meth:`tasklock.zookeeper.Lock._create`)."""
        if len(self._alone) >= _ALONE_KEPT:
            self._alone.pop(next(iter(self._alone)), None)
        self._alone[directory] = sequence

    def take_alone(self, directory: str) -> int | None:
        """The sequence :meth:`expect_alone` noted for ``directory`` (once), or None."""
        return self._alone.pop(directory, None)

    # -- requests ----------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        """An absolute path under the chroot."""
        return self.target.chroot + "/" + "/".join(parts)

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``kazoo.<method>_async(*args, **kwargs)``, answered within the request timeout; an
        unreachable ensemble is BackendUnavailable naming it and ``what``. ZooKeeper's other
        errors (NoNode, NodeExists, BadVersion) pass through for the caller to judge."""
        return self.answer(what, self.send(what, method, *args, **kwargs))

    def send(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Send ``kazoo.<method>_async(...)`` without waiting; :meth:`answer` waits for it.
        Requests sent back to back go in one round trip: ZooKeeper answers a session's requests
        in the order they were sent, a read after a write seeing that write, so a
        ``get_children`` sent right after a ``create`` lists the new node."""
        try:
            return getattr(self.kazoo, f"{method}_async")(*args, **kwargs)
        except _UNREACHABLE as exc:
            raise self.unreachable(what, exc) from exc

    def answer(self, what: str, request: Any) -> Any:
        """The answer to a request :meth:`send` sent, within the request timeout (as
        :meth:`call`). (Plain try/except, not a context manager: this is on every request.)"""
        try:
            return request.get(timeout=self.request_timeout)
        except _UNREACHABLE as exc:
            raise self.unreachable(what, exc) from exc
        except _ANSWERS:
            raise
        except ZookeeperError as exc:  # (NoAuth, AuthFailed, InvalidACL, ...): said, not raw
            raise BackendUnavailable(
                f"ZooKeeper ensemble {','.join(self.target.hosts)} refused {what}: "
                f"{type(exc).__name__} {exc}: check the ACLs and authentication of "
                f"{self.target.chroot or '/'}"
            ) from exc

    def unreachable(self, what: str, exc: BaseException) -> BackendUnavailable:
        """The error for a request that got no answer."""
        return BackendUnavailable(
            f"ZooKeeper ensemble {','.join(self.target.hosts)} unreachable while {what} "
            f"({type(exc).__name__}: {exc or 'no answer'}): check that a majority of the "
            "ensemble is up and reachable"
        )

    def close(self) -> None:
        with self._lock:
            kazoo, self._kazoo = self._kazoo, None
        if kazoo is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                kazoo.stop()
                kazoo.close()


def _catch_negotiated(kazoo: KazooClient) -> list[float]:
    """The session timeout each connection of ``kazoo`` agreed with a server, in seconds (kazoo
    does not keep it: it returns the connect timeout, the agreed timeout divided by the number
    of hosts). Empty where this kazoo's internals differ (then no check is made)."""
    agreed: list[float] = []
    connection = getattr(kazoo, "_connection", None)
    original = getattr(connection, "_connect", None)
    if original is None:
        return agreed
    hosts = len(kazoo.hosts)

    def connect(*args: Any, **kwargs: Any) -> Any:
        timeouts = original(*args, **kwargs)
        with contextlib.suppress(Exception):
            agreed.append(round(float(timeouts[1]) * hosts) / 1000)
        return timeouts

    connection._connect = connect  # type: ignore[union-attr]
    return agreed


_clients = PerUrl(Client)


def client_for(url: str) -> Client:
    """One :class:`Client` per URL per process (thread-safe; reopened in a forked child)."""
    return _clients(url)


def as_client(url_or_client: Any) -> Client:
    """A :class:`Client` as given, or the process's one for a URL."""
    if isinstance(url_or_client, Client):
        return url_or_client
    if isinstance(url_or_client, str):
        return client_for(url_or_client)
    raise ConfigurationError(
        "url_or_client must be a zookeeper:// URL "
        f"({_EXAMPLE!r}) or a tasklock.zookeeper.Client, got {type(url_or_client).__name__}"
    )
