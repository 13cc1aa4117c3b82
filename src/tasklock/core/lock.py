"""The single-instance lock: one Redis, one round trip to acquire, fenced.

Acquire runs one script that does the SET NX PX and, on success, issues the fence: the server's
clock in microseconds, or one more than the counter's last token where that is higher, so every
hold gets a fencing token strictly larger than any earlier hold's, even when Redis lost or rolled
back the counter, at the cost of no extra round trip (see ``ACQUIRE`` in
:mod:`tasklock.core.scripts`). Release and extend are owner-checked scripts. While waiting, a
blocked acquire is woken by the release's PUBLISH.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tasklock.core.base import Attempt, BaseLock, Number, _Waiter
from tasklock.core.connection import backend_errors, describe_client
from tasklock.core.keys import fence_counter_ttl_ms, wake_channel
from tasklock.core.lease import fence_key_or_default
from tasklock.core.renewal import judge_single
from tasklock.core.scripts import ACQUIRE, EXTEND, RELEASE, Script
from tasklock.core.wakeup import PUBLISH_REFUSED, hub_for, warn_wakeup_refused
from tasklock.core.watchdog import Renewal
from tasklock.errors import ConfigurationError

__all__ = ["Lock"]


class Lock(BaseLock):
    """A Redis lock with a TTL that is always set, fencing tokens, a watchdog and fast wake-up.

    Interface-compatible with :class:`redis.lock.Lock`, so it also works as
    ``redis.Redis.lock(name, lock_class=tasklock.Lock)``. Differences, by design:

    * ``timeout=None`` does not mean "never expires": the lock gets a 30 s TTL that the watchdog
      renews while it is held, so a crashed holder frees it within 30 s.
    * An explicit ``timeout`` keeps redis-py's meaning (expires after that many seconds unless
      extended); pass ``watchdog=True`` to have it renewed as well.
    * :attr:`fence` is the fencing token of the current hold, strictly increasing per lock (per
      ``fence_key`` when several locks share a counter).

    Extra keyword-only parameters: ``fence_key`` (counter key; default ``{name}:fence`` in the
    lock's cluster slot), ``watchdog``, ``on_lost`` (called with the lock, from the watchdog thread,
    when a held lock is found gone) and ``owner_info`` (added to the readable owner metadata).
    """

    #: What a hold is on the server: a plain key holding the owner's value. (A Semaphore's
    #: permits are a sorted set, with scripts of their own; the rest of the class is shared.)
    _ACQUIRE: ClassVar[Script] = ACQUIRE
    _RELEASE: ClassVar[Script] = RELEASE
    _EXTEND: ClassVar[Script] = EXTEND

    def __init__(
        self,
        redis: Any,
        name: str,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        fence_key: str | None = None,
        watchdog: bool | None = None,
        on_lost: Callable[[BaseLock], Any] | None = None,
        owner_info: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
            watchdog=watchdog,
            on_lost=on_lost,
            owner_info=owner_info,
        )
        if redis is None or not hasattr(redis, "execute_command"):
            raise ConfigurationError(
                f"redis must be a redis-py client (redis.Redis), got {type(redis).__name__}"
            )
        self.redis = redis
        self.fence_key = fence_key_or_default(fence_key, self.name)
        self._keys = (self.name, self.fence_key)
        self._ttl_ms = max(1, int(self.ttl * 1000))
        self._channel = wake_channel(self.name)
        self._acquiring = f"acquiring lock {self.name!r}"
        self._releasing = f"releasing lock {self.name!r}"
        self._bind(redis)

    def _bind(self, client: Any) -> None:
        # The hot path: acquire and release pre-encoded for this client (see BoundScript).
        self._bound_to = client
        self._acquire_script = self._ACQUIRE.bind(client, self._keys, self._acquire_tail())
        self._release_script = self._RELEASE.bind(client, (self.name,), (self._channel,))

    def _acquire_tail(self) -> tuple[int, ...]:
        """The acquire script's arguments after the owner token."""
        return (self._ttl_ms, fence_counter_ttl_ms(self.ttl))

    def _attempt(self, token: str) -> Attempt:
        if self.redis is not self._bound_to:
            self._bind(self.redis)
        with backend_errors(self.redis, self._acquiring, self._keys):
            ok, number = self._acquire_script(token)
        if ok:
            return Attempt(True, f"{token}#{number}".encode(), int(number))
        return Attempt(False, holder_ttl=number / 1000 if number >= 0 else None)

    def _release_value(self, value: bytes) -> bool:
        if self.redis is not self._bound_to:
            self._bind(self.redis)
        with backend_errors(self.redis, self._releasing, self._keys[:1]):
            released = self._release_script(value)
        if released == PUBLISH_REFUSED:
            warn_wakeup_refused(describe_client(self.redis), "PUBLISH")
        return bool(released)

    def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        ms = max(1, int(seconds * 1000))
        with backend_errors(self.redis, f"extending lock {self.name!r}"):
            extended = self._EXTEND(self.redis, (self.name,), (value, ms, "1" if replace else "0"))
        return bool(extended)

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        call = (self.redis, self._EXTEND, (self.name,), (value, self._ttl_ms, "1"))
        return Renewal(self.name, self.ttl, [call], judge_single, on_lost)

    def _waiter(self) -> _Waiter:
        return hub_for(self.redis).watch(self._channel)

    def locked(self) -> bool:
        with backend_errors(self.redis, f"reading lock {self.name!r}"):
            return int(self.redis.exists(self.name)) > 0

    def _peek(self) -> tuple[bytes | None, int | None]:
        with backend_errors(self.redis, f"reading lock {self.name!r}"):
            pipe = self.redis.pipeline(transaction=False)
            pipe.get(self.name)
            pipe.pttl(self.name)
            value, pttl = pipe.execute()
        if value is None:
            return None, None
        return (value.encode() if isinstance(value, str) else value), int(pttl)

    def _stored_value_is(self, value: bytes) -> bool:
        with backend_errors(self.redis, f"reading lock {self.name!r}"):
            stored = self.redis.get(self.name)
        if isinstance(stored, str):
            stored = stored.encode()
        return bool(stored == value)
