"""What the backends' registry hooks (``tasklock.etcd.backend``, ``tasklock.zookeeper.backend``)
have in common, written once: a per-process object per URL, the URL check, and the refusal of a
``rate``.

The hooks modules sit beside each other in the lock core and may not import each other, and the
registry (:mod:`tasklock.backends`) sits above them, so the shared part lives here, below both.
Only what a backend does differently stays in its own hooks module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from tasklock.errors import ConfigurationError

__all__ = ["PerUrl", "rate_refusal", "url_problem"]

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
