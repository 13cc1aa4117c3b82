"""OpenTelemetry spans around each execution-lock acquire and each hold of the task layer.

Why spans and not only the counters: a task that is slow because it waited for its twin, or that
did nothing because it was a duplicate, looks like any other slow or empty run in a trace. Two
spans, children of the task's own span, say which it was and how long each part took:

``tasklock.acquire``
    From the start of the acquire to its outcome. Attributes:

    * ``tasklock.task``: the task's name;
    * ``tasklock.lock.name``: the lock's key (``tasklock:{<task>}:lock:<args>``);
    * ``tasklock.outcome``: ``acquired``, ``duplicate_<policy>`` (``duplicate_skip``,
      ``duplicate_raise``, ``duplicate_retry``, or the ``on_wait_timeout`` policy after a ``wait``
      timed out), ``backend_error``, ``ran_unlocked`` or ``interrupted``;
    * ``tasklock.waited``: seconds spent waiting for the lock (a float; ``0.0`` when the call did
      not wait);
    * ``tasklock.fence``: the hold's fencing token, when the lock gave one (after ``acquired``
      only: a duplicate or an unlocked run holds nothing).

    Status ERROR for ``backend_error`` (the lock store was unreachable and the task fails) and
    ``interrupted`` (an exception such as a time limit landed during the acquire); every other
    outcome is a decision, not a failure, and leaves the status unset.

``tasklock.hold``
    The task's body under the lock (or without it after ``ran_unlocked``): it follows
    ``acquired`` and ``ran_unlocked`` only, so a duplicate has an acquire span and no hold span.
    It is the *current* span while the body runs, so spans the body starts (an HTTP call, a
    query) are its children. Attributes: ``tasklock.task``, ``tasklock.lock.name``,
    ``tasklock.outcome`` (the acquire's: ``acquired`` or ``ran_unlocked``) and ``tasklock.fence``
    (when set). An exception from the body is recorded on it (an ``exception`` event) with status
    ERROR, except Celery's control-flow exceptions ``Retry``, ``Ignore`` and ``Reject``: the task
    asked for them, Celery does not count them as failures (no ``task_failure``, and Celery's own
    instrumentation leaves the task's span unset), so neither does the hold; their class is kept
    in ``tasklock.control_flow`` (e.g. ``celery.exceptions.Retry``) instead.

Both spans are siblings under the span current at the acquire (the task's span, when one is):
the acquire ends before the hold starts.

Turning it on with Celery: in the worker, in each process that runs tasks, hence
``worker_process_init``, which runs in every prefork child after the fork (and with the solo
pool); with the threads, gevent or eventlet pools (no pool processes) use ``worker_init``.
``opentelemetry-instrumentation-celery`` makes the task's ``run/<task name>`` span current around
the body, so both spans are its children (and, with it on the producer's side too, the task's
span continues the trace that sent it)::

    from celery.signals import worker_process_init
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    import tasklock.opentelemetry

    @worker_process_init.connect(weak=False)
    def init_tracing(*args, **kwargs):
        # set up your TracerProvider and exporter here, in the child
        CeleryInstrumentor().instrument()
        tasklock.opentelemetry.instrument()

With RQ: there is no official OpenTelemetry instrumentation for RQ, so the spans are children of
whatever span is current when the job runs, which is none unless you start one: without it each
job's ``tasklock.acquire`` and ``tasklock.hold`` are two root spans (two traces). A span of your
own around the job puts them in one trace, e.g. in a worker class of your own (``rq worker -w
myapp.TracedWorker``); the work horse leaves with ``os._exit``, so flush before it does::

    class TracedWorker(rq.Worker):
        def perform_job(self, job, queue, *args, **kwargs):
            with tracer.start_as_current_span(f"rq.job/{job.func_name}"):
                try:
                    return super().perform_job(job, queue, *args, **kwargs)
                finally:
                    provider.force_flush()

and ``tasklock.opentelemetry.instrument()`` where the worker starts (the work horse inherits it).

This module needs only ``opentelemetry-api`` (``pip install 'tasklock[opentelemetry]'``): you
bring the SDK and exporter. With no SDK configured the API's tracer makes non-recording spans,
and with :func:`instrument` not called the task layer pays nothing at all (see
:mod:`tasklock.observe`).
"""

from __future__ import annotations

import sys
import threading
from contextvars import Token

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Status, StatusCode, Tracer, TracerProvider
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "tasklock.opentelemetry needs the OpenTelemetry API: pip install 'tasklock[opentelemetry]'"
    ) from exc

from tasklock import __version__, observe

__all__ = [
    "ACQUIRE_SPAN",
    "HOLD_SPAN",
    "instrument",
    "instrumented",
    "uninstrument",
]

#: Name of the span around an execution-lock acquire, from its start to its outcome.
ACQUIRE_SPAN = "tasklock.acquire"
#: Name of the span around the body that holds the lock.
HOLD_SPAN = "tasklock.hold"

TASK = "tasklock.task"
LOCK_NAME = "tasklock.lock.name"
OUTCOME = "tasklock.outcome"
FENCE = "tasklock.fence"
WAITED = "tasklock.waited"
CONTROL_FLOW = "tasklock.control_flow"

#: Acquire outcomes that are failures (the others are decisions: a duplicate is skipped, retried
#: or raised on purpose; ``ran_unlocked`` is the configured answer to an unreachable store).
_FAILED = {
    "backend_error": "the lock store was unreachable",
    "interrupted": "interrupted during the acquire",
}

#: Celery's exceptions a body raises to steer its task rather than to report a failure.
_CELERY_CONTROL_FLOW = ("Retry", "Ignore", "Reject")

_lock = threading.Lock()
_installed: _SpanObserver | None = None


def instrument(tracer_provider: TracerProvider | None = None) -> None:
    """Emit spans for every acquire and hold of this process's tasks from now on.

    ``tracer_provider``: the provider to make spans with; by default the global one (the
    ``opentelemetry.trace`` API's, which follows a provider set later, too). Idempotent: calling it
    again changes nothing, unless it names another provider, which then replaces the first (so
    there is never more than one tasklock observer, and never two spans for one acquire).
    """
    global _installed
    with _lock:
        current = _installed
        if current is not None and (
            tracer_provider is None or current.tracer_provider is tracer_provider
        ):
            return
        if current is not None:
            observe.uninstall(current)
        _installed = _SpanObserver(tracer_provider)
        observe.install(_installed)


def uninstrument() -> None:
    """Stop emitting spans (does nothing when :func:`instrument` was not called)."""
    global _installed
    with _lock:
        if _installed is not None:
            observe.uninstall(_installed)
            _installed = None


def instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    return _installed is not None


class _SpanObserver:
    """The :class:`tasklock.observe.Observer` that :func:`instrument` installs."""

    def __init__(self, tracer_provider: TracerProvider | None) -> None:
        self.tracer_provider = tracer_provider
        self.tracer: Tracer = trace.get_tracer("tasklock", __version__, tracer_provider)

    def acquiring(self, task: str, lock: str) -> observe.AcquireScope:
        # The name and key at the start, so that a sampler deciding on them sees them.
        span = self.tracer.start_span(ACQUIRE_SPAN, attributes={TASK: task, LOCK_NAME: lock})
        return _AcquireScope(self.tracer, span, task, lock)


class _AcquireScope:
    __slots__ = ("_fence", "_lock", "_outcome", "_span", "_task", "_tracer")

    def __init__(self, tracer: Tracer, span: Span, task: str, lock: str) -> None:
        self._tracer = tracer
        self._span = span
        self._task = task
        self._lock = lock
        self._outcome = ""
        self._fence: int | None = None

    def done(self, outcome: str, waited: float, fence: int | None) -> None:
        self._outcome = outcome
        self._fence = fence
        span = self._span
        if span.is_recording():
            span.set_attribute(OUTCOME, outcome)
            span.set_attribute(WAITED, float(waited))
            if fence is not None:
                span.set_attribute(FENCE, fence)
            failure = _FAILED.get(outcome)
            if failure is not None:
                span.set_status(Status(StatusCode.ERROR, failure))
        span.end()

    def hold(self) -> observe.HoldScope:
        attributes: dict[str, str | int] = {
            TASK: self._task,
            LOCK_NAME: self._lock,
            OUTCOME: self._outcome,
        }
        if self._fence is not None:
            attributes[FENCE] = self._fence
        span = self._tracer.start_span(HOLD_SPAN, attributes=attributes)
        # Current while the body runs: the spans it starts are the hold's children.
        token = otel_context.attach(trace.set_span_in_context(span))
        return _HoldScope(span, token)


class _HoldScope:
    __slots__ = ("_span", "_token")

    def __init__(self, span: Span, token: Token[Context]) -> None:
        self._span = span
        self._token = token

    def done(self, error: BaseException | None) -> None:
        span = self._span
        try:
            if error is not None and span.is_recording():
                control = _control_flow(error)
                if control is not None:
                    span.set_attribute(CONTROL_FLOW, control)
                else:
                    span.record_exception(error, escaped=True)
                    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.end()
        finally:
            # Always detached, or the next task of this thread would run under a dead hold.
            otel_context.detach(self._token)


def _control_flow(error: BaseException) -> str | None:
    """The qualified name of ``error``'s class if it is one of Celery's control-flow exceptions.

    Looked up in ``sys.modules``: if Celery was never imported, ``error`` cannot be one of its
    exceptions, and this module must not import Celery (it serves RQ and plain code too).
    """
    exceptions = sys.modules.get("celery.exceptions")
    if exceptions is None:
        return None
    for name in _CELERY_CONTROL_FLOW:
        kind = getattr(exceptions, name, None)
        if isinstance(kind, type) and isinstance(error, kind):
            return f"celery.exceptions.{name}"
    return None
