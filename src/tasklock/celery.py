"""Celery adapter: the :class:`SingletonTask` base and the :func:`singleton_task` decorator.

Everything that is policy (key, duplicate handling, fencing, watchdog, enqueue marker) lives in
:class:`tasklock.guard.Guard`; this module only maps Celery's hooks onto it:

===========================  ===================================================================
Celery hook                  what tasklock does there
===========================  ===================================================================
class creation               options validated (``tasklock={...}`` merged along the MRO), the
                             guard built: a typo fails when the task is defined
``__call__``                 the execution lock, right around ``run`` (Celery's tracer calls a
                             custom ``__call__`` in the worker, with ``apply()`` and with
                             ``task_always_eager``); released in ``finally``
duplicate, skip              ``DUPLICATE`` state stored with the duplicate's details, then
                             :class:`~celery.exceptions.Ignore` (no error, no traceback);
                             inside a chord, :class:`tasklock.DuplicateTask` (an ignored part
                             would leave the chord waiting for ever)
duplicate, raise             :class:`tasklock.DuplicateTask` (in ``throws``: logged as expected)
duplicate, retry             ``self.retry(countdown=<holder's TTL left + jitter>)``
``apply_async``              ``dedupe_enqueue``: claim the pending marker, or return the twin's
                             ``AsyncResult``
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
* Without ``url``/``urls`` anywhere, the lock lives in the broker's Redis when ``broker_url`` is a
  single ``redis://`` or ``rediss://`` URL; anything else is a
  :class:`~tasklock.ConfigurationError`.
"""

from __future__ import annotations

import datetime
import difflib
import inspect
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, ParamSpec, TypeVar, cast, overload
from urllib.parse import urlsplit

from celery import Task, shared_task, signals
from celery import states as celery_states
from celery._state import _task_stack  # type: ignore[attr-defined]
from celery.exceptions import Ignore, Reject, Retry, TimeLimitExceeded, WorkerLostError
from kombu.utils.url import maybe_sanitize_url
from kombu.utils.uuid import uuid

from tasklock.config import OPTION_NAMES
from tasklock.core.connection import client_for_url
from tasklock.errors import BackendUnavailable, ConfigurationError, DuplicateTask
from tasklock.guard import Duplicate, Guard

if TYPE_CHECKING:
    from celery import Celery
    from celery.app.task import Context
    from celery.result import AsyncResult

__all__ = ["DUPLICATE", "SingletonTask", "singleton_task"]

log = logging.getLogger("tasklock.celery")

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: Task state stored for a call skipped as a duplicate (``on_duplicate="skip"``). Not one of
#: Celery's ready states: ``AsyncResult.get()`` keeps waiting for it, ``.state``/``.info`` show it.
DUPLICATE = "DUPLICATE"

#: How long a worker waits before handing a message back when Redis is unreachable
#: (``acks_late``), so that an outage is not a hot redelivery loop.
REQUEUE_PAUSE = 1.0

#: Options that place a call inside a canvas (group, chord, chain, callbacks). Such a call keeps
#: its own task id, which the workflow waits for, so ``dedupe_enqueue`` never swallows it.
_CANVAS_OPTIONS = ("chord", "group_id", "chain")

#: States after which a task id will not run again.
_FINISHED_STATES = frozenset({*celery_states.READY_STATES, DUPLICATE, celery_states.IGNORED})


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
def _broker_client(app: Celery, task_name: str) -> Any:
    """The broker's Redis, used for locks when no ``url``/``urls`` is configured anywhere."""
    raw = app.conf.broker_url
    if isinstance(raw, str):
        urls = [u.strip() for u in raw.split(";") if u.strip()]
    elif isinstance(raw, list | tuple):
        urls = [u.strip() for u in raw if isinstance(u, str) and u.strip()]
    else:
        urls = []
    where = (
        "pass url='redis://...' to the task, or set Celery's tasklock_url "
        "(Django: CELERY_TASKLOCK_URL), or the TASKLOCK_URL environment variable"
    )
    if not urls:
        raise ConfigurationError(
            f"no Redis configured for tasklock (task {task_name}) and Celery's broker_url is not "
            f"set: {where}"
        )
    if len(set(urls)) > 1:
        raise ConfigurationError(
            f"task {task_name}: broker_url lists several brokers for failover "
            f"({', '.join(maybe_sanitize_url(u) for u in urls)}); every worker must lock on the "
            f"same Redis, so choose it explicitly: {where}"
        )
    url = urls[0]
    if urlsplit(url).scheme not in ("redis", "rediss"):
        raise ConfigurationError(
            f"task {task_name}: no Redis configured for tasklock, and the broker "
            f"{maybe_sanitize_url(url)} is not a redis:// or rediss:// URL that could serve: "
            f"{where}"
        )
    return client_for_url(url)


def _ignores_result(task: Task[Any, Any], request: Context) -> bool:
    explicit = vars(request).get("ignore_result")
    return bool(task.ignore_result if explicit is None else explicit)


class SingletonTask(Task):  # type: ignore[type-arg]
    """A Celery task whose body runs at most once at a time per call key.

    Options go in the ``tasklock`` class attribute (a dict; subclasses' dicts are merged over their
    bases'), e.g. ``@app.task(base=SingletonTask, tasklock={"on_duplicate": "retry"})``. See
    :mod:`tasklock.config` for the option names and where else their values may come from.
    """

    #: tasklock options of this task (merged along the class hierarchy).
    tasklock: ClassVar[Mapping[str, Any]] = {}
    throws: tuple[type[Exception], ...] = (DuplicateTask,)

    _tasklock_guard: ClassVar[Guard | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if DuplicateTask not in cls.throws:
            cls.throws = (*cls.throws, DuplicateTask)
        cls._tasklock_guard = None
        if _defines_run(cls):
            # Validate now, so a bad option fails where the task is defined. Class tasks get
            # their final name at registration; the guard is rebuilt then if it differs.
            name = cls.name or f"{cls.__module__}.{cls.__qualname__}"
            cls._tasklock_guard = cls._tasklock_build_guard(name)

    @classmethod
    def _tasklock_options(cls, name: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            options = klass.__dict__.get("tasklock")
            if options is None:
                continue
            if not isinstance(options, Mapping):
                raise ConfigurationError(
                    f"tasklock= of task {name} must be a dict of options, got {options!r}"
                )
            merged.update(options)
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
                found[:] = [(os.getpid(), _broker_client(cls._tasklock_app(), name))]
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
            if extra:
                setattr(request, "fence_token", next(iter(extra.values())))  # noqa: B010
                return run(*args, **{**kwargs, **extra})
            return run(*args, **kwargs)

        if direct:
            on_skip: Callable[[Duplicate], Any] = _skip_direct
            on_retry: Callable[[Duplicate], Any] = _raise_duplicate
        else:

            def on_skip(duplicate: Duplicate) -> Any:
                self._tasklock_skip(request, duplicate)

            def on_retry(duplicate: Duplicate) -> Any:
                error = DuplicateTask(duplicate.message(), duplicate.key, duplicate.holder)
                raise self.retry(exc=error, countdown=guard.retry_delay(duplicate))

        try:
            result = guard.run(
                args,
                kwargs,
                body,
                task_id=None if direct else request.id,
                on_skip=on_skip,
                on_retry=on_retry,
                duplicate_error=DuplicateTask,
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

    def _tasklock_skip(self, request: Context, duplicate: Duplicate) -> None:
        """Record the skip as the DUPLICATE state (where results are stored), then Ignore.

        Inside a chord the member fails with DuplicateTask instead: Celery reports a chord part
        only when it succeeds or fails, never when it is ignored, so a skipped member would leave
        the chord waiting for ever, its callback never run. Failing it makes the chord fail with
        a ChordError that names the duplicate, and run its error callbacks.
        """
        if request.chord:
            log.warning(
                "%s[%s]: skipped as a duplicate inside a chord; failing it with DuplicateTask so "
                "that the chord does not wait for ever (use on_duplicate='wait' or 'retry' for "
                "chord members)",
                self.name,
                request.id,
            )
            raise DuplicateTask(duplicate.message(), duplicate.key, duplicate.holder)
        store = not _ignores_result(self, request) and (
            not request.is_eager or bool(getattr(self, "store_eager_result", False))
        )
        if store and request.id:
            try:
                self.update_state(task_id=request.id, state=DUPLICATE, meta=duplicate.as_meta())
            except NotImplementedError:
                pass  # no result backend configured: nothing to record
            except Exception as exc:
                log.warning("%s: could not store the DUPLICATE state: %r", self.name, exc)
        raise Ignore(duplicate.message())

    def _tasklock_backend_down(self, request: Context, exc: Exception) -> None:
        """Redis for the lock is unreachable and on_backend_error="raise": lose nothing.

        With ``acks_late`` the message goes back to the queue (after a short pause, so an outage
        is no hot loop) and runs once Redis is back; otherwise the task fails with the error.
        """
        if request.is_eager or not self.acks_late:
            return
        log.error(
            "%s[%s]: Redis for the lock is unreachable; the message is requeued (acks_late) "
            "and will run once Redis answers: %s",
            self.name,
            request.id,
            exc,
        )
        time.sleep(REQUEUE_PAUSE)
        # The error above says what happened; Celery logs the Reject (a warning) without a chain.
        raise Reject(f"lock Redis unreachable: {exc}", requeue=True) from None

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
                    delay=_seconds_until_due(options),
                )
            except BackendUnavailable as exc:
                if guard.options.on_backend_error != "run":
                    raise
                log.warning(
                    "%s: sent without enqueue deduplication, Redis is unreachable "
                    "(on_backend_error='run'): %s",
                    self.name,
                    exc,
                )
            else:
                if existing is not None:
                    return self.AsyncResult(existing)
                claimed = True
        try:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        except BaseException:
            if claimed:
                guard.clear_pending(args or (), kwargs or {}, task_id)
            raise

    def _tasklock_is_pending(self, task_id: str) -> bool:
        """False when the result backend says the marker's task is over (a missed clean-up, e.g.
        a worker killed outright). Unknown (no backend, ignored results, backend down) counts as
        pending: better one refused enqueue than a twin queued twice."""
        try:
            state = self.AsyncResult(task_id).state
        except Exception:
            return True
        return state not in _FINISHED_STATES


def _seconds_until_due(options: Mapping[str, Any]) -> float:
    """How far ahead a ``countdown``/``eta`` schedules the call (0 for now)."""
    countdown, eta = options.get("countdown"), options.get("eta")
    if isinstance(countdown, int | float):
        return max(0.0, float(countdown))
    if isinstance(eta, datetime.datetime):
        return max(0.0, eta.timestamp() - time.time())
    return 0.0


def _skip_direct(duplicate: Duplicate) -> None:
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
signals.task_revoked.connect(_on_revoked, weak=False, dispatch_uid="tasklock.celery.revoked")


# -- the decorator -------------------------------------------------------------------------------
def _split_options(options: dict[str, Any], name: str) -> dict[str, Any]:
    """Take tasklock's options out of ``options`` (the rest is Celery's); catch near-miss typos,
    which Celery would otherwise keep silently as a custom task attribute."""
    ours = {k: options.pop(k) for k in OPTION_NAMES if k in options}
    for key in options:
        if hasattr(Task, key):
            continue
        close = difflib.get_close_matches(key, OPTION_NAMES, n=1, cutoff=0.8)
        if close:
            raise ConfigurationError(
                f"singleton_task {name}: unknown option {key!r}; did you mean {close[0]!r}? "
                f"(tasklock options: {', '.join(OPTION_NAMES)})"
            )
    return ours


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
        tasklock = {**explicit, **_split_options(celery_options, name)}
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
