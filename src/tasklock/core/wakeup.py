"""Wake waiters when a lock is released, instead of making them poll.

The release script PUBLISHes on the lock's wake channel. Each process keeps one listener per Redis
server: one pub/sub connection and one daemon thread, shared by every waiter in the process (a
connection per waiter would not scale to many blocked locks). A waiter subscribes *before* its
second acquire attempt, so a release that happens between a failed attempt and the wait is never
missed; jittered polling stays as the fallback for a lost connection or a holder that died.

A listener lives only while it has channels: once the last waiter's channel has lingered out, it
closes its connection and its thread ends; the next waiter starts it again. So a process that
waited once keeps no idle connection, and a listener whose server is gone for good stops retrying
as soon as nobody waits there any more.

Fork-safe: a child starts with no listeners and builds its own on demand (the parent's socket is
dropped, never closed, so the parent's connection survives).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from redis.exceptions import NoPermissionError

from tasklock.core.clock import clock
from tasklock.core.connection import describe_client
from tasklock.core.keys import wake_id
from tasklock.core.queue_scripts import NEXT_PREFIX
from tasklock.core.scripts import ACL_RULES

__all__ = [
    "LINGER",
    "PUBLISH_REFUSED",
    "SUBSCRIBE_CONFIRM_TIMEOUT",
    "Channel",
    "ChannelBook",
    "Subscription",
    "hub_for",
    "listener_client",
    "server_identity",
    "warn_wakeup_refused",
]

log = logging.getLogger("tasklock.wakeup")

# How long a waiter waits for the SUBSCRIBE confirmation before relying on polling alone.
SUBSCRIBE_CONFIRM_TIMEOUT = 1.0
# A channel whose last waiter left stays subscribed this long (1-2 s in practice: the listener
# sweeps once a second). The waiter that just got the lock does not pay for an UNSUBSCRIBE on its
# way out, and a new waiter on the same lock soon after needs no SUBSCRIBE round trip.
LINGER = 1.0


#: What the release scripts answer when the key was deleted but the PUBLISH was refused.
PUBLISH_REFUSED = 2

_warned: set[tuple[str, str]] = set()


def warn_wakeup_refused(where: str, what: str, error: object = None) -> None:
    """Log once per server and refused command that wake-ups cannot work there.

    A Redis ACL user without ``+publish`` / ``+subscribe`` on the wake channels
    (``&tasklock:wake:*``) still takes and releases locks correctly: waiters just notice a
    release by polling, up to their backoff (at most a second) later. That is worth one warning,
    not an error on every call.
    """
    if (where, what) in _warned:
        return
    _warned.add((where, what))
    detail = f" ({error})" if error else ""
    log.warning(
        "Redis at %s refused %s on tasklock's wake-up channels%s: locks still work, but waiters "
        "notice releases by polling (up to a second later). Grant the user the command and the "
        "channels: ACL SETUSER <user> %s",
        where,
        what,
        detail,
        ACL_RULES,
    )


class Channel:
    """One subscribed wake channel: its waiters' events, and whether SUBSCRIBE was confirmed.

    ``waiters`` wake on every message; ``targets`` (fair waiters, by owner token) wake only on
    a message naming them (``tasklock:next <token>``, see :mod:`tasklock.core.queue_scripts`)
    or on any other message (a release that names nobody: an unfair lock's, an older one's)."""

    __slots__ = ("confirmed", "idle_since", "targets", "waiters")

    def __init__(self, confirmed: Any) -> None:
        self.confirmed = confirmed  # a threading.Event or an asyncio.Event
        self.waiters: set[Any] = set()
        self.targets: dict[bytes, set[Any]] = {}
        self.idle_since: float | None = None  # when the last waiter left

    def empty(self) -> bool:
        return not self.waiters and not self.targets


class ChannelBook:
    """A listener's channels and their waiters, with no I/O: one copy of the rules for the thread
    listener here and the asyncio one (:mod:`tasklock.asyncio.wakeup`), which differ only in
    their events and in how they wait and talk to Redis. Not thread-safe by itself."""

    def __init__(self, new_event: Callable[[], Any]) -> None:
        self._new_event = new_event
        self.channels: dict[bytes, Channel] = {}
        self._idle = 0  # channels with no waiter, lingering
        self._swept = 0.0
        # A fair release names its waiter on the waiter's process channel, the lock's channel
        # plus this suffix (see tasklock.core.queue_scripts); a book is made per process (the
        # hubs are dropped at fork), so the wake id read here is this process's.
        self._own = ("@" + wake_id()).encode()

    def subscriptions(self, name: bytes) -> tuple[bytes, bytes]:
        """What to SUBSCRIBE (in this order, in one command) for a lock's wake channel: the
        channel itself (unfair releases, releases with nobody queued) and this process's
        channel of it (fair releases naming one of its waiters). The first confirmation implies
        both: the server runs the whole SUBSCRIBE before any other command."""
        return name, name + self._own

    def unsubscriptions(self, names: list[bytes]) -> list[bytes]:
        """What to UNSUBSCRIBE for the wake channels ``names`` (see :meth:`subscriptions`)."""
        return [each for name in names for each in self.subscriptions(name)]

    def join(self, name: bytes, event: Any, token: bytes | None = None) -> tuple[Channel, bool]:
        """Add a waiter (woken by name when ``token`` is given); the channel, and True when it
        is new (the caller SUBSCRIBEs)."""
        entry = self.channels.get(name)
        new = entry is None
        if entry is None:
            entry = self.channels[name] = Channel(self._new_event())
        if entry.idle_since is not None:
            entry.idle_since = None
            self._idle -= 1
        if token is None:
            entry.waiters.add(event)
        else:
            entry.targets.setdefault(token, set()).add(event)
        return entry, new

    def leave(self, name: bytes, event: Any, token: bytes | None = None) -> None:
        """Remove a waiter; a channel left with none lingers (see :meth:`stale`)."""
        entry = self.channels.get(name)
        if entry is None:
            return
        if token is None:
            entry.waiters.discard(event)
        else:
            events = entry.targets.get(token)
            if events is not None:
                events.discard(event)
                if not events:
                    del entry.targets[token]
        if entry.empty() and entry.idle_since is None:
            entry.idle_since = clock.monotonic()
            self._idle += 1

    def stale(self) -> list[bytes]:
        """Forget the channels that have had no waiter for LINGER seconds (checked at most twice
        per LINGER); the caller UNSUBSCRIBEs them, unless none is left (then it closes the
        connection, which drops them all at once)."""
        now = clock.monotonic()
        if not self._idle or now - self._swept < LINGER / 2:
            return []
        self._swept = now
        gone = [
            name
            for name, entry in self.channels.items()
            if entry.idle_since is not None and now - entry.idle_since >= LINGER
        ]
        for name in gone:
            del self.channels[name]
            self._idle -= 1
        return gone

    def confirm_all(self) -> None:
        """Stop waiting for confirmations (the connection failed: waiters poll meanwhile)."""
        for entry in self.channels.values():
            entry.confirmed.set()

    def dispatch(self, message: dict[str, Any]) -> None:
        """A pub/sub message: a SUBSCRIBE confirmed, or a release that wakes the waiters."""
        kind = message.get("type")
        channel = message.get("channel")
        if isinstance(channel, str):
            channel = channel.encode()
        found = self.channels.get(channel) if channel is not None else None
        if found is None and channel is not None and channel.endswith(self._own):
            if kind != "message":
                return  # the lock's channel's own confirmation counts for both
            found = self.channels.get(channel[: -len(self._own)])
        if found is None:
            return
        if kind == "subscribe":
            found.confirmed.set()
        elif kind == "message":
            data = message.get("data")
            if isinstance(data, str):
                data = data.encode()
            if isinstance(data, bytes) and data.startswith(NEXT_PREFIX):
                for target in found.targets.get(data[len(NEXT_PREFIX) :], ()):
                    target.set()
            else:
                for events in found.targets.values():
                    for target in events:
                        target.set()
            for waiter in found.waiters:
                waiter.set()


class WakeupHub:
    """One pub/sub connection and listener thread for one Redis server in this process."""

    def __init__(self, client: Any) -> None:
        self._where = describe_client(client)
        self._pubsub = listener_client(client).pubsub()
        self._book = ChannelBook(threading.Event)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(
        self, channel: str, event: threading.Event | None = None, token: str | None = None
    ) -> Subscription:
        """Register a waiter on ``channel``; returns once the subscription is confirmed (or the
        confirmation timed out, in which case the waiter still works by polling).

        ``event`` lets several subscriptions (one per Redlock node) share one event, so a waiter
        wakes on a release seen by any of them. ``token``: a fair waiter's owner token, woken
        only when the release names it.
        """
        name = channel.encode()
        key = token.encode() if token is not None else None
        if event is None:
            event = threading.Event()
        with self._lock:
            entry, new = self._book.join(name, event, key)
            if new:
                try:
                    self._pubsub.subscribe(*self._book.subscriptions(name))
                except Exception as exc:  # the waiter falls back to polling
                    log.debug("wake-up subscribe to %s failed: %s", channel, exc)
            self._ensure_thread()
        entry.confirmed.wait(SUBSCRIBE_CONFIRM_TIMEOUT)
        return Subscription(self, name, event, key)

    def live(self, channel: str) -> bool:
        """True when ``channel`` is subscribed here already (a waiter on it needs no SUBSCRIBE
        round trip, and no second try to catch a release made before it was subscribed)."""
        entry = self._book.channels.get(channel.encode())
        return entry is not None and entry.confirmed.is_set()

    def _forget(self, name: bytes, event: threading.Event, token: bytes | None) -> None:
        with self._lock:
            self._book.leave(name, event, token)

    def _sweep(self) -> None:
        """Unsubscribe channels that have had no waiter for LINGER seconds (listener thread)."""
        with self._lock:
            stale = self._book.stale()
            if stale and self._book.channels:
                try:
                    self._pubsub.unsubscribe(*self._book.unsubscriptions(stale))
                except Exception as exc:
                    log.debug("wake-up unsubscribe failed: %s", exc)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._listen, name="tasklock-wakeup", daemon=True
            )
            self._thread.start()

    def _listen(self) -> None:
        while True:
            try:
                message = self._pubsub.get_message(timeout=1.0)
            except Exception as exc:
                # Connection trouble: waiters keep polling; redis-py resubscribes on reconnect.
                # A refused SUBSCRIBE (ACL) is answered here too, and means polling for good.
                if isinstance(exc, NoPermissionError):
                    warn_wakeup_refused(self._where, "SUBSCRIBE", exc)
                else:
                    log.debug("wake-up listener error: %s", exc)
                with self._lock:
                    self._book.confirm_all()
                threading.Event().wait(0.2)
            else:
                if message:
                    with self._lock:
                        self._book.dispatch(message)
            self._sweep()
            if self._stop_if_unused():
                return

    def _stop_if_unused(self) -> bool:
        """With no channel left, close the connection and let the thread end (under the lock, so
        a waiter arriving now either finds the channel still here or starts a new thread)."""
        with self._lock:
            if self._book.channels:
                return False
            try:
                self._pubsub.reset()  # a later subscribe on it connects again
            except Exception as exc:
                log.debug("wake-up listener close failed: %s", exc)
            self._thread = None  # last: "no thread" means "closed", too
            return True


class Subscription:
    """A waiter's handle: :meth:`wait` returns early when the lock is released."""

    __slots__ = ("_event", "_hub", "_name", "_token")

    def __init__(
        self, hub: WakeupHub, name: bytes, event: threading.Event, token: bytes | None = None
    ) -> None:
        self._hub = hub
        self._name = name
        self._event = event
        self._token = token

    def arm(self) -> None:
        """Forget earlier wake-ups; call right before an acquire attempt."""
        self._event.clear()

    def wait(self, timeout: float) -> bool:
        return clock.wait(self._event, timeout)

    def close(self) -> None:
        self._hub._forget(self._name, self._event, self._token)


def listener_client(client: Any) -> Any:
    """A client for the listener on a connection pool of its own, with ``client``'s settings.

    The listener holds its connection for as long as anyone waits, and the first waiter's client
    may be closed meanwhile: ``Redis.close()`` disconnects every connection of its pool, in use
    or not. With the pool shared, that closed the listener's socket under its thread; over TLS
    the listener's SSL object went on reading the closed descriptor's number, which the next
    new connection had been given, and that connection's handshake failed ("wrong version
    number"). A pool of its own keeps the listener out of its users' way. A cluster client keeps
    its own: ClusterPubSub picks a node's connection as it goes (one hub per cluster client).
    """
    pool = getattr(client, "connection_pool", None)
    if getattr(client, "nodes_manager", None) is not None or pool is None:
        return client
    settings = dict(pool.connection_kwargs)
    settings.pop("connection_pool", None)  # a Sentinel pool's reference to itself
    settings["connection_class"] = pool.connection_class
    try:
        service = getattr(pool, "service_name", None)
        if service is not None:  # Sentinel-managed: follows the master, as the client does
            own = type(pool)(
                service,
                pool.sentinel_manager,
                is_master=pool.is_master,
                check_connection=pool.check_connection,
                **settings,
            )
        else:
            own = type(pool)(**settings)
        return type(client)(connection_pool=own)
    except Exception as exc:  # an unusual pool or client class: share the client's pool
        log.debug("wake-up listener shares %s's connection pool: %s", describe_client(client), exc)
        return client


_hubs: dict[tuple[Any, ...], WakeupHub] = {}
_hubs_lock = threading.Lock()


def server_identity(client: Any) -> tuple[Any, ...]:
    # Pub/sub is server-wide (not per database), so one hub serves every client of a server.
    if getattr(client, "nodes_manager", None) is not None:
        # Redis Cluster: a PUBLISH (also one in a script) reaches every node, so the hub's
        # ClusterPubSub may listen on any one. The cluster has no address of its own, and its
        # node list changes as the client discovers it: one hub per cluster client object.
        return ("cluster", id(client))
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    service = getattr(pool, "service_name", None)
    if service is not None:
        # Sentinel-managed (master_for): the pool has no host; it connects to whichever server
        # the sentinels name as master now (after a failover too), and so does the hub.
        sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", ())
        where = sorted(
            f"{s.connection_pool.connection_kwargs.get('host')}:"
            f"{s.connection_pool.connection_kwargs.get('port')}"
            for s in sentinels
        )
        return ("sentinel", service, *where, kwargs.get("username"))
    # The connection class too: a plain and a TLS server are not one server, even on one port.
    return (
        kwargs.get("path"),
        kwargs.get("host"),
        kwargs.get("port"),
        kwargs.get("username"),
        getattr(pool, "connection_class", None),
    )


#: The hub of each client object already asked for: a lock made per use asks once per object,
#: and working out the server's identity each time cost it more than this lookup.
_hub_of_client: weakref.WeakKeyDictionary[Any, WakeupHub] = weakref.WeakKeyDictionary()


def hub_for(client: Any) -> WakeupHub:
    try:
        return _hub_of_client[client]
    except (KeyError, TypeError):  # (TypeError: a client that cannot be weakly referenced)
        pass
    key = server_identity(client)
    with _hubs_lock:
        hub = _hubs.get(key)
        if hub is None:
            hub = _hubs[key] = WakeupHub(client)
    with contextlib.suppress(TypeError):
        _hub_of_client[client] = hub
    return hub


def _reset_after_fork() -> None:
    global _hubs_lock
    _hubs.clear()  # dropped, not closed: the sockets belong to the parent
    _hub_of_client.clear()
    _hubs_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
