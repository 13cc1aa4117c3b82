"""The task layer's rate limit: ``rate=``, ``burst=``, ``rate_key=``, ``rate_group=`` and
``on_rate_limit=``, free of any framework (the adapters supply what "re-send later" means).

Where it sits in a run (:meth:`tasklock.guard.Guard.run`): after the execution lock is taken
(first thing with ``limit=None``), right before the body. So a call skipped as a duplicate uses
no capacity, and only bodies that start are counted.

What a rate-limited call does, by ``on_rate_limit``:

* ``"retry"`` (default): the script reserves the call's own slot, in arrival order, and the
  call is re-sent to arrive at that slot (Celery: a retry with that countdown, not counted
  against ``max_retries``; RQ: rescheduled). When it comes back it finds its reservation and
  goes at its slot: no second check, no retry storm, no worker held meanwhile (RQ's scheduler
  works in whole seconds, so an RQ job comes back a little early and sleeps the rest). One that
  comes back late goes at the next start the limit admits (the script counts starts apart from
  slots), so late calls are spaced again, never run together. A slot nearer than the adapter's
  ``near`` is slept for in the worker instead (re-sending costs more). A call that cannot be
  re-sent (a direct call, ``apply()``, eager mode) sleeps until its slot.
* ``"wait"``: sleep in the worker until the slot, if it is at most ``wait_timeout`` away (the
  slot is reserved, so waiters keep their order); further away, ``on_wait_timeout`` applies.
* ``"skip"``: the call ends without running (capacity untouched); ``"raise"``: it fails with
  :class:`tasklock.RateLimited`, whose ``retry_after`` says when a call would pass.

Keys: the limit is ``<prefix>:{rate:<group>:<digest>}`` (group: ``rate_group``, default the task
name; digest: of the ``rate_key`` arguments, default the call key), a reservation is that key
plus ``:slot:<task id>``, in the same cluster slot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from tasklock import stats
from tasklock.config import TaskOptions
from tasklock.core.ratelimit import RateLimit
from tasklock.core.rates import Admission, RatePlan
from tasklock.errors import RateLimited
from tasklock.signature import CallKey

__all__ = ["EARLY", "KEEP", "RateCall", "RateGate", "RatedTask", "Throttle"]

log = logging.getLogger("tasklock")

R = TypeVar("R")

#: How long a deferred call that comes back before its slot sleeps the rest in the worker; further
#: away it is deferred again. Covers clocks of hosts that differ (Celery's countdown becomes an
#: eta on the retrying worker's clock) and RQ's scheduler, which works in whole seconds.
EARLY = 2.0

#: How long a reservation outlives its slot. A deferred call that comes back later than this (a
#: backlog of hours) has lost its reservation and is counted again: deferred, never lost.
KEEP = 3600.0


@dataclass(frozen=True)
class Throttle:
    """A call the rate limit did not let run now, and what happens to it."""

    task: str
    key: str
    rate: str
    #: Seconds until the call's slot (policy "retry": reserved; else when a call would pass).
    retry_after: float
    #: "retry" (re-send after ``retry_after``) or "skip".
    policy: str
    waited: bool = False

    def message(self) -> str:
        return (
            f"{self.task}: rate limited ({self.rate}, key={self.key}); "
            f"{'slot reserved in' if self.policy == 'retry' else 'a call would pass in'} "
            f"{self.retry_after:.3f}s"
        )

    def as_meta(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "key": self.key,
            "rate": self.rate,
            "retry_after": self.retry_after,
            "policy": self.policy,
        }


class RateGate:
    """The rate limit of one task: its keys, its plan, and the policy around one admission."""

    def __init__(
        self,
        func: Callable[..., Any],
        name: str,
        explicit: Mapping[str, Any],
        call_key: CallKey,
        exclude: Iterable[str] = (),
    ) -> None:
        self.name = name
        rate_key = explicit.get("rate_key")
        self.call_key = (
            call_key
            if rate_key is None
            else CallKey(func, name, key=rate_key, exclude=exclude, option="rate_key")
        )
        self._plans: dict[tuple[str, str], RatePlan] = {}

    def plan(self, options: TaskOptions) -> RatePlan:
        marker = (repr(options.rate), repr(options.burst))
        plan = self._plans.get(marker)
        if plan is None:
            plan = self._plans[marker] = RatePlan.of(options.rate, options.burst)
        return plan

    def key(self, options: TaskOptions, args: Iterable[Any], kwargs: Mapping[str, Any]) -> str:
        group = options.rate_group or self.name
        return f"{options.key_prefix}:{{rate:{group}:{self.call_key.digest(args, kwargs)}}}"

    def limit(self, client: Any, options: TaskOptions, key: str) -> RateLimit:
        plan = self.plan(options)
        return RateLimit(client, key, list(map(str, plan.rates)), list(plan.bursts))

    def admit(
        self,
        client: Any,
        options: TaskOptions,
        args: Iterable[Any],
        kwargs: Mapping[str, Any],
        *,
        task_id: str | None,
        near: float | None,
        sleep: Callable[[float], Any] = time.sleep,
    ) -> Throttle | None:
        """Admit this call: None once it may run (after sleeping to its slot, if that is how it
        is admitted), else the :class:`Throttle` the adapter acts on. ``near``: the adapter can
        re-send the call (a worker run with ``task_id``), and slots nearer than this are slept
        for; None: it cannot, and ``"retry"`` sleeps until the slot. Raises RateLimited for
        ``"raise"`` (and for ``"wait"`` past ``wait_timeout`` with ``on_wait_timeout="raise"``).
        """
        key = self.key(options, args, kwargs)
        limit = self.limit(client, options, key)
        policy = options.on_rate_limit
        reservation = f"{key}:slot:{task_id}" if task_id and near is not None else None
        if policy == "retry" and reservation is not None:
            admission = limit.admit(near, reservation=reservation, keep=KEEP, early=EARLY)
        elif policy == "retry" or (policy == "wait" and options.wait_timeout is None):
            admission = limit.admit(None)
        elif policy == "wait":
            admission = limit.admit(options.wait_timeout)
            if not admission:
                return self._after_wait(limit, options, key, admission, reservation, near)
        else:
            admission = limit.admit(0.0)
        return self._outcome(limit, key, admission, policy, sleep)

    def _after_wait(
        self,
        limit: RateLimit,
        options: TaskOptions,
        key: str,
        admission: Admission,
        reservation: str | None,
        near: float | None,
    ) -> Throttle | None:
        """``"wait"`` whose slot is further than ``wait_timeout``: ``on_wait_timeout``."""
        policy = options.on_wait_timeout
        if policy == "retry" and reservation is not None:
            admission = limit.admit(near, reservation=reservation, keep=KEEP, early=EARLY)
        elif policy == "retry":
            policy = "raise"  # nothing to re-send: the caller sees the refusal
        return self._outcome(limit, key, admission, policy, time.sleep, waited=True)

    def _outcome(
        self,
        limit: RateLimit,
        key: str,
        admission: Admission,
        policy: str,
        sleep: Callable[[float], Any],
        *,
        waited: bool = False,
    ) -> Throttle | None:
        if admission.allowed:
            if admission.retry_after > 0:
                stats.increment("rate_waited", self.name)
                sleep(admission.retry_after)
            return None
        rate = limit.plan.describe()
        if admission.deferred:
            stats.increment("rate_deferred", self.name)
            throttle = Throttle(self.name, key, rate, admission.retry_after, "retry", waited)
            log.info("%s -> re-sent for its slot", throttle.message())
            return throttle
        stats.increment(f"rate_{policy}", self.name)
        if policy == "skip":
            throttle = Throttle(self.name, key, rate, admission.retry_after, "skip", waited)
            log.info("%s -> skip", throttle.message())
            return throttle
        raise RateLimited(
            f"{self.name}: rate limited ({rate}, key={key}); a call would pass in "
            f"{admission.retry_after:.3f}s",
            key=key,
            retry_after=admission.retry_after,
        )


class RatedTask(Protocol):
    """What a :class:`RateCall` needs of its task's guard (:class:`tasklock.guard.Guard`)."""

    @property
    def options(self) -> TaskOptions: ...

    def admit_rate(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        task_id: str | None,
        near: float | None,
    ) -> Throttle | None: ...

    def keep_pending(
        self, args: Iterable[Any], kwargs: Mapping[str, Any], task_id: str, *, delay: float = 0.0
    ) -> bool: ...


class RateCall(Generic[R]):
    """One call's way through the rate limit: ask the gate, and hand a throttled call to the
    adapter (keeping the pending marker of a deferred "until_start" run, which has not started)."""

    __slots__ = ("args", "guard", "kwargs", "near", "on_rate_limit", "task_id")

    def __init__(
        self,
        guard: RatedTask,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        task_id: str | None,
        on_rate_limit: Callable[[Throttle], R] | None,
        near: float | None,
    ) -> None:
        self.guard = guard
        self.args = args
        self.kwargs = kwargs
        self.task_id = task_id
        self.on_rate_limit = on_rate_limit
        # Without a way to re-send, "retry" sleeps until the slot.
        self.near = near if on_rate_limit is not None else None

    def throttle(self) -> Throttle | None:
        return self.guard.admit_rate(self.args, self.kwargs, self.task_id, self.near)

    def defer(self, throttle: Throttle) -> R:
        guard = self.guard
        if (
            throttle.policy == "retry"
            and self.task_id is not None
            and guard.options.dedupe_enqueue == "until_start"
        ):
            guard.keep_pending(self.args, self.kwargs, self.task_id, delay=throttle.retry_after)
        if self.on_rate_limit is None:
            raise RateLimited(throttle.message(), throttle.key, throttle.retry_after)
        return self.on_rate_limit(throttle)
