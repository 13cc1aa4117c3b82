"""What becomes of a Celery call that does not run its body: a skip (a duplicate, a call over its
rate) and a lock Redis that does not answer.

Kept apart from :mod:`tasklock.celery` (which maps Celery's hooks onto the guard) because each is
a rule of its own about Celery's states and workflows, written once for every kind of skip.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore, Reject

if TYPE_CHECKING:
    from celery import Task
    from celery.app.task import Context

__all__ = ["REQUEUE_PAUSE", "ignores_result", "requeue_when_down", "skip_call", "workflow_of"]

log = logging.getLogger("tasklock.celery")

#: How long a worker waits before handing a message back when Redis is unreachable
#: (``acks_late``), so that an outage is not a hot redelivery loop.
REQUEUE_PAUSE = 1.0


def workflow_of(request: Context) -> str | None:
    """What part of a workflow this call is, if any: something waits on its outcome.

    ``request.chain`` is ``None`` for a call outside a chain and a list inside one, empty for the
    last link (Celery's tracer sends the next link with ``chain=chain[:-1]``): the chain's result
    is that link's, so a skipped last link would leave ``get()`` on the chain waiting for ever.
    """
    if request.chord:
        return "a chord"
    if request.chain is not None:
        return "a chain"
    if request.callbacks:
        return "a call with link= callbacks"
    if request.errbacks:
        return "a call with link_error= errbacks"
    return None


def ignores_result(task: Task[Any, Any], request: Context) -> bool:
    explicit = vars(request).get("ignore_result")
    return bool(task.ignore_result if explicit is None else explicit)


def skip_call(
    task: Task[Any, Any], request: Context, state: str, meta: dict[str, Any], error: Exception
) -> None:
    """Record the skip as ``state`` (DUPLICATE, RATE_LIMITED) where results are stored, with
    ``meta``, then raise Ignore.

    A call that a workflow depends on fails with ``error`` (DuplicateTask, RateLimited) instead
    (see :func:`workflow_of`): Celery goes on with a chain, ``link=`` callbacks or a chord only
    when a task succeeds, and fails them (calling ``link_error`` errbacks) only when it fails; an
    ignored task does neither, so the rest would be dropped without a word and every ``get()`` on
    it would wait for ever. Failing it lets Celery mark the rest of the chain failed, fail the
    chord with a ChordError, and run the errbacks.
    """
    workflow = workflow_of(request)
    if workflow:
        log.warning(
            "%s[%s]: skipped (%s) inside %s; failing it with %s so that the workflow fails "
            "visibly instead of stopping here (on_duplicate / on_rate_limit 'wait' or 'retry' "
            "run it later instead)",
            task.name,
            request.id,
            state,
            workflow,
            type(error).__name__,
        )
        raise error
    store = not ignores_result(task, request) and (
        not request.is_eager or bool(getattr(task, "store_eager_result", False))
    )
    if store and request.id:
        try:
            task.update_state(task_id=request.id, state=state, meta=meta)
        except NotImplementedError:
            pass  # no result backend configured: nothing to record
        except Exception as exc:
            log.warning("%s: could not store the %s state: %r", task.name, state, exc)
    raise Ignore(str(error))


def requeue_when_down(task: Task[Any, Any], request: Context, exc: Exception) -> None:
    """Redis for the lock is unreachable and on_backend_error="raise": lose nothing.

    With ``acks_late`` the message goes back to the queue (after a short pause, so an outage is no
    hot loop) and runs once Redis is back; otherwise (returning) the task fails with the error.
    """
    if request.is_eager or not task.acks_late:
        return
    log.error(
        "%s[%s]: Redis for the lock is unreachable; the message is requeued (acks_late) and will "
        "run once Redis answers: %s",
        task.name,
        request.id,
        exc,
    )
    time.sleep(REQUEUE_PAUSE)
    # The error above says what happened; Celery logs the Reject (a warning) without a chain.
    raise Reject(f"lock Redis unreachable: {exc}", requeue=True) from None
