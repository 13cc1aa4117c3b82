"""What the backends' registry hooks (``tasklock.etcd.backend``, ``tasklock.zookeeper.backend``)
have in common, written once: a per-process object per URL, the URL check, and the refusal of a
``rate``.

The hooks modules sit beside each other in the lock core and may not import each other, and the
registry (:mod:`tasklock.backends`) sits above them, so the shared part lives here, below both.
Only what a backend does differently stays in its own hooks module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tasklock.errors import ConfigurationError

if TYPE_CHECKING:
    from tasklock.core.base import BaseLock

__all__ = ["PerCall", "PerUrl", "rate_refusal", "url_problem"]

T = TypeVar("T")

#: The hint of every ``rate`` refusal: a rate limit needs a Redis.
RATE_HINT = "give the rate-limited task a Redis url=, or drop rate for this task"


class PerUrl(Generic[T]):
    """One object per URL per process, made by ``make`` on first use. Thread-safe: two threads
    asking for a new URL at once get the same object (a client is costly: its own connections
    or session)."""

    def __init__(self, make: Callable[[str], T]) -> None:
        self._make = make
        self._made: dict[str, T] = {}
        self._lock = threading.Lock()

    def __call__(self, url: str) -> T:
        found = self._made.get(url)
        if found is None:
            with self._lock:
                found = self._made.get(url)
                if found is None:
                    found = self._made[url] = self._make(url)
        return found

    def forget(self) -> list[T]:
        """Drop every object made so far, and return them (tests: a module's servers stop with
        it, and the clients made for them would go on reconnecting in later modules)."""
        with self._lock:
            made, self._made = list(self._made.values()), {}
        return made


def url_problem(parse: Callable[[str], object], option: str, url: str) -> str | None:
    """What ``parse`` finds wrong with ``url`` given as ``option``, or None."""
    try:
        parse(url)
    except ConfigurationError as exc:
        return f"{option}: {exc}"
    return None


def rate_refusal(a_url: str, store: str) -> tuple[str, str, str, str]:
    """(option, message, hint, check code) refusing ``rate`` on a store that runs no Redis
    script: ``a_url`` names the URL ("an etcd url"), ``store`` the store ("etcd")."""
    message = (
        f"rate with {a_url} is refused: a rate limit is one script on one Redis, which {store} "
        "cannot run"
    )
    return ("rate", message, RATE_HINT, "E016")


class PerCall:
    """A lock maker (:class:`tasklock.backends.LockMaker`) that makes each call's lock anew
    with ``lock(store, key, limit, owner_info=..., **common)``: for stores whose locks cost little
    to make (their clients are kept per URL)."""

    __slots__ = ("_common", "_limit", "_lock", "store")

    def __init__(
        self,
        lock: Callable[..., BaseLock],
        store: Any,
        limit: int | None,
        common: Mapping[str, Any],
    ) -> None:
        self.store = store
        self._lock = lock
        self._limit = limit
        self._common = {k: v for k, v in common.items() if k != "owner_info"}

    def __call__(self, key: str, owner_info: Mapping[str, Any] | None) -> BaseLock:
        return self._lock(self.store, key, self._limit, owner_info=owner_info, **self._common)
