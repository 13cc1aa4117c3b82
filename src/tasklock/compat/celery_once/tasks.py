"""``QueueOnce`` and ``AlreadyQueued``: celery-once's task base and error, on tasklock.

The original's observable behaviour is kept: ``delay()``/``apply_async()`` of a call that is
already queued or running raises :class:`AlreadyQueued` (or, with ``graceful``, returns an empty
result and sends nothing); the key is ``qo_<task>_<arg>-<value>...``; ``once={"keys", "graceful",
"timeout", "unlock_before_run"}`` on the task and ``apply_async(once={"graceful", "timeout"})``
per call; ``app.conf.ONCE = {"backend": ..., "settings": {...}}``.

On tasklock's rules (the marker is a :class:`tasklock.celery.SingletonTask` enqueue marker, see
:mod:`tasklock.compat.base`): the marker holds the task id and only that task clears it; it is
cleared on success, final failure, revoke, hard time limit, a killed pool child and a failed
publish; a retry is never refused as its own duplicate; the timeout runs from the enqueue plus a
``countdown``/``eta``, and again from the start of the run.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar

from celery import Task, states
from celery.result import EagerResult

from tasklock.celery.task import _call_target
from tasklock.compat.base import CompatGuard, CompatTask
from tasklock.compat.celery_once.helpers import call_arguments, import_backend, queue_once_key
from tasklock.errors import ConfigurationError

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from tasklock.backends import MarkerStore

__all__ = ["ONCE_OPTIONS", "PER_CALL_OPTIONS", "AlreadyQueued", "QueueOnce"]

#: What ``once={...}`` takes on a task, and per call in ``apply_async(once={...})``.
ONCE_OPTIONS = ("graceful", "keys", "timeout", "unlock_before_run")
PER_CALL_OPTIONS = ("graceful", "timeout")

#: The timeout of the ``apply_async`` running in this context (its ``once={"timeout": ...}``).
_call_timeout: ContextVar[float | None] = ContextVar("tasklock_once_timeout", default=None)


class AlreadyQueued(Exception):
    """The call is already queued or running. ``countdown``: seconds until its marker expires.

    ``args`` is ``(countdown,)``, so that pickle and Celery's JSON result backend (which
    rebuild an exception as ``cls(*args)``) give it back whole; ``str()`` is the message.
    """

    def __init__(self, countdown: float) -> None:
        self.countdown = countdown
        self.message = f"Expires in {countdown} seconds"
        super().__init__(countdown)

    def __str__(self) -> str:
        return self.message


def _timeout(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigurationError(
            f"{where} must be a number of seconds above 0 (the marker's TTL), got {value!r}"
        )
    return float(value)


def _check_once(once: Any, name: str, allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(once, Mapping):
        raise ConfigurationError(f"{where} of {name} must be a dict, got {once!r}")
    unknown = sorted(set(once) - set(allowed))
    if unknown:
        raise ConfigurationError(
            f"{where} of {name}: unknown option(s) {', '.join(map(repr, unknown))}; "
            f"it takes {', '.join(allowed)}"
        )
    return dict(once)


class _ProtocolMarkers:
    """A custom backend of the original's protocol (``raise_or_lock(key, timeout)``, which raises
    :class:`AlreadyQueued`, and ``clear_lock(key)``) as tasklock's marker store.

    The protocol has no owner, so a run clears its key at most once (``unlock_before_run`` clears
    it at the start; the end must not clear the next submission's marker): remembered in this
    process, where both happen."""

    _cleared: ClassVar[dict[tuple[str, str], None]] = {}

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def claim(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        seconds = ttl_ms / 1000
        self.backend.raise_or_lock(key, timeout=int(seconds) if seconds.is_integer() else seconds)
        return None

    def renew(self, key: str, task_id: str, ttl_ms: int, what: str) -> str | None:
        return None

    def delete_if(self, key: str, task_id: str, what: str) -> bool:
        if (key, task_id) in self._cleared:
            return False
        self._cleared[(key, task_id)] = None
        while len(self._cleared) > 1024:
            del self._cleared[next(iter(self._cleared))]
        self.backend.clear_lock(key)
        return True


class QueueOnce(CompatTask):
    """A task that is queued at most once per key until it finishes (celery-once's base).

    ``@app.task(base=QueueOnce, once={"graceful": True, "keys": ["user_id"], "timeout": 600})``.
    """

    abstract = True
    _tasklock_own_attributes = frozenset({"once"})
    once: ClassVar[dict[str, Any]] = {"graceful": False, "unlock_before_run": False}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.name or f"{cls.__module__}.{cls.__qualname__}"
        once = _check_once(cls.once, name, ONCE_OPTIONS, "once=")
        if "timeout" in once:
            _timeout(once["timeout"], f"once['timeout'] of {name}")
        keys = once.get("keys")
        run = inspect.getattr_static(cls, "run", None)
        if keys is not None and run is not None and run is not inspect.getattr_static(Task, "run"):
            if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
                raise ConfigurationError(
                    f"once['keys'] of {name} must be a list of argument names, got {keys!r}"
                )
            params = inspect.signature(_call_target(run, name)).parameters
            missing = [k for k in keys if k not in params]
            if missing and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                raise ConfigurationError(
                    f"once['keys'] of {name} names {', '.join(map(repr, missing))}, but it takes "
                    f"({', '.join(params) or 'no arguments'})"
                )

    # -- the original's configuration properties ------------------------------------------------
    @property
    def config(self) -> Any:
        return self._compat_app().conf

    @property
    def once_config(self) -> Mapping[str, Any]:
        once = self.config.get("ONCE")
        if once is None:
            raise ConfigurationError(
                f"task {self.name} is a QueueOnce task, but app.conf.ONCE is not set: set "
                "ONCE = {'backend': 'celery_once.backends.Redis', 'settings': {'url': "
                "'redis://host:6379/0', 'default_timeout': 3600}}"
            )
        return once  # type: ignore[no-any-return]

    @property
    def once_backend(self) -> Any:
        return import_backend(self.once_config)

    @property
    def default_timeout(self) -> float:
        settings = self.once_config.get("settings") or {}
        value = settings.get("default_timeout", 60 * 60)
        _timeout(value, "ONCE['settings']['default_timeout']")
        return value  # type: ignore[no-any-return]

    def unlock_before_run(self) -> bool:
        return bool(self.once.get("unlock_before_run", False))

    # -- keys ------------------------------------------------------------------------------------
    def _run_signature(self) -> inspect.Signature:
        """The signature of the task's ``run`` (``autoretry_for`` wraps it: the original's),
        kept per function: ``inspect.signature`` cost each enqueue more than its claim's Python
        (the original asked for it per call too)."""
        run = getattr(self, "_orig_run", self.run)
        key = (getattr(run, "__func__", run), hasattr(run, "__self__"))
        kept = self.__dict__.get("_tasklock_run_signature")
        if kept is None or kept[0] != key:
            kept = (key, inspect.signature(run))
            self.__dict__["_tasklock_run_signature"] = kept
        return kept[1]

    def _get_call_args(self, args: Any, kwargs: Any) -> dict[str, Any]:
        try:
            bound = self._run_signature().bind(*(args or ()), **(kwargs or {}))
        except TypeError as exc:
            raise TypeError(f"arguments do not match task {self.name}: {exc}") from None
        call_args = dict(bound.arguments)
        if isinstance(call_args.get("self"), Task):
            del call_args["self"]
        return call_args

    def get_key(self, args: Any = None, kwargs: Any = None) -> str:
        """The call's key: ``qo_<task name>_<arg>-<value>_...`` (or only ``once["keys"]``).

        A name in ``keys`` that the call leaves to its default is keyed with the default (the
        original raised KeyError there)."""
        restrict_to = self.once.get("keys")
        call_args = self._get_call_args(args, kwargs)
        if restrict_to is not None:
            params = self._run_signature().parameters
            for name in restrict_to:
                if name not in call_args and name in params:
                    default = params[name].default
                    call_args[name] = None if default is inspect.Parameter.empty else default
        return queue_once_key(self.name, call_arguments(call_args), restrict_to)

    # -- tasklock's guard ------------------------------------------------------------------------
    def _once_markers(self) -> MarkerStore:
        backend = self.once_backend
        if all(hasattr(backend, m) for m in ("claim", "renew", "delete_if")):
            return backend  # type: ignore[no-any-return]
        return _ProtocolMarkers(backend)

    def _once_client(self) -> Any:
        return getattr(self.once_backend, "redis", None)

    def _compat_build_guard(self) -> CompatGuard:
        timeout = self.once.get("timeout", self.default_timeout)
        options: dict[str, Any] = {"limit": None, "pending_ttl": timeout, "dedupe_enqueue": True}
        if self.unlock_before_run():
            # Cleared as the run starts (tasklock's until_start); nothing to wait for: no lock.
            options.update(dedupe_enqueue="until_start", on_duplicate="retry")
        return CompatGuard(
            self.name,
            options,
            conf=lambda: self._compat_app().conf,
            key=self.get_key,
            markers=self._once_markers,
            client=self._once_client,
        )

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
        """Queue the task, or raise :class:`AlreadyQueued` if its twin is queued or running.

        ``once={"graceful": True}`` returns an empty result (state ``REJECTED``, ``result``
        None) instead; ``once={"timeout": s}`` sets this call's marker TTL."""
        once = _check_once(options.pop("once", None) or {}, self.name, PER_CALL_OPTIONS, "once=")
        graceful = once.get("graceful", self.once.get("graceful", False))
        timeout = once.get("timeout", self.once.get("timeout"))
        if timeout is not None:
            timeout = _timeout(timeout, f"once['timeout'] of {self.name}")
        token = _call_timeout.set(timeout)
        try:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        except AlreadyQueued:
            if graceful:
                # The original's empty result: no task id, nothing sent.
                return EagerResult(None, None, states.REJECTED)  # type: ignore[arg-type]
            raise
        finally:
            _call_timeout.reset(token)

    def _tasklock_pending_ttl(self) -> float | None:
        return _call_timeout.get()

    def _tasklock_pending_twin(self, task_id: str, args: Any, kwargs: Any) -> AsyncResult[Any]:
        store = self.tasklock_guard._markers()
        countdown = getattr(store, "countdown", None)
        seconds = countdown(self.get_key(args, kwargs)) if countdown is not None else None
        raise AlreadyQueued(
            seconds if seconds is not None else self.tasklock_guard.options.pending_ttl
        )

    def after_return(self, *args: Any, **kwargs: Any) -> None:
        """The marker is cleared by tasklock (success, failure, revoke, kills), not here; kept so
        that subclasses that override it (and call super) keep working, and Celery calls it."""
        super().after_return(*args, **kwargs)
