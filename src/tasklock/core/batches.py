"""The watchdog's batches for stores with no pipeline (etcd, ZooKeeper): each hold renewed by
its own call, behind the Redis-shaped interface the thread watchdog speaks.

The thread watchdog (:mod:`tasklock.core.watchdog`) renews holds in batches, one per "server":
``server.pipeline(transaction=False)``, ``script.queue(pipe, keys, args)`` and
``pipe.execute(raise_on_error=False)``. A store whose renewal is one request per hold (an etcd
lease keep-alive, a ZooKeeper node confirmation) speaks it with the classes here, so its holds get
the same scheduling, deadlines, late warnings and lost verdicts as Redis ones. What differs per
store is only the per-hold call (a :data:`PerHold`), so the batch, its "server" and the verdict
are written once; the asyncio driver's batch is :mod:`tasklock.asyncio.batches`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from tasklock.core.renewal import Outcome
from tasklock.core.scripting import Script

__all__ = [
    "HoldBatch",
    "HoldScript",
    "PerHold",
    "Renewer",
    "judge_hold",
    "renewer_for",
    "sync_renewer",
]

#: Renews one hold: given the lock and the hold's value, a truthy answer (renewed), 0 (gone, or
#: released meanwhile: its entry is cancelled, so it is not judged), or it raises (unreachable).
PerHold = Callable[[Any, bytes], Any]
B = TypeVar("B")


class HoldScript(Script):
    """The "script" a renewal entry names: queued as ``pipe.add(lock, value)``, never sent."""

    def queue(self, pipe: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        pipe.add(args[0], args[1])


class HoldBatch:
    """One round's renewals for one client: each hold's :data:`PerHold` call in turn, each
    call's error in its place (as a pipeline without ``raise_on_error`` answers)."""

    def __init__(self, renew: PerHold) -> None:
        self._renew = renew
        self._items: list[tuple[Any, bytes]] = []

    def add(self, lock: Any, value: bytes) -> None:
        self._items.append((lock, value))

    def execute(self, raise_on_error: bool = False) -> list[Any]:
        results: list[Any] = []
        for lock, value in self._items:
            try:
                results.append(self._renew(lock, value))
            except Exception as exc:
                results.append(exc)
        return results


class Renewer(Generic[B]):
    """One per client and per-hold call: the watchdog's "server", so one round's renewals for
    that client go together in one batch."""

    def __init__(self, client: Any, batch: Callable[[], B]) -> None:
        self.client = client
        self._batch = batch

    def pipeline(self, transaction: bool = False) -> B:
        return self._batch()


def renewer_for(client: Any, renew: object, batch: Callable[[], B]) -> Renewer[B]:
    """The client's renewer for ``renew`` (made with ``batch`` on first use, then kept on the
    client). Keyed by the per-hold call, so the sync and the asyncio locks of one client (a
    ZooKeeper client serves both) each get their own batches."""
    renewers: dict[object, Renewer[Any]] | None = getattr(client, "_tasklock_renewers", None)
    if renewers is None:
        renewers = {}
        client._tasklock_renewers = renewers
    renewer: Renewer[B] | None = renewers.get(renew)
    if renewer is None:
        renewer = renewers[renew] = Renewer(client, batch)
    return renewer


def sync_renewer(client: Any, renew: PerHold) -> Renewer[HoldBatch]:
    """The thread watchdog's renewer of ``client``: a :class:`HoldBatch` of ``renew`` a round."""
    return renewer_for(client, renew, lambda: HoldBatch(renew))


def judge_hold(results: list[Any], elapsed: float) -> Outcome:
    """A per-hold renewal's verdict: renewed (a truthy answer), lost (0: the lease or node is
    gone), or unreachable (an error)."""
    answer = results[0]
    if isinstance(answer, BaseException):
        return Outcome.UNREACHABLE
    return Outcome.RENEWED if answer else Outcome.LOST
