"""What a Semaphore is, with no I/O: its scripts, its limit, and how to read its permits.

A :class:`tasklock.Semaphore` is a :class:`tasklock.Lock` whose hold is one of ``limit`` permits
instead of the one key: everything else (owner tokens, fencing, waiting and wake-up, the
watchdog, ``lost``/``on_lost``, errors) is the lock's, shared, not copied. The difference is the
layout on the server, a sorted set of permits at the semaphore's name (see the PERMIT_* scripts
in :mod:`tasklock.core.scripts`), so what differs lives here once for the sync and the asyncio
driver: :class:`PermitRules` (the layout: scripts, keys, arguments) and :class:`PermitState`
(one read of the permits, parsed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tasklock.core.layouts import Layout, permit_layout
from tasklock.core.owner import Holder, parse_value
from tasklock.errors import ConfigurationError

__all__ = ["PermitRules", "PermitState", "check_limit"]


def check_limit(limit: Any) -> int:
    """``limit`` as an int >= 1, or a ConfigurationError naming it."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(
            f"limit must be a whole number of permits >= 1 (how many may hold at once), "
            f"got {limit!r}"
        )
    return limit


class PermitRules:
    """What makes a Lock driver (sync or asyncio) a semaphore: the permits' layout.

    Mixed in before the driver's Lock class. The limit is an argument of every acquire, so it
    may change between calls (see PERMIT_ACQUIRE)."""

    name: str
    fence_key: str
    ttl: float
    fair: bool
    limit: int

    def _make_layout(self) -> Layout:
        return permit_layout(self.name, self.fence_key, self.ttl, self.limit, self.fair)


#: PERMIT_STATE's first number when a plain Lock holds the name: no permit can be taken.
_HELD_BY_A_LOCK = 2


@dataclass(frozen=True)
class PermitState:
    """One read of a semaphore's permits (PERMIT_STATE's answer)."""

    #: True when the value asked about holds a live permit.
    mine: bool
    #: Every live permit as (stored value, ms left), the first to expire first (ms -1: no TTL).
    permits: tuple[tuple[bytes, int], ...]
    #: True when a plain Lock holds the name (a task whose limit changed during a deployment).
    held_by_a_lock: bool = False

    @classmethod
    def parse(cls, reply: Sequence[Any]) -> PermitState:
        flag = int(reply[0])
        pairs = []
        for i in range(1, len(reply) - 1, 2):
            value = reply[i]
            pairs.append(
                (value.encode() if isinstance(value, str) else bytes(value), int(reply[i + 1]))
            )
        return cls(flag == 1, tuple(pairs), flag == _HELD_BY_A_LOCK)

    def holds(self, value: bytes) -> bool:
        """True when ``value`` holds the name now (a live permit, or the Lock's key)."""
        return self.mine or any(stored == value for stored, _ in self.permits)

    def full(self, limit: int) -> bool:
        """True when no permit can be taken now (``locked()``)."""
        return self.held_by_a_lock or len(self.permits) >= limit

    def first(self) -> tuple[bytes | None, int | None]:
        """The permit that frees first, as ``_peek`` answers: (value, ms left), or (None, None)."""
        if not self.permits:
            return None, None
        return self.permits[0]

    def holders(self) -> list[tuple[Holder, float | None]]:
        """Who holds the permits, and for how many more seconds each."""
        return [(parse_value(value), ms / 1000 if ms >= 0 else None) for value, ms in self.permits]
