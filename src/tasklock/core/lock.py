"""The single-instance lock: one Redis, one round trip to acquire, fenced.

Acquire runs one script that does the SET NX PX and, on success, issues the fence: the server's
clock in microseconds, or one more than the counter's last token where that is higher, so every
hold gets a fencing token strictly larger than any earlier hold's, even when Redis lost or rolled
back the counter, at the cost of no extra round trip (see ``ACQUIRE`` in
:mod:`tasklock.core.scripts`). Release and extend are owner-checked scripts. While waiting, a
blocked acquire is woken by the release's PUBLISH.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Self

from tasklock.core.base import Attempt, BaseLock, Number, _Waiter
from tasklock.core.connection import backend_errors, describe_client
from tasklock.core.keys import wake_channel
from tasklock.core.lanes import lane_for
from tasklock.core.layouts import WAITER_LIVENESS, Layout, lock_layout
from tasklock.core.lease import (
    check_fair,
    check_name,
    check_owner_info,
    fence_key_or_default,
)
from tasklock.core.permits import PermitState
from tasklock.core.renewal import judge_single
from tasklock.core.scripting import BoundScript
from tasklock.core.scripts import PERMIT_STATE
from tasklock.core.wakeup import PUBLISH_REFUSED, WakeupHub, hub_for, warn_wakeup_refused
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

    * Waiters are served first come, first served (``fair=True``): a release wakes only the
      next waiter, so the Redis work per hand-off does not grow with the number of waiters (see
      :mod:`tasklock.core.queue_scripts`). ``fair=False`` wakes every waiter and lets them race.

    Extra keyword-only parameters: ``fence_key`` (counter key; default ``{name}:fence`` in the
    lock's cluster slot), ``watchdog``, ``on_lost`` (called with the lock, from the watchdog thread,
    when a held lock is found gone), ``owner_info`` (added to the readable owner metadata) and
    ``fair``.
    """

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
        fair: bool = True,
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
        self.fair = check_fair(fair)
        self._fence_key_given = fence_key is not None
        self.fence_key = fence_key_or_default(fence_key, self.name)
        self._ttl_ms = max(1, int(self.ttl * 1000))
        self._hub_cache: tuple[int, Any, WakeupHub] | None = None
        if self.fair:
            self._renew_every = WAITER_LIVENESS / 3
        self._set_up_name()

    def _set_up_name(self) -> None:
        """What depends on the name: its layout, its wake channel, its messages, the prepared
        calls (the constructor's last step, and all that :meth:`for_name` redoes)."""
        self._channel = wake_channel(self.name)
        self._layout = self._make_layout()
        self._bind(self.redis)

    def _make_layout(self) -> Layout:
        return lock_layout(self.name, self.fence_key, self.ttl, self.fair)

    def for_name(self, name: str, *, owner_info: Mapping[str, Any] | None = None) -> Self:
        """A new lock object for ``name`` with this one's client and options (``owner_info``
        replaced): what the constructor would make, without checking the options again.

        For a caller that locks a new name on every call with the same options, as the task
        layer does (a name per call's arguments): it skips the checks and the set-up that do not
        depend on the name (what depends on it, the keys and their encoding, is still done). The
        new object shares nothing that changes with this one: its holds are its own, and this
        one may be in use."""
        other = object.__new__(type(self))
        other.__dict__ = self.__dict__.copy()  # (a copy costs half of an update of an empty one)
        other.name = check_name(name)
        other.owner_info = check_owner_info(owner_info)
        other.local = other._new_local()
        if not self._fence_key_given:
            other.fence_key = fence_key_or_default(None, other.name)
        other._set_up_name()
        return other

    def _bind(self, client: Any) -> None:
        # The hot path: acquire and release pre-encoded for this client (see BoundScript).
        layout = self._layout
        self._bound_to = client
        lane = lane_for(client)  # looked up, and the keys both share encoded, once
        known: dict[Any, bytes] = {}
        self._acquire_script = BoundScript(
            layout.acquire, client, layout.acquire_keys, layout.acquire_tail, lane=lane, known=known
        )
        self._release_script = BoundScript(
            layout.release, client, layout.release_keys, layout.release_tail, lane=lane, known=known
        )

    def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        if self.redis is not self._bound_to:
            self._bind(self.redis)
        with backend_errors(self.redis, "acquiring lock", self._layout.acquire_keys, self.name):
            ok, number = self._acquire_script(*self._layout.attempt_args(token, waiting))
        if ok:
            return Attempt(True, f"{token}#{number}".encode(), int(number))
        return Attempt(False, holder_ttl=number / 1000 if number >= 0 else None)

    def _release_value(self, value: bytes) -> bool:
        if self.redis is not self._bound_to:
            self._bind(self.redis)
        with backend_errors(self.redis, "releasing lock", self._layout.release_keys[:1], self.name):
            released = self._release_script(value)
        if released == PUBLISH_REFUSED:
            warn_wakeup_refused(describe_client(self.redis), "PUBLISH")
        return bool(released)

    def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        ms = max(1, int(seconds * 1000))
        with backend_errors(self.redis, f"extending lock {self.name!r}"):
            extended = self._layout.extend(
                self.redis, (self.name,), (value, ms, "1" if replace else "0")
            )
        return bool(extended)

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        call = (self.redis, self._layout.extend, (self.name,), (value, self._ttl_ms, "1"))
        return Renewal(self.name, self.ttl, [call], judge_single, on_lost)

    def _hub(self) -> WakeupHub:
        """This client's wake-up hub, looked up once per client and process (every blocking
        acquire asks it whether the process channel is live)."""
        cached = self._hub_cache
        pid = os.getpid()
        if cached is None or cached[0] != pid or cached[1] is not self.redis:
            cached = self._hub_cache = (pid, self.redis, hub_for(self.redis))
        return cached[2]

    def _waiter(self, token: str) -> _Waiter:
        if self.fair:  # woken by name (see queue_scripts)
            return self._hub().watch(self._channel, token=self._layout.member(token))
        return self._hub().watch(self._channel)

    def _early_waiter(self, token: str) -> _Waiter | None:
        if self.fair and self._hub().live(self._channel):
            return self._waiter(token)
        return None

    def _leave_queue(self, token: str) -> None:
        leave = self._layout.leave
        if leave is not None:
            script, keys, tail = leave
            with backend_errors(self.redis, f"leaving the queue of {self.name!r}", keys[:1]):
                script(self.redis, keys, (self._layout.member(token), *tail))

    def locked(self) -> bool:
        with backend_errors(self.redis, f"reading lock {self.name!r}"):
            return int(self.redis.exists(self.name)) > 0

    def _state(self, value: bytes = b"") -> PermitState:
        """One read of who holds the name, whichever kind holds it (a Lock's key, or a
        Semaphore's permits when a deployment moved the name between the two)."""
        with backend_errors(self.redis, f"reading lock {self.name!r}"):
            return PermitState.parse(PERMIT_STATE(self.redis, (self.name,), (value,)))

    def _peek(self) -> tuple[bytes | None, int | None]:
        return self._state().first()

    def _stored_value_is(self, value: bytes) -> bool:
        return self._state(value).holds(value)
