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

import logging
import os
import threading
from typing import Any

from tasklock.core.clock import clock

__all__ = ["Subscription", "hub_for"]

log = logging.getLogger("tasklock.wakeup")

# How long a waiter waits for the SUBSCRIBE confirmation before relying on polling alone.
SUBSCRIBE_CONFIRM_TIMEOUT = 1.0
# A channel whose last waiter left stays subscribed this long (1-2 s in practice: the listener
# sweeps once a second). The waiter that just got the lock does not pay for an UNSUBSCRIBE on its
# way out, and a new waiter on the same lock soon after needs no SUBSCRIBE round trip.
LINGER = 1.0


class _Channel:
    __slots__ = ("confirmed", "idle_since", "waiters")

    def __init__(self) -> None:
        self.confirmed = threading.Event()
        self.waiters: set[threading.Event] = set()
        self.idle_since: float | None = None  # when the last waiter left


class WakeupHub:
    """One pub/sub connection and listener thread for one Redis server in this process."""

    def __init__(self, client: Any) -> None:
        self._pubsub = client.pubsub()
        self._channels: dict[bytes, _Channel] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._idle = 0  # channels with no waiter, lingering
        self._swept = 0.0

    def watch(self, channel: str, event: threading.Event | None = None) -> Subscription:
        """Register a waiter on ``channel``; returns once the subscription is confirmed (or the
        confirmation timed out, in which case the waiter still works by polling).

        ``event`` lets several subscriptions (one per Redlock node) share one event, so a waiter
        wakes on a release seen by any of them.
        """
        name = channel.encode()
        if event is None:
            event = threading.Event()
        with self._lock:
            entry = self._channels.get(name)
            new = entry is None
            if entry is None:
                entry = self._channels[name] = _Channel()
            if entry.idle_since is not None:
                entry.idle_since = None
                self._idle -= 1
            entry.waiters.add(event)
            if new:
                try:
                    self._pubsub.subscribe(name)
                except Exception as exc:  # the waiter falls back to polling
                    log.debug("wake-up subscribe to %s failed: %s", channel, exc)
            self._ensure_thread()
        entry.confirmed.wait(SUBSCRIBE_CONFIRM_TIMEOUT)
        return Subscription(self, name, event)

    def _forget(self, name: bytes, event: threading.Event) -> None:
        with self._lock:
            entry = self._channels.get(name)
            if entry is None:
                return
            entry.waiters.discard(event)
            if not entry.waiters and entry.idle_since is None:
                entry.idle_since = clock.monotonic()  # unsubscribed later, by _sweep
                self._idle += 1

    def _sweep(self) -> None:
        """Unsubscribe channels that have had no waiter for LINGER seconds (listener thread)."""
        now = clock.monotonic()
        if not self._idle or now - self._swept < LINGER / 2:
            return
        self._swept = now
        with self._lock:
            stale = [
                name
                for name, entry in self._channels.items()
                if entry.idle_since is not None and now - entry.idle_since >= LINGER
            ]
            for name in stale:
                del self._channels[name]
                self._idle -= 1
            # With none left the listener closes the connection, which drops them all at once.
            if stale and self._channels:
                try:
                    self._pubsub.unsubscribe(*stale)
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
                log.debug("wake-up listener error: %s", exc)
                with self._lock:
                    for entry in self._channels.values():
                        entry.confirmed.set()
                threading.Event().wait(0.2)
            else:
                if message:
                    self._dispatch(message)
            self._sweep()
            if self._stop_if_unused():
                return

    def _stop_if_unused(self) -> bool:
        """With no channel left, close the connection and let the thread end (under the lock, so
        a waiter arriving now either finds the channel still here or starts a new thread)."""
        with self._lock:
            if self._channels:
                return False
            self._thread = None
            try:
                self._pubsub.reset()  # a later subscribe on it connects again
            except Exception as exc:
                log.debug("wake-up listener close failed: %s", exc)
            return True

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = message.get("channel")
        if isinstance(channel, str):
            channel = channel.encode()
        with self._lock:
            found = self._channels.get(channel) if channel is not None else None
            if found is None:
                return
            if kind == "subscribe":
                found.confirmed.set()
            elif kind == "message":
                for waiter in found.waiters:
                    waiter.set()


class Subscription:
    """A waiter's handle: :meth:`wait` returns early when the lock is released."""

    __slots__ = ("_event", "_hub", "_name")

    def __init__(self, hub: WakeupHub, name: bytes, event: threading.Event) -> None:
        self._hub = hub
        self._name = name
        self._event = event

    def arm(self) -> None:
        """Forget earlier wake-ups; call right before an acquire attempt."""
        self._event.clear()

    def wait(self, timeout: float) -> bool:
        return clock.wait(self._event, timeout)

    def close(self) -> None:
        self._hub._forget(self._name, self._event)


_hubs: dict[tuple[Any, ...], WakeupHub] = {}
_hubs_lock = threading.Lock()


def _server_identity(client: Any) -> tuple[Any, ...]:
    # Pub/sub is server-wide (not per database), so one hub serves every client of a server.
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {}) or {}
    return (kwargs.get("path"), kwargs.get("host"), kwargs.get("port"), kwargs.get("username"))


def hub_for(client: Any) -> WakeupHub:
    key = _server_identity(client)
    with _hubs_lock:
        hub = _hubs.get(key)
        if hub is None:
            hub = _hubs[key] = WakeupHub(client)
        return hub


def _reset_after_fork() -> None:
    global _hubs_lock
    _hubs.clear()  # dropped, not closed: the sockets belong to the parent
    _hubs_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
