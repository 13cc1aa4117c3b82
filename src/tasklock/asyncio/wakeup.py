"""Wake asyncio waiters when a lock is released: one pub/sub listener per server per event loop.

The same design as the thread listener (:mod:`tasklock.core.wakeup`, which explains it): the
release script PUBLISHes on the lock's wake channel; a waiter subscribes before its second
attempt, so a release between a failed attempt and the wait is never missed; polling with
jittered backoff stays the fallback. Here the listener is a task on the waiter's loop, on a
connection pool of its own (:func:`tasklock.core.wakeup.listener_client`), and it ends, closing
its connection, once no channel has had a waiter for LINGER seconds. Listeners are kept per loop
in a weak mapping, so a closed loop's listeners go with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from typing import Any

from redis.exceptions import NoPermissionError

from tasklock.core.connection import describe_client
from tasklock.core.wakeup import (
    SUBSCRIBE_CONFIRM_TIMEOUT,
    ChannelBook,
    listener_client,
    server_identity,
    warn_wakeup_refused,
)

__all__ = ["AsyncSubscription", "async_hub_for"]

log = logging.getLogger("tasklock.wakeup")


class AsyncWakeupHub:
    """One pub/sub connection and listener task for one server on one event loop; the channel
    rules are :class:`tasklock.core.wakeup.ChannelBook`'s, shared with the thread listener."""

    def __init__(self, client: Any) -> None:
        self._where = describe_client(client)
        self._pubsub = listener_client(client).pubsub()
        self._book = ChannelBook(asyncio.Event)
        self._task: asyncio.Task[None] | None = None
        #: Set when its listener ended and it left ``_hubs``: the next waiter makes a new one.
        self.retired = False

    async def watch(
        self, channel: str, event: asyncio.Event | None = None, token: str | None = None
    ) -> AsyncSubscription:
        """Register a waiter on ``channel``; returns once the subscription is confirmed (or the
        confirmation timed out: the waiter still works by polling). ``event`` lets several
        subscriptions (one per Redlock master) share one event; ``token``: a fair waiter's
        owner token, woken only when the release names it."""
        name = channel.encode()
        key = token.encode() if token is not None else None
        if event is None:
            event = asyncio.Event()
        entry, new = self._book.join(name, event, key)
        if new:
            try:
                await self._pubsub.subscribe(*self._book.subscriptions(name))
            except BaseException as exc:  # the waiter falls back to polling (or was cancelled)
                log.debug("wake-up subscribe to %s failed: %r", channel, exc)
                entry.confirmed.set()  # nobody waits on a SUBSCRIBE that will not come
                if not isinstance(exc, Exception):
                    raise
            finally:
                self._start_listener()
        elif entry.confirmed.is_set():
            self._start_listener()
        # Else another waiter's SUBSCRIBE of this channel is on its way, and that waiter starts
        # the listener once it is sent. Started sooner, the listener read a pub/sub connection
        # that was not yet made, failed, and counted every channel as confirmed: the first
        # hand-off after an idle spell (a new connection) missed its wake-up and waited for the
        # fallback poll, about 200 ms.
        if not entry.confirmed.is_set():
            try:
                async with asyncio.timeout(SUBSCRIBE_CONFIRM_TIMEOUT):
                    await entry.confirmed.wait()
            except TimeoutError:
                pass
        return AsyncSubscription(self, name, event, key)

    def _start_listener(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._listen(), name="tasklock-wakeup"
            )

    def live(self, channel: str) -> bool:
        """True when ``channel`` is subscribed here already (a waiter on it needs no SUBSCRIBE
        round trip, and no second try to catch a release made before it was subscribed)."""
        entry = self._book.channels.get(channel.encode())
        return entry is not None and entry.confirmed.is_set()

    def _forget(self, name: bytes, event: asyncio.Event, token: bytes | None) -> None:
        self._book.leave(name, event, token)

    async def _listen(self) -> None:
        try:
            while self._book.channels:
                try:
                    message = await self._pubsub.get_message(timeout=1.0)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # Connection trouble: waiters keep polling; redis-py resubscribes on
                    # reconnect. A refused SUBSCRIBE (ACL) means polling for good.
                    if isinstance(exc, NoPermissionError):
                        warn_wakeup_refused(self._where, "SUBSCRIBE", exc)
                    else:
                        log.debug("wake-up listener error: %s", exc)
                    self._book.confirm_all()
                    await asyncio.sleep(0.2)
                else:
                    if message:
                        self._book.dispatch(message)
                stale = self._book.stale()
                if stale and self._book.channels:
                    try:
                        await self._pubsub.unsubscribe(*self._book.unsubscriptions(stale))
                    except Exception as exc:
                        log.debug("wake-up unsubscribe failed: %s", exc)
        finally:
            # Idle (or the loop is shutting down): forget this listener, so that nothing here
            # refers to the loop any more; the next waiter makes a new one.
            self._task = None
            loop = asyncio.get_running_loop()
            per_loop = _hubs.get(loop, {})
            for key, hub in list(per_loop.items()):
                if hub is self:
                    del per_loop[key]
            self.retired = True
            if not per_loop:
                _hubs.pop(loop, None)
            try:
                await asyncio.shield(self._pubsub.aclose())
            except BaseException as exc:  # closing is best effort
                log.debug("wake-up listener close failed: %s", exc)


class AsyncSubscription:
    """A waiter's handle: :meth:`wait` returns early when the lock is released."""

    __slots__ = ("_event", "_hub", "_name", "_token")

    def __init__(
        self, hub: AsyncWakeupHub, name: bytes, event: asyncio.Event, token: bytes | None = None
    ) -> None:
        self._hub = hub
        self._name = name
        self._event = event
        self._token = token

    def arm(self) -> None:
        """Forget earlier wake-ups; call right before an acquire attempt."""
        self._event.clear()

    async def wait(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._event.wait()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self._hub._forget(self._name, self._event, self._token)


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], AsyncWakeupHub]]
_hubs = weakref.WeakKeyDictionary()


#: The hub each client object last got, on which loop (both weakly: nothing here keeps a loop
#: or a hub alive): a lock made per use asks once per object, and working out the server's
#: identity each time cost it more than this lookup (as ``hub_for`` in tasklock.core.wakeup).
_hub_of_client: weakref.WeakKeyDictionary[
    Any, tuple[weakref.ref[asyncio.AbstractEventLoop], weakref.ref[AsyncWakeupHub]]
] = weakref.WeakKeyDictionary()


def async_hub_for(client: Any) -> AsyncWakeupHub:
    """The running loop's listener for ``client``'s server."""
    loop = asyncio.get_running_loop()
    try:
        known_loop, known_hub = _hub_of_client[client]
    except (KeyError, TypeError):  # (TypeError: a client that cannot be weakly referenced)
        pass
    else:
        hub = known_hub()
        if hub is not None and not hub.retired and known_loop() is loop:
            return hub
    per_loop = _hubs.setdefault(loop, {})
    key = server_identity(client)
    hub = per_loop.get(key)
    if hub is None:
        hub = per_loop[key] = AsyncWakeupHub(client)
    with contextlib.suppress(TypeError):
        _hub_of_client[client] = (weakref.ref(loop), weakref.ref(hub))
    return hub
