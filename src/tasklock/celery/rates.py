"""What ``on_rate_limit="retry"`` means in Celery: re-send the call for its reserved slot.

The re-sent message is Celery's own retry (same task id, same workflow options, state RETRY
meanwhile), built as :meth:`celery.app.task.Task.retry` builds it except for two things:

* it is not counted against ``max_retries``: the retry count the message carries stays what it
  was, so a call deferred a hundred times for its slot still has every retry its body may ask for;
* a countdown longer than the broker keeps an unacknowledged message is split into hops. With the
  Redis and SQS transports a message with an eta longer than ``visibility_timeout`` (default one
  hour) is delivered a second time; RabbitMQ closes a channel that holds an unacknowledged message
  longer than ``consumer_timeout`` (default 30 minutes). Each hop is at most half of that; a call
  that arrives before its slot is deferred again for the rest (its reservation kept).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from celery.exceptions import Reject, Retry

from tasklock.errors import RateLimited
from tasklock.rating import Throttle

if TYPE_CHECKING:
    from celery import Celery, Task
    from celery.app.task import Context

__all__ = ["RABBITMQ_CONSUMER_TIMEOUT", "defer_call", "longest_hop"]

#: RabbitMQ's default ``consumer_timeout`` (seconds): how long it lets a consumer hold a message
#: unacknowledged, as a Celery worker holds one with an eta until it is due.
RABBITMQ_CONSUMER_TIMEOUT = 1800.0
#: The visibility timeout of Celery's Redis and SQS transports when none is configured.
DEFAULT_VISIBILITY_TIMEOUT = 3600.0


def longest_hop(app: Celery) -> float:
    """Seconds one deferral may last on this app's broker: half of how long the broker keeps a
    message it handed out unacknowledged."""
    raw = app.conf.broker_url
    url = raw[0] if isinstance(raw, list | tuple) and raw else raw
    scheme = urlsplit(url).scheme if isinstance(url, str) else ""
    if scheme in ("redis", "rediss", "sentinel", "sqs", "sqs+https"):
        options = app.conf.broker_transport_options or {}
        return float(options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT)) / 2
    return RABBITMQ_CONSUMER_TIMEOUT / 2


def defer_call(task: Task[Any, Any], request: Context, throttle: Throttle) -> Retry:
    """Send this call again to arrive at its reserved slot (or after one hop towards it); the
    :class:`~celery.exceptions.Retry` to raise, as ``Task.retry`` returns it."""
    countdown = min(throttle.retry_after, longest_hop(task.app))
    signature = task.signature_from_request(
        request, countdown=countdown, retries=request.retries or 0
    )
    error = RateLimited(throttle.message(), throttle.key, throttle.retry_after)
    retry = Retry(exc=error, when=cast(Any, countdown), is_eager=False, sig=signature)
    try:
        signature.apply_async()
    except Exception as exc:
        raise Reject(exc, requeue=False) from exc
    return retry
