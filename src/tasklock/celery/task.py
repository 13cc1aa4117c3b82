"""Celery adapter: the :class:`SingletonTask` base and the :func:`singleton_task` decorator.

Everything that is policy (key, duplicate handling, fencing, watchdog, enqueue marker) lives in
:class:`tasklock.guard.Guard`; this module only maps Celery's hooks onto it:

===========================  ===================================================================
Celery hook                  what tasklock does there
===========================  ===================================================================
class creation               options read from the class's attributes (what Celery makes of
                             ``@app.task(base=SingletonTask, ttl=5)``) and ``tasklock={...}``,
                             merged along the MRO, and validated; the guard built: a typo,
                             also a near-miss attribute, fails when the task is defined
``__call__``                 the execution lock, right around ``run`` (Celery's tracer calls a
                             custom ``__call__`` in the worker, with ``apply()`` and with
                             ``task_always_eager``); released in ``finally``
duplicate, skip              ``DUPLICATE`` state stored with the duplicate's details, then
                             :class:`~celery.exceptions.Ignore` (no error, no traceback);
                             inside a workflow (chain, chord, ``link=``, ``link_error=``),
                             :class:`tasklock.DuplicateTask`: Celery drops what follows an
                             ignored task without a word, and fails it for a failed one
duplicate, raise             :class:`tasklock.DuplicateTask` (in ``throws``: logged as expected)
duplicate, retry             ``self.retry(countdown=...)``: 0.5-1 s, then jittered doubling up
                             to the TTL; counts against ``max_retries``
``apply_async``              ``dedupe_enqueue``: claim the pending marker, or return the twin's
                             ``AsyncResult``
run starts                   ``dedupe_enqueue="until_start"``: marker cleared (in the guard);
                             the queued run's duplicate retries never exhaust ``max_retries``;
                             a body's own ``self.retry()`` claims it again
success / final failure      marker cleared (in ``__call__``; hard time limits and lost workers
                             through the ``task_failure`` signal in the worker's main process)
``task_revoked`` signal      marker cleared
===========================  ===================================================================

Rules decided here (also in the README):

* Direct calls ``task(...)`` take the lock too: the promise "this body never runs twice at once for
  one key" holds however the body is reached. A duplicate direct call returns ``None`` (skip) or
  raises :class:`~tasklock.DuplicateTask` (raise, and retry: a direct call cannot be retried).
  ``task.run(...)`` is the raw function, without the lock (unit tests).
* ``apply()`` and ``task_always_eager`` run through Celery's tracer exactly like a worker.
* A skipped call that something waits on (the rest of its chain, its chord, ``link=`` callbacks,
  ``link_error=`` errbacks) fails with :class:`~tasklock.DuplicateTask`, so the workflow fails
  where it can be seen rather than stopping silently; ``"wait"`` and ``"retry"`` are how a
  workflow runs on after the twin instead. A call with nothing attached keeps the ``DUPLICATE``
  state.
* Without ``url``/``urls`` anywhere, the lock lives in the broker's Redis when ``broker_url`` is a
  single ``redis://`` or ``rediss://`` URL; anything else is a
  :class:`~tasklock.ConfigurationError`.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, ParamSpec, TypeVar, cast, overload

from celery import Task, shared_task, signals
from celery import states as celery_states
from celery._state import _task_stack  # type: ignore[attr-defined]
from celery.exceptions import Reject, Retry, TimeLimitExceeded, WorkerLostError
from kombu.utils.uuid import uuid

from tasklock import fleet
from tasklock.celery.options import broker_client, near_miss, seconds_until_due, split_options
from tasklock.celery.outcomes import requeue_when_down, skip_call
from tasklock.celery.rates import defer_call
from tasklock.config import OPTION_NAMES, validate_options
from tasklock.errors import BackendUnavailable, ConfigurationError, DuplicateTask, RateLimited
from tasklock.guard import Duplicate, Guard, Throttle

if TYPE_CHECKING:
    from celery import Celery
    from celery.app.task import Context
    from celery.result import AsyncResult

__all__ = ["DUPLICATE", "RATE_LIMITED", "SingletonTask", "singleton_task"]

log = logging.getLogger("tasklock.celery")

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: Task state stored for a call skipped as a duplicate (``on_duplicate="skip"``). Not one of
#: Celery's ready states: ``AsyncResult.get()`` keeps waiting for it, ``.state``/``.info`` show it.
DUPLICATE = "DUPLICATE"
#: Task state stored for a call skipped by its rate limit (``on_rate_limit="skip"``), like
#: DUPLICATE not a ready state.
RATE_LIMITED = "RATE_LIMITED"

#: A rate-limited call whose slot is nearer than this (seconds) sleeps for it in the worker
#: rather than going through the broker again.
RATE_NEAR = 0.05


#: Options that place a call inside a canvas (group, chord, callbacks). Such a call keeps its own
#: task id, which the workflow waits for, so ``dedupe_enqueue`` never swallows it. ``chain`` is
#: checked apart: the last link of a chain is sent with ``chain=[]``, which is still a chain.
_CANVAS_OPTIONS = ("chord", "group_id")

#: States after which a task id will not run again.
_FINISHED_STATES = frozenset(
    {*celery_states.READY_STATES, DUPLICATE, RATE_LIMITED, celery_states.IGNORED}
)


# -- what CallKey binds calls against -----------------------------------------------------------
def _call_target(run: Any, name: str) -> Callable[..., Any]:
    """The task function as its callers see it: ``self`` removed for bound and class tasks."""
    if isinstance(run, staticmethod):
        return run.__func__
    func = run.__func__ if isinstance(run, classmethod) else run
    if not callable(func):
        raise ConfigurationError(f"task {name}: run must be a function, got {func!r}")
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the signature of task {name}: {exc}") from exc
    params = list(signature.parameters.values())
    if not params or params[0].kind not in (
        params[0].POSITIONAL_ONLY,
        params[0].POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigurationError(
            f"task {name} is bound (bind=True or a Task class), so its first parameter must take "
            "the task instance (self)"
        )

    def stand_in(*args: Any, **kwargs: Any) -> Any:  # only its signature is ever read
        raise NotImplementedError

    stand_in.__signature__ = signature.replace(parameters=params[1:])  # type: ignore[attr-defined]
    return stand_in


def _defines_run(cls: type) -> bool:
    return inspect.getattr_static(cls, "run", None) is not inspect.getattr_static(Task, "run")


# -- the default Redis: the broker's --------------------------------------------------------------
def _unwrap(value: Any) -> Any:
    """An option's value as a class attribute: ``key = staticmethod(...)`` in a class body (so
    that the task's instances do not bind it) stands for the function itself."""
    return value.__func__ if isinstance(value, staticmethod) else value


class SingletonTask(Task):  # type: ignore[type-arg]
    """A Celery task whose body runs at most once at a time per call key.

    Options are class attributes under their own names, which is what Celery makes of the
    keywords in ``@app.task(base=SingletonTask, on_duplicate="retry", ttl=60)``, or go in the
    ``tasklock`` dict (``tasklock={"on_duplicate": "retry"}``). Both are merged along the class
    hierarchy, a subclass's over its bases'; within one class a named attribute wins over the
    same name in the dict, as a keyword does in :func:`singleton_task`. A class attribute that
    looks like an option but is none (``on_duplicat``, ``tasklock_ttl``) is a
    :class:`~tasklock.ConfigurationError` where the class is created, never a silent attribute.
    See :mod:`tasklock.config` for the option names and where else their values may come from.
    """

    #: tasklock options of this task (merged along the class hierarchy).
    tasklock: ClassVar[Mapping[str, Any]] = {}
    throws: tuple[type[Exception], ...] = (DuplicateTask,)

    _tasklock_guard: ClassVar[Guard | None] = None
    #: Attributes a subclass declares as its own API, never read as tasklock options nor
    #: refused as near-misses (:mod:`tasklock.compat.celery_singleton`'s ``on_duplicate()``
    #: method and ``raise_on_duplicate`` setting are the original library's).
    _tasklock_own_attributes: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if DuplicateTask not in cls.throws:
            cls.throws = (*cls.throws, DuplicateTask)
        cls._tasklock_guard = None
        # Validate now, so a bad option fails where the task is defined. Class tasks get their
        # final name at registration; the guard is rebuilt then if it differs.
        name = cls.name or f"{cls.__module__}.{cls.__qualname__}"
        cls._tasklock_check_attributes(name)
        if _defines_run(cls):
            cls._tasklock_guard = cls._tasklock_build_guard(name)
        else:  # a base for other tasks: its options, without a signature to check them against
            validate_options(cls._tasklock_options(name), f"options of {name}")

    @classmethod
    def _tasklock_check_attributes(cls, name: str) -> None:
        """Refuse class attributes that look like a tasklock option but are none.

        ``@app.task(base=SingletonTask, on_duplicat="raise")`` makes ``on_duplicat`` an attribute
        of the class Celery creates, where nothing would ever read it. In a class Celery made
        from a function (``_decorated``) every attribute came from the decorator's keywords, so
        each is checked; in a hand-written class, methods and other descriptors are the class's
        own business and only plain values are. A method there that has an option's name
        (``def key(self, ...)``) is refused too: it would be read as the option, and called
        without ``self``. An attribute a base class declares (``Task``'s own, or an adapter's
        such as :mod:`tasklock.compat`'s ``once`` or ``unique_on``) is that base's option, not
        a near-miss.
        """
        decorated = bool(cls.__dict__.get("_decorated"))
        for attribute, value in cls.__dict__.items():
            code = callable(value) or hasattr(type(value), "__get__")
            if attribute in cls._tasklock_own_attributes:
                continue
            if attribute in OPTION_NAMES:
                if code and not decorated and not isinstance(value, staticmethod):
                    raise ConfigurationError(
                        f"task {name}: {attribute!r} is a tasklock option, but the class defines "
                        f"it as a {type(value).__name__}: give the option's value (for a "
                        f"callable, {attribute} = staticmethod(...)), or rename it"
                    )
                continue
            if (
                attribute.startswith("_")
                or any(attribute in klass.__dict__ for klass in cls.__mro__[1:])
                or (code and not decorated)
            ):
                continue
            problem = near_miss(attribute)
            if problem:
                raise ConfigurationError(f"task {name}: {problem}")

    @classmethod
    def _tasklock_options(cls, name: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            namespace = klass.__dict__
            options = namespace.get("tasklock")
            if options is not None:
                if not isinstance(options, Mapping):
                    raise ConfigurationError(
                        f"tasklock= of task {name} must be a dict of options, got {options!r}"
                    )
                merged.update(options)
            if issubclass(klass, SingletonTask):
                for option in OPTION_NAMES:
                    if option in namespace and option not in cls._tasklock_own_attributes:
                        merged[option] = _unwrap(namespace[option])
        return merged

    @classmethod
    def _tasklock_app(cls) -> Celery:
        app: Celery = cast(Any, cls)._get_app()
        return app

    @classmethod
    def _tasklock_build_guard(cls, name: str) -> Guard:
        found: list[tuple[int, Any]] = []  # (pid, client): read once per process, like options

        def default_client() -> Any:
            if not found or found[0][0] != os.getpid():
                found[:] = [(os.getpid(), broker_client(cls._tasklock_app(), name))]
            return found[0][1]

        return Guard(
            _call_target(inspect.getattr_static(cls, "run"), name),
            name,
            cls._tasklock_options(name),
            conf=lambda: cls._tasklock_app().conf,
            default_client=default_client,
        )

    @property
    def tasklock_guard(self) -> Guard:
        """The :class:`~tasklock.guard.Guard` of this task (its keys, options, markers)."""
        cls = type(self)
        guard = cls.__dict__.get("_tasklock_guard")
        if guard is None or guard.name != self.name:
            guard = cls._tasklock_guard = cls._tasklock_build_guard(self.name)
        return guard

    # -- execution -------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request_stack.top
        if (
            request is not None
            and not request.called_directly
            and not vars(request).get("_tasklock_entered")
        ):
            # Called by Celery's tracer (worker, apply(), task_always_eager): it has pushed the
            # request already, so run the body directly, as Celery's docs ask of a custom
            # __call__.
            setattr(request, "_tasklock_entered", True)  # noqa: B010
            return self._tasklock_execute(request, args, kwargs, direct=False)
        # A direct call task(...): what Task.__call__ does, under the lock.
        _task_stack.push(self)
        self.push_request(args=args, kwargs=kwargs)
        try:
            return self._tasklock_execute(self.request, args, kwargs, direct=True)
        finally:
            self.pop_request()
            _task_stack.pop()

    def _tasklock_execute(
        self, request: Context, args: tuple[Any, ...], kwargs: dict[str, Any], *, direct: bool
    ) -> Any:
        guard = self.tasklock_guard
        run = self.run
        started = False

        def body(extra: dict[str, Any]) -> Any:
            nonlocal started
            started = True
            try:
                if extra:
                    setattr(request, "fence_token", next(iter(extra.values())))  # noqa: B010
                    return run(*args, **{**kwargs, **extra})
                return run(*args, **kwargs)
            except Retry as retry:
                # The body asked for a retry (self.retry(), autoretry_for): with
                # dedupe_enqueue="until_start" the retry is pending work again. Claimed here,
                # while this attempt still holds the lock, so the retry cannot start first.
                if not direct and request.id:
                    when = retry.when if isinstance(retry.when, int | float) else 0.0
                    guard.pending_again(args, kwargs, request.id, delay=float(when))
                raise

        if direct:
            on_skip: Callable[[Duplicate], Any] = _skip_direct
            on_retry: Callable[[Duplicate], Any] = _raise_duplicate
            on_rate: Callable[[Throttle], Any] = _skip_direct
        else:
            on_skip, on_retry, on_rate = self._tasklock_policies(request, guard)
        try:
            result = guard.run(
                args,
                kwargs,
                body,
                task_id=None if direct else request.id,
                on_skip=on_skip,
                on_retry=on_retry,
                duplicate_error=DuplicateTask,
                on_rate_limit=on_rate,
                rate_near=None if direct or request.is_eager else RATE_NEAR,
            )
        except Retry:
            raise  # the pending marker survives retries
        except Reject as exc:
            if not getattr(exc, "requeue", False) and not direct:
                guard.clear_pending(args, kwargs, request.id)
            raise
        except BackendUnavailable as exc:
            if not direct:
                if not started:
                    self._tasklock_backend_down(request, exc)  # Reject(requeue) with acks_late
                guard.clear_pending(args, kwargs, request.id)
            raise
        except Exception:
            if not direct:
                guard.clear_pending(args, kwargs, request.id)
            raise
        if not direct:
            guard.clear_pending(args, kwargs, request.id)
        return result

    def _tasklock_policies(
        self, request: Context, guard: Guard
    ) -> tuple[Callable[[Duplicate], Any], Callable[[Duplicate], Any], Callable[[Throttle], Any]]:
        """What a call run by a worker does when it is a duplicate (skip: a DUPLICATE state;
        retry: Celery's retry, or a queued run's with until_start) or over its rate (re-sent for
        its slot, or a RATE_LIMITED state). A direct call raises or skips instead."""

        def on_skip(duplicate: Duplicate) -> Any:
            error = DuplicateTask(duplicate.message(), duplicate.key, duplicate.holder)
            self._tasklock_skip(request, DUPLICATE, duplicate.as_meta(), error)

        def on_rate(throttle: Throttle) -> Any:
            if throttle.policy == "retry":
                raise defer_call(self, request, throttle)
            error = RateLimited(throttle.message(), throttle.key, throttle.retry_after)
            self._tasklock_skip(request, RATE_LIMITED, throttle.as_meta(), error)

        def on_retry(duplicate: Duplicate) -> Any:
            error = DuplicateTask(duplicate.message(), duplicate.key, duplicate.holder)
            if guard.options.dedupe_enqueue == "until_start" and not request.is_eager:
                raise self._tasklock_retry_queued(request, duplicate, error)
            # Celery retries like any other: they count against max_retries, which also shapes
            # the delays (the last retry allowed waits up to a TTL).
            countdown = guard.retry_delay(
                duplicate, attempt=request.retries or 0, max_retries=self.max_retries
            )
            raise self.retry(exc=error, countdown=countdown)

        return on_skip, on_retry, on_rate

    def _tasklock_retry_queued(
        self, request: Context, duplicate: Duplicate, error: DuplicateTask
    ) -> Retry:
        """Retry the queued run of ``dedupe_enqueue="until_start"`` until the running one is done.

        It stands for every submission that returned its handle, so it must not run out of
        retries while the run ahead of it lasts: this retry is always allowed (``max_retries``
        is raised to it for this call only), and the delays double up to the TTL as for
        ``max_retries=None``. The retries still count in ``request.retries``. Eager calls keep
        Celery's limit: they retry at once, in a loop, with no worker to wait in.
        """
        countdown = self.tasklock_guard.retry_delay(duplicate, attempt=request.retries or 0)
        overridden = "override_max_retries" in vars(self)
        try:
            return self.retry(
                exc=error, countdown=countdown, max_retries=(request.retries or 0) + 1
            )
        finally:
            # Task.retry leaves max_retries= on the (shared) task instance, where autoretry_for
            # would read it for the next call of this task.
            if not overridden:
                vars(self).pop("override_max_retries", None)

    def _tasklock_skip(
        self, request: Context, state: str, meta: dict[str, Any], error: Exception
    ) -> None:
        """Record the skip as ``state`` with ``meta``, then Ignore (see :func:`skip_call`)."""
        skip_call(self, request, state, meta, error)

    def _tasklock_backend_down(self, request: Context, exc: Exception) -> None:
        """Redis is unreachable: requeue with ``acks_late`` (see :func:`requeue_when_down`)."""
        requeue_when_down(self, request, exc)

    # -- enqueue ---------------------------------------------------------------------------------
    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> AsyncResult[Any]:
        """Send the task; with ``dedupe_enqueue``, return the pending twin's result instead."""
        guard = self.tasklock_guard
        if (
            not guard.options.dedupe_enqueue
            or link
            or link_error
            or options.get("chain") is not None
            or any(options.get(name) for name in _CANVAS_OPTIONS)
        ):
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        current = self.request_stack.top
        # self.retry() re-sends under the running task's id: that message must go, and the
        # marker (already ours) stays.
        own_retry = task_id is not None and current is not None and current.id == task_id
        task_id = task_id or uuid()
        claimed = False
        if not own_retry:
            call_args, call_kwargs = args or (), kwargs or {}
            try:
                existing = guard.claim_pending(
                    call_args,
                    call_kwargs,
                    task_id,
                    is_pending=self._tasklock_is_pending,
                    delay=seconds_until_due(options, self._tasklock_app()),
                    ttl=self._tasklock_pending_ttl(),
                )
            except BackendUnavailable as exc:
                if guard.options.on_backend_error != "run":
                    raise
                log.warning(
                    "%s: sent without enqueue deduplication, the lock store is unreachable "
                    "(on_backend_error='run'): %s",
                    self.name,
                    exc,
                )
            else:
                if existing is not None:
                    return self._tasklock_pending_twin(existing, call_args, call_kwargs)
                claimed = True
        try:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        except BaseException:
            if claimed:
                guard.clear_pending(args or (), kwargs or {}, task_id)
            raise

    def _tasklock_pending_ttl(self) -> float | None:
        """How long this call's enqueue marker lives (before a countdown/eta); None for
        ``pending_ttl``. A hook for adapters whose callers choose it per call."""
        return None

    def _tasklock_pending_twin(self, task_id: str, args: Any, kwargs: Any) -> AsyncResult[Any]:
        """What ``apply_async`` returns when ``dedupe_enqueue`` finds task ``task_id`` pending
        for the same call: its result. A hook for adapters that answer otherwise (raise, or an
        empty result), as the libraries :mod:`tasklock.compat` stands in for do."""
        return self.AsyncResult(task_id)

    def _tasklock_is_pending(self, task_id: str) -> bool:
        """False when the result backend says the marker's task is over (a missed clean-up, e.g.
        a worker killed outright). Unknown (no backend, ignored results, backend down) counts as
        pending: better one refused enqueue than a twin queued twice."""
        try:
            state = self.AsyncResult(task_id).state
        except Exception:
            return True
        return state not in _FINISHED_STATES


def _skip_direct(refusal: Duplicate | Throttle) -> None:
    return None


def _raise_duplicate(duplicate: Duplicate) -> Any:
    raise DuplicateTask(duplicate.message(), duplicate.key, duplicate.holder)


# -- markers of work that ends outside __call__ -------------------------------------------------
def _on_failure(
    sender: Any = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    # Failures raised inside __call__ were handled there; these end in the worker's main process
    # (the child was killed by a hard time limit, a signal or the OOM killer).
    if isinstance(sender, SingletonTask) and isinstance(
        exception, TimeLimitExceeded | WorkerLostError
    ):
        sender.tasklock_guard.clear_pending(args or (), kwargs or {}, task_id)


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if isinstance(sender, SingletonTask) and request is not None:
        sender.tasklock_guard.clear_pending(
            getattr(request, "args", None) or (),
            getattr(request, "kwargs", None) or {},
            getattr(request, "id", None),
        )


signals.task_failure.connect(_on_failure, weak=False, dispatch_uid="tasklock.celery.failure")
# A pool child that ends (max_tasks_per_child, shutdown) writes the counts its thread had not.
signals.worker_process_shutdown.connect(
    lambda **_: fleet.flush(), weak=False, dispatch_uid="tasklock.celery.fleet"
)
signals.task_revoked.connect(_on_revoked, weak=False, dispatch_uid="tasklock.celery.revoked")


# -- the decorator -------------------------------------------------------------------------------
@overload
def singleton_task(func: Callable[_P, _R], /) -> Task[_P, _R]: ...


@overload
def singleton_task(
    *, app: Celery | None = None, **options: Any
) -> Callable[[Callable[_P, _R]], Task[_P, _R]]: ...


def singleton_task(func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Register a singleton task, like ``shared_task`` (no ``app``) or ``app.task``.

    ``options`` holds tasklock's options (``ttl``, ``key``, ``on_duplicate``, ... or a
    ``tasklock={...}`` dict) and Celery's own task options (``bind``, ``name``, ``acks_late``,
    ``max_retries``, ``base`` - a subclass of :class:`SingletonTask` - ...), which pass through.
    Options are validated here, when the task is defined.
    """
    app: Celery | None = options.pop("app", None)
    base = options.pop("base", SingletonTask)
    explicit = dict(options.pop("tasklock", None) or {})

    def decorate(fun: Callable[..., Any]) -> Any:
        name = options.get("name") or f"{fun.__module__}.{fun.__qualname__}"
        if not (isinstance(base, type) and issubclass(base, SingletonTask)):
            raise ConfigurationError(
                f"singleton_task {name}: base must be a subclass of "
                f"tasklock.celery.SingletonTask, got {base!r} "
                f"(write `class MyBase(SingletonTask, {getattr(base, '__name__', base)})`)"
            )
        celery_options = dict(options)
        tasklock = {**explicit, **split_options(celery_options, name)}
        # Validate now: with an app that is not finalized yet, Celery creates the class later.
        Guard(
            _call_target(fun if celery_options.get("bind") else staticmethod(fun), name),
            name,
            {**base._tasklock_options(name), **tasklock},
        )
        celery_options.update(base=base, tasklock=tasklock)
        if app is None:
            return shared_task(**celery_options)(fun)
        return app.task(**celery_options)(fun)

    if func is not None:
        return decorate(func)
    return decorate
