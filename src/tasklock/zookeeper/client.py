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
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from tasklock.core.backend_hooks import PerUrl
from tasklock.core.pids import current_pid
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
    "KAZOO_CHECKED",
    "PRUNE_AFTER",
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
#: Seconds a lock directory this client used stays idle before it removes it (None: never).
PRUNE_AFTER = 30.0
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
        #: The session timeout the servers granted (seconds), once open; None if unknown.
        self.negotiated_timeout: float | None = None
        #: Directories this client's last release left empty: the sequence expected next, and
        #: the released node's czxid (see ``tasklock.zookeeper.lock._alone_since``).
        self._alone: dict[str, tuple[int, int]] = {}
        self._pruner = _Pruner(self.prune_directory, PRUNE_AFTER)

    def __repr__(self) -> str:
        return f"<tasklock.zookeeper.Client {self.target.where}>"

    # -- the session -------------------------------------------------------------------------
    @property
    def kazoo(self) -> KazooClient:
        """The started kazoo client (opened on first use, and again in a forked child)."""
        kazoo, pid = self._kazoo, current_pid()
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
        self.negotiated_timeout = negotiated[-1] if negotiated else None
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
    def expect_alone(self, directory: str, sequence: int, czxid: int) -> None:
        """This client's last release in ``directory`` (of a node created at ``czxid``) left it
        empty, and the next create there gets ``sequence`` if nothing else changes its
        children (a lock's uncontended cycle then needs no read:
        :meth:`tasklock.zookeeper.Lock._create`)."""
        if len(self._alone) >= _ALONE_KEPT:
            self._alone.pop(next(iter(self._alone)), None)
        self._alone[directory] = (sequence, czxid)

    def take_alone(self, directory: str) -> tuple[int, int] | None:
        """What :meth:`expect_alone` noted for ``directory`` (once), or None."""
        return self._alone.pop(directory, None)

    # -- cleanup -----------------------------------------------------------------------------
    @property
    def prune_after(self) -> float | None:
        """Seconds a lock directory this client used must stay idle before this client removes
        it (default :data:`PRUNE_AFTER`; None: never). Settable."""
        return self._pruner.after

    @prune_after.setter
    def prune_after(self, seconds: float | None) -> None:
        self._pruner.after = seconds

    def prune_later(self, directory: str) -> None:
        """``directory`` was used just now: remove it once idle for :attr:`prune_after` (off
        the hot path: a dict write here, the delete on the pruner's thread)."""
        self._pruner.later(directory)

    def prune_directory(self, directory: str) -> bool:
        """Remove ``directory`` if it is empty; whether it did. ZooKeeper deletes only an
        empty node, atomically: a contender's create either comes first (then this fails) or
        after (then it gets NoNode, and makes the directory again: ``Lock._create``)."""
        try:
            self.call(f"pruning {directory}", "delete", directory)
        except (NoNodeError, NotEmptyError):
            return False
        return True

    def wait_connected(self, timeout: float) -> bool:
        """Wait (up to ``timeout`` s) until the session is connected again, after kazoo fired
        the watches with a state event (connection lost, session expired): a waiter then tries
        again on a live session, not into the reconnect."""
        deadline = time.monotonic() + timeout
        while not self.kazoo.connected:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

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
        kazoo, pid = self._kazoo, current_pid()  # (the property's check, inlined: every request)
        if kazoo is None or self._pid != pid:
            kazoo = self.kazoo
        try:
            return getattr(kazoo, method + "_async")(*args, **kwargs)
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
        self._pruner.stop()
        with self._lock:
            kazoo, self._kazoo = self._kazoo, None
        if kazoo is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                kazoo.stop()
                kazoo.close()


class _Pruner:
    """Removes the directories a client used once they have been idle ``after`` seconds, on a
    thread of its own (started on first use, again in a forked child). A directory used again
    before then waits anew, so a busy name's directory stays (and its uncontended cycle keeps
    needing no read), and an idle one goes."""

    def __init__(self, prune: Any, after: float | None) -> None:
        self._prune = prune
        self.after = after
        self._pid = -1
        self._stopped = False

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._due: dict[str, float] = {}
        # (A plain lock, entered as itself on every release: no Condition methods to run.)
        self._mutex = threading.Lock()
        self._wake = threading.Condition(self._mutex)
        self._thread = threading.Thread(
            target=self._run, name="tasklock-zookeeper-prune", daemon=True
        )
        self._thread.start()

    def later(self, directory: str) -> None:
        after = self.after
        if after is None or self._stopped:
            return
        if self._pid != current_pid():
            self._reset()
        with self._mutex:
            # (Insertion order is due order: one delay for all.) A directory used again only
            # moves to the end: the thread wakes at its old due time and waits on, so a busy
            # name costs no thread wake-up per release.
            known = self._due.pop(directory, None) is not None
            self._due[directory] = time.monotonic() + after
            if not known and len(self._due) == 1:
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                directory, due = next(iter(self._due.items()))
                if due > time.monotonic():
                    self._wake.wait(due - time.monotonic())
                    continue
                del self._due[directory]
            try:
                self._prune(directory)
            except Exception as exc:  # (best effort: a later use schedules it again)
                log.debug("ZooKeeper: could not prune %s: %s", directory, exc)

    def stop(self) -> None:
        self._stopped = True
        if self._pid == os.getpid():
            with self._wake:
                self._wake.notify()


#: The kazoo releases :func:`_catch_negotiated` was checked against (``tests/integration/
#: zookeeper/test_lock.py`` checks the installed one on every run).
KAZOO_CHECKED = ((2, 8), (2, 11))


def _catch_negotiated(kazoo: KazooClient) -> list[float]:
    """The session timeout each connection of ``kazoo`` agreed with a server, in seconds.

    The one use of kazoo's private API in tasklock, kept here alone. ZooKeeper answers a
    connect with the session timeout it grants (clamped silently to its min/maxSessionTimeout);
    kazoo reads it in ``ConnectionHandler._connect`` and keeps only what it derives from it
    (that method returns the read timeout, 2/3 of it, and the connect timeout, the granted
    timeout divided by the number of hosts), and no public attribute or call of ``KazooClient``
    holds it (``_session_timeout`` stays the asked one; as of kazoo 2.11 and its main branch).
    The server-side way, the ``conf`` four-letter word, is off by default (ZooKeeper 3.5+
    allows only ``srvr``, which does not say it). So the step is wrapped to read the answer.

    Where this kazoo's internals differ (no ``_connection._connect``, or a result of another
    shape) the list stays empty: no check is made, and a warning names the kazoo version; the
    test of the check fails loudly then, so a kazoo upgrade that breaks it is seen."""
    agreed: list[float] = []
    connection = getattr(kazoo, "_connection", None)
    original = getattr(connection, "_connect", None)
    if original is None:
        _warn_unchecked()
        return agreed
    hosts = len(kazoo.hosts)

    def connect(*args: Any, **kwargs: Any) -> Any:
        timeouts = original(*args, **kwargs)
        try:
            agreed.append(round(float(timeouts[1]) * hosts) / 1000)
        except (TypeError, ValueError, IndexError):
            _warn_unchecked()
        return timeouts

    connection._connect = connect  # type: ignore[union-attr]
    return agreed


def _warn_unchecked() -> None:
    from kazoo.version import __version__

    log.warning(
        "tasklock.zookeeper: kazoo %s does not show the negotiated session timeout as the "
        "releases %s do: session_timeout is not checked against the servers' bounds",
        __version__,
        ", ".join(".".join(map(str, v)) for v in KAZOO_CHECKED),
    )


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
