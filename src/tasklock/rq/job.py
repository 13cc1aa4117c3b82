"""RQ adapter: ``@singleton_job`` runs an RQ job one at a time per call signature.

It only maps RQ's way of running jobs onto the framework-free :class:`tasklock.guard.Guard`
(key derivation, duplicate policy, fencing, watchdog and release live there, shared with Celery)::

    from tasklock.rq import singleton_job

    @singleton_job(ttl=30, key=["account_id"], fencing=True)
    def settle(account_id, day, fence_token=None): ...

    queue.enqueue(settle, 42, "2026-11-21")   # as usual: the lock is taken in the work horse
    settle.enqueue(queue, 42, "2026-11-21")   # the same, plus dedupe_enqueue when it is on

How each RQ mechanism is used, and why:

* **Importable by name.** RQ stores a job's function as a dotted path and the worker imports it
  again, so the decorator returns a plain function (``functools.wraps``) that is bound to the
  module attribute. Whatever enqueues it (``queue.enqueue``, ``settle.enqueue``, RQ's or
  django-rq's ``@job``), the worker runs the wrapper and so takes the lock.
* **Execution lock in the job run.** The wrapper recognises its own job with
  ``rq.get_current_job()`` (same dotted name) and calls :meth:`Guard.run` with the job id as owner:
  the lock is taken right before the body and released in ``finally`` -- also when RQ's job
  timeout raises ``JobTimeoutException`` (SIGALRM) in the horse. A horse killed with SIGKILL never
  reaches ``finally``: the lock's TTL frees it, and the watchdog (a thread in the horse) is why the
  TTL can stay short while a job runs for hours.
* **Default Redis.** Without ``url``/``urls`` (option, ``TASKLOCK_URL``, Django or Celery
  settings) the lock lives in the job's own Redis: ``job.connection`` in the horse, the queue's
  connection at enqueue.
* **Duplicates** (another job with the same key holds the lock) are logged, counted
  (:mod:`tasklock.stats`) and recorded in ``job.meta["tasklock"]``:
  ``skip`` finishes the job without running the body; ``raise`` fails it with
  :class:`~tasklock.errors.DuplicateJob`; ``retry`` returns ``rq.Retry`` so RQ reschedules the
  *same* job (same id, meta, options) after 1 s, then after jittered delays that double up to
  the TTL (:meth:`Guard.retry_delay`) -- a scheduled job needs a
  worker started with ``--with-scheduler``, and when no scheduler holds the job's queue the job
  fails with a ConfigurationError that says so, instead of waiting unseen; ``wait`` blocks in the
  horse until the holder releases (woken by the release) or ``wait_timeout`` passes.
* **Dependents of a duplicate.** RQ releases a job's dependents (``depends_on=``) when it ends,
  and a duplicate ends at once (``skip``: finished; ``raise``: failed, which releases dependents
  that allow failures) while its twin is still doing the work. So a duplicate that has dependents
  also makes each of them depend on the twin, in one script: RQ then holds each dependent until
  both jobs have ended, exactly as for ``depends_on=[duplicate, twin]``, whatever the order in
  which the two end (see ``RQ_ATTACH_DEPENDENTS`` in :mod:`tasklock.core.scripts`). The twin is
  the lock's holder, named by the job id in its owner record. When the holder is no job in this
  job's Redis (a direct call, a job of another RQ Redis sharing the lock server) nothing in RQ
  ends with its work: a skipped duplicate with
  dependents then fails with DuplicateJob instead, so they stay deferred and the failure shows.
  A duplicate nobody depends on costs nothing more: the look at its dependents rides in the round
  trip that records the duplicate in ``job.meta``.
* **dedupe_enqueue.** ``settle.enqueue`` claims a marker holding the new job's id before it
  enqueues; a twin's ``enqueue`` gets the pending ``Job`` back instead. The horse clears the
  marker when the job finishes or fails for good (not when RQ will retry it). Cancelled, deleted,
  stopped and SIGKILLed jobs have no hook that runs for sure, so a producer that finds a marker
  looks the named job up and replaces the marker when that job is no longer queued or running.
  With ``dedupe_enqueue="until_start"`` the guard clears the marker when the run starts instead
  (one running + one queued); a run that RQ will run again (``retry=Retry(...)``, a returned
  ``rq.Retry``) claims it again before it releases the lock.
* **limit=N.** The guard holds one of N permits instead of the lock: N work horses may run the
  body of one key at once.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast, overload

import rq
from rq import Queue, Retry
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus, get_current_job
from rq.scheduler import RQScheduler

from tasklock import fleet
from tasklock.errors import BackendUnavailable, ConfigurationError, DuplicateJob, RateLimited
from tasklock.guard import Duplicate, Guard, Throttle
from tasklock.rq.dependents import follow_twin
from tasklock.rq.functions import check_job_function, rq_decorator_of

__all__ = ["ENQUEUE_GRACE", "META_KEY", "SingletonJob", "SingletonJobFunction", "singleton_job"]

log = logging.getLogger("tasklock.rq")

P = ParamSpec("P")
R = TypeVar("R", covariant=True)

#: Where a job's tasklock record lives: ``job.meta["tasklock"]``.
META_KEY = "tasklock"
#: A producer claims the marker, then enqueues (one round trip later). A twin that finds the marker
#: waits this long for the named job to appear before it treats the marker as stale.
ENQUEUE_GRACE = 1.0
#: Statuses after which a job does not run again by itself: a marker naming it is stale.
_DONE = frozenset({JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED})
#: on_duplicate="retry" keeps rescheduling until the holder is gone; RQ wants a maximum.
_RETRY_FOREVER = 2**31 - 1
#: A job that returns rq.Retry is rescheduled by RQ itself from rq 2.1 on.
_RQ_RETURNS_RETRY = tuple(int(p) for p in rq.__version__.split(".")[:2] if p.isdigit()) >= (2, 1)

#: A rate-limited job whose slot is at most this far away sleeps for it in the work horse. Further
#: away it is rescheduled to come back before its slot (RQ's scheduler works in whole seconds and
#: looks once a second, so it is scheduled this much early, rounded down, and at least a second
#: ahead) and sleeps the rest, up to ``tasklock.rating.EARLY``; one that comes back late goes at
#: the next start the limit admits.
RATE_NEAR = 1.0
_RATE_LEAD = 1.0


# The Redis of the queue being enqueued to, for the guard's default client (see _default_client).
_enqueue_connection: ContextVar[Any] = ContextVar("tasklock_rq_connection", default=None)


def _default_client() -> Any:
    """The job's own Redis when no url is configured: the queue's at enqueue, the job's in the
    horse (also for a direct call made from inside another job)."""
    client = _enqueue_connection.get()
    if client is None:
        job = get_current_job()
        client = job.connection if job is not None else None
    return client


def _pending_job(queue: Queue, job_id: str) -> Job | None:
    """The job ``job_id`` if it is still queued, scheduled, deferred or running; else None."""
    deadline = time.monotonic() + ENQUEUE_GRACE
    while True:
        try:
            job = queue.job_class.fetch(
                job_id, connection=queue.connection, serializer=queue.serializer
            )
        except NoSuchJobError:
            # Deleted, or its producer has claimed the marker and is enqueueing right now.
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
            continue
        return None if job.get_status(refresh=False) in _DONE else job


def _update_meta(job: Job, fields: dict[str, Any]) -> None:
    meta = job.meta.get(META_KEY)
    if not isinstance(meta, dict):
        meta = job.meta[META_KEY] = {}
    meta.update(fields)


def _will_retry(job: Job) -> bool:
    """RQ will run this failed job again (``retry=Retry(...)`` with retries left)."""
    retries_left = job.retries_left
    return retries_left is not None and retries_left > 0


class SingletonJob:
    """The tasklock side of one ``@singleton_job`` function, reachable as ``settle.tasklock``.

    ``guard`` is the shared task policy (``settle.tasklock.guard.lock_key(args, kwargs)`` gives the
    key a call locks, as the worker computes it).
    """

    def __init__(self, func: Callable[..., Any], options: dict[str, Any]) -> None:
        check_job_function(func)
        if isinstance(getattr(func, "tasklock", None), SingletonJob):
            raise ConfigurationError(f"{func.__qualname__} is already a singleton job")
        self.func = func
        #: The dotted path RQ stores for the job, also the task name in lock keys.
        self.name = f"{func.__module__}.{func.__qualname__}"
        self.guard = Guard(func, self.name, options, default_client=_default_client)
        self.wrapper: Callable[..., Any] = func
        self._rq_delay: Callable[..., Any] | None = None
        self._rq_decorator: Any = None
        self._importable = False

    def bind(self, wrapper: Callable[..., Any]) -> None:
        """Attach to the function RQ will import; adopt an inner rq/django-rq ``@job``."""
        self.wrapper = wrapper
        attrs: dict[str, Any] = wrapper.__dict__
        rq_delay = attrs.get("delay")
        if rq_delay is not None:
            decorator = rq_decorator_of(rq_delay)
            if decorator is not None:
                self._rq_delay, self._rq_decorator = rq_delay, decorator
                attrs["delay"] = self.delay
        attrs["tasklock"] = self
        attrs["enqueue"] = self.enqueue

    # -- in the worker ---------------------------------------------------------------------------
    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call of the decorated function: as the job itself in an RQ worker, or directly."""
        job = get_current_job()
        if job is None or job.func_name != self.name:
            return self._run_direct(args, kwargs)
        try:
            return self._run_job(job, args, kwargs)
        finally:
            # A work horse runs one job and leaves with os._exit (no atexit, maybe no turn
            # for the counts' thread): its counts are written at the job's end.
            fleet.flush_first_job()

    def _run_job(self, job: Job, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        guard = self.guard
        failed_skips: list[DuplicateJob] = []  # skips turned into failures, recorded already
        try:
            result = guard.run(
                args,
                kwargs,
                functools.partial(self._body, job, args, kwargs),
                task_id=job.id,
                on_skip=functools.partial(self._skip, job, failed_skips),
                on_retry=functools.partial(self._retry, job),
                duplicate_error=DuplicateJob,
                on_rate_limit=functools.partial(self._rate_limited, job),
                rate_near=RATE_NEAR,
            )
        except BaseException as exc:
            if isinstance(exc, DuplicateJob) and not any(exc is e for e in failed_skips):
                self._duplicate_failed(job, exc)
            if guard.options.dedupe_enqueue and not _will_retry(job):
                guard.clear_pending(args, kwargs, job.id)
            raise
        if guard.options.dedupe_enqueue and not isinstance(result, Retry):
            guard.clear_pending(args, kwargs, job.id)
        return result

    def _body(
        self, job: Job, args: tuple[Any, ...], kwargs: dict[str, Any], extra: dict[str, Any]
    ) -> Any:
        call_kwargs = kwargs
        if extra:
            self._record(job, outcome="ran", fence=extra[cast(str, self.guard.fence_keyword)])
            call_kwargs = {**kwargs, **extra}
        elif META_KEY in job.meta:  # an earlier attempt met a duplicate: say that it ran now
            self._record(job, outcome="ran")
        try:
            result = self.func(*args, **call_kwargs)
        except BaseException:
            if _will_retry(job):
                self._pending_again(job, args, kwargs)
            raise
        if isinstance(result, Retry):
            self._pending_again(job, args, kwargs)
        return result

    def _pending_again(self, job: Job, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The body ended and RQ will run this job again (``retry=Retry(...)`` with retries left,
        or the body returned ``rq.Retry``): with ``dedupe_enqueue="until_start"`` the job is
        pending work again. Claimed here, while this run still holds the lock, so the retry
        cannot start (and clear it) first."""
        self.guard.pending_again(args, kwargs, job.id)

    def _skip(self, job: Job, failed_skips: list[DuplicateJob], duplicate: Duplicate) -> None:
        """Finish without the body; a job with dependents first makes them wait for the twin.

        When they cannot wait for it (the holder is no RQ job of this Redis) the job fails with
        DuplicateJob instead of finishing: RQ keeps a failed job's dependents deferred (those
        that allow failures excepted), and the failure is there to see and requeue.
        """
        dependents = self._record_duplicate(job, outcome="skipped", duplicate=duplicate.as_meta())
        if not dependents:
            return
        twin, problem = self._follow_twin(job, dependents, duplicate.holder)
        if problem is None:
            self._record(job, dependents={"after": twin, "jobs": dependents})
            return
        self._record(
            job,
            outcome="duplicate",
            key=duplicate.key,
            holder=duplicate.holder,
            dependents={"not_ordered": problem, "jobs": dependents},
        )
        error = DuplicateJob(f"{duplicate.message()}; {problem}", duplicate.key, duplicate.holder)
        failed_skips.append(error)
        raise error

    def _duplicate_failed(self, job: Job, error: DuplicateJob) -> None:
        """A duplicate that fails (on_duplicate="raise", or after waiting): record it, and make
        its dependents wait for the twin too -- RQ releases those that allow failures as soon as
        this job fails. Never raises: the job fails with DuplicateJob all the same."""
        try:
            dependents = self._record_duplicate(
                job, outcome="duplicate", key=error.key, holder=error.holder
            )
            if dependents:
                twin, problem = self._follow_twin(job, dependents, error.holder)
                ordered = {"after": twin} if problem is None else {"not_ordered": problem}
                self._record(job, dependents={**ordered, "jobs": dependents})
        except Exception as meta_error:
            log.warning("%s: could not record the duplicate in job.meta: %s", self.name, meta_error)

    def _follow_twin(
        self, job: Job, dependents: list[str], holder: str | None
    ) -> tuple[str | None, str | None]:
        """Make ``dependents`` of this duplicate depend on the twin as well (see
        :func:`tasklock.rq.dependents.follow_twin`)."""
        return follow_twin(self.name, job, dependents, holder)

    def _retry(self, job: Job, duplicate: Duplicate) -> Retry:
        if not _RQ_RETURNS_RETRY:
            raise ConfigurationError(
                f"{duplicate.message()}; on_duplicate='retry' needs rq >= 2.1 (a job that returns "
                f"rq.Retry is rescheduled by RQ), this is rq {rq.__version__}"
            )
        self._require_scheduler(job, duplicate.message(), "on_duplicate='retry'")
        previous = job.meta.get(META_KEY)
        retries = int(previous.get("retries", 0)) + 1 if isinstance(previous, dict) else 1
        # The delays grow with the retries made so far; RQ schedules in whole seconds.
        delay = math.ceil(self.guard.retry_delay(duplicate, attempt=retries - 1))
        self._record(
            job, outcome="retry", duplicate=duplicate.as_meta(), retry_in=delay, retries=retries
        )
        return Retry(max=_RETRY_FOREVER, interval=delay)

    @staticmethod
    def _require_scheduler(job: Job, message: str, option: str) -> None:
        """A ConfigurationError unless a scheduler serves the job's queue (a rescheduled job
        would wait unseen in the ScheduledJobRegistry)."""
        queue = job.origin
        if not job.connection.exists(RQScheduler.get_locking_key(queue)):
            raise ConfigurationError(
                f"{message}; {option} reschedules the job, which needs RQ's scheduler, but no "
                f"scheduler is running for queue {queue!r}: start workers with `rq worker "
                "--with-scheduler` (a --burst worker runs none). The job failed instead of "
                "waiting unseen in the ScheduledJobRegistry; requeue it from the "
                "FailedJobRegistry once a scheduler runs"
            )

    def _rate_limited(self, job: Job, throttle: Throttle) -> Retry | None:
        """The job may not run now by its rate limit: reschedule it for its reserved slot
        (``"retry"``), or finish it without the body (``"skip"``). A skipped job with dependents
        fails with RateLimited instead: the work they wait for was not done, and RQ keeps a
        failed job's dependents deferred."""
        if throttle.policy == "retry":
            self._require_scheduler(job, throttle.message(), "on_rate_limit='retry'")
            delay = max(1, math.floor(throttle.retry_after - _RATE_LEAD))
            self._record(job, outcome="rate_deferred", rate=throttle.as_meta(), retry_in=delay)
            return Retry(max=_RETRY_FOREVER, interval=delay)
        dependents = self._record_duplicate(job, outcome="rate_limited", rate=throttle.as_meta())
        if dependents:
            raise RateLimited(
                f"{throttle.message()}; skipped, and its dependents ({', '.join(dependents)}) "
                "would run without its work: the job fails instead, so RQ keeps them deferred",
                throttle.key,
                throttle.retry_after,
            )
        return None

    @staticmethod
    def _record(job: Job, **fields: Any) -> None:
        _update_meta(job, fields)
        job.save_meta()  # type: ignore[no-untyped-call]

    @staticmethod
    def _record_duplicate(job: Job, **fields: Any) -> list[str]:
        """Record a duplicate in ``job.meta`` and read the job's dependents in the same round
        trip, so a duplicate nobody depends on costs what it did before."""
        _update_meta(job, fields)
        # rq >= 3 writes meta it could not read back as it found it; older rq has no such case.
        serialize = getattr(job, "_serialize_meta", None)
        data = serialize() if callable(serialize) else job.serializer.dumps(job.meta)
        with job.connection.pipeline(transaction=False) as pipe:
            pipe.hset(job.key, "meta", data)
            pipe.smembers(job.dependents_key)
            members = pipe.execute()[1]
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)

    def _run_direct(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``settle(...)`` called as a function: the same lock and policy, without a job."""

        def retry(duplicate: Duplicate) -> Any:
            raise DuplicateJob(
                f"{duplicate.message()}; on_duplicate='retry' reschedules an RQ job, and this "
                "was a direct call",
                duplicate.key,
                duplicate.holder,
            )

        return self.guard.run(
            args,
            kwargs,
            lambda extra: self.func(*args, **{**kwargs, **extra}),
            task_id=None,
            on_skip=lambda duplicate: None,
            on_retry=retry,
            duplicate_error=DuplicateJob,
            on_rate_limit=lambda throttle: None,
        )

    # -- at enqueue ------------------------------------------------------------------------------
    def enqueue(self, *args: Any, **kwargs: Any) -> Job:
        """``settle.enqueue(queue, *args, **kwargs)``: like ``queue.enqueue(settle, ...)``
        (RQ's job options such as ``job_timeout``, ``job_id`` or ``meta`` work the same), plus
        ``dedupe_enqueue``: a twin that is queued, scheduled or running is returned instead.

        With an rq/django-rq ``@job`` under ``@singleton_job``, ``settle.enqueue(*args)`` without a
        queue uses that decorator's queue, like ``settle.delay(*args)``.
        """
        if args and isinstance(args[0], Queue):
            return self._enqueue(args[0], args[1:], kwargs)
        if self._rq_delay is not None:
            return self.delay(*args, **kwargs)
        raise TypeError(
            f"{self.name}.enqueue() takes the queue first: "
            f"{self.func.__name__}.enqueue(queue, *args, **kwargs)"
        )

    def delay(self, *args: Any, **kwargs: Any) -> Job:
        """RQ's ``@job`` ``delay`` (queue from that decorator), with ``dedupe_enqueue``."""
        rq_delay = self._rq_delay
        if rq_delay is None:
            raise TypeError(f"{self.name} has no rq @job decorator; use .enqueue(queue, ...)")
        self._check_importable()
        call_kwargs = {
            k: v for k, v in kwargs.items() if k not in ("depends_on", "job_id", "at_front")
        }
        if not self.guard.options.dedupe_enqueue:
            self.guard.call_key.digest(args, call_kwargs)  # a bad argument fails at the call
            return cast(Job, rq_delay(*args, **kwargs))
        decorator = self._rq_decorator
        queue = decorator.queue
        if not isinstance(queue, Queue):
            queue = decorator.queue_class(name=queue, connection=decorator.connection)
        job_id = kwargs.get("job_id") or uuid.uuid4().hex
        return self._deduplicated(
            queue,
            args,
            call_kwargs,
            job_id,
            lambda: rq_delay(*args, **{**kwargs, "job_id": job_id}),
        )

    def _enqueue(self, queue: Queue, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Job:
        wrapper = self._check_importable()
        spec = Queue.parse_args(wrapper, *args, **kwargs)
        call_args = tuple(spec.args or ())
        call_kwargs = dict(spec.kwargs or {})
        if not self.guard.options.dedupe_enqueue:
            self.guard.call_key.digest(call_args, call_kwargs)  # a bad argument fails at the call
            return queue.enqueue(wrapper, *args, **kwargs)
        job_id = spec.job_id or uuid.uuid4().hex
        return self._deduplicated(
            queue,
            call_args,
            call_kwargs,
            job_id,
            lambda: queue.enqueue(wrapper, *args, **{**kwargs, "job_id": job_id}),
        )

    def _deduplicated(
        self,
        queue: Queue,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        job_id: str,
        send: Callable[[], Job],
    ) -> Job:
        guard = self.guard
        twins: dict[str, Job] = {}

        def is_pending(existing_id: str) -> bool:
            twin = _pending_job(queue, existing_id)
            if twin is not None:
                twins[existing_id] = twin
            return twin is not None

        token = _enqueue_connection.set(queue.connection)
        try:
            try:
                existing = guard.claim_pending(args, kwargs, job_id, is_pending=is_pending)
            except BackendUnavailable as exc:
                if guard.options.on_backend_error != "run":
                    raise
                log.warning(
                    "%s: enqueued WITHOUT deduplication because the lock store is unreachable "
                    "(on_backend_error='run'): %s",
                    self.name,
                    exc,
                )
                return send()
            if existing is not None:
                return twins[existing]
            try:
                return send()
            except BaseException:
                guard.clear_pending(args, kwargs, job_id)
                raise
        finally:
            _enqueue_connection.reset(token)

    def _check_importable(self) -> Callable[..., Any]:
        """RQ will import the job by ``module.name``: make sure that finds this wrapper (or a
        decorator around it), or the worker would run the function without the lock."""
        wrapper = self.wrapper
        if self._importable:
            return wrapper
        found: Any = sys.modules.get(wrapper.__module__)
        for part in wrapper.__qualname__.split("."):
            found = getattr(found, part, None)
        target = found
        for _ in range(32):
            if target is None or target is wrapper:
                break
            target = getattr(target, "__wrapped__", None)
        if target is not wrapper:
            raise ConfigurationError(
                f"{self.name} does not name this singleton job (it is {found!r}): RQ imports a "
                "job by that dotted path, so the worker would run it WITHOUT the lock. Bind the "
                "decorated function to its own name (@singleton_job on the def)"
            )
        self._importable = True
        return self.wrapper

    def __repr__(self) -> str:
        return f"<SingletonJob {self.name}>"


class SingletonJobFunction(Protocol, Generic[P, R]):
    """What ``@singleton_job`` returns: the function, plus ``enqueue`` and ``tasklock``."""

    tasklock: SingletonJob

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    def enqueue(self, *args: Any, **kwargs: Any) -> Job: ...


@overload
def singleton_job(func: Callable[P, R], /) -> SingletonJobFunction[P, R]: ...


@overload
def singleton_job(
    func: None = None, /, **options: Any
) -> Callable[[Callable[P, R]], SingletonJobFunction[P, R]]: ...


def singleton_job(
    func: Callable[P, R] | None = None, /, **options: Any
) -> SingletonJobFunction[P, R] | Callable[[Callable[P, R]], SingletonJobFunction[P, R]]:
    """Make an RQ job function run one at a time per call signature (see the module docstring).

    ``@singleton_job`` or ``@singleton_job(**options)`` with the options of
    :mod:`tasklock.config` (``ttl``, ``key``, ``on_duplicate``, ``wait_timeout``, ``fencing``,
    ``dedupe_enqueue``, ``watchdog``, ``on_backend_error``, ``url``/``urls``, ...). Bad options,
    a ``key`` naming a missing argument or a fencing keyword the function does not take fail
    here, at import time.
    """
    if func is not None and options:
        raise ConfigurationError("use @singleton_job or @singleton_job(**options), not both")

    def decorate(f: Callable[P, R]) -> SingletonJobFunction[P, R]:
        adapter = SingletonJob(f, options)

        @functools.wraps(f)
        def singleton(*args: Any, **kwargs: Any) -> Any:
            return adapter.run(args, kwargs)

        adapter.bind(singleton)
        return cast(SingletonJobFunction[P, R], singleton)

    if func is not None:
        return decorate(func)
    return decorate
