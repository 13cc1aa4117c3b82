"""How the Celery adapter reads its configuration: tasklock's option names on a task (and the
near-misses it refuses), the broker's Redis as the lock's when no URL is set, and when a sent call
is due (``countdown`` / ``eta``, read as Celery's worker reads them).

Kept apart from :mod:`tasklock.celery` (the task class and the decorator) because none of it needs
the task class; imported only by it, so it imports Celery freely.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from celery import Task
from celery.utils.time import maybe_iso8601, maybe_make_aware
from kombu.utils.url import maybe_sanitize_url

from tasklock.config import OPTION_NAMES, WHERE_TO_SET_URL
from tasklock.core.connection import client_for_url
from tasklock.core.urls import validate_url
from tasklock.errors import ConfigurationError

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["broker_client", "near_miss", "seconds_until_due", "split_options"]


#: Where the HA beat's store is set: the settings, not a task's options (it has none).
BEAT_WHERE = (
    "set Celery's tasklock_url (Django: CELERY_TASKLOCK_URL; Redlock: tasklock_urls) or the "
    "TASKLOCK_URL environment variable, which celery beat reads for its leader election"
)


def broker_client(app: Celery, task_name: str | None) -> Any:
    """The broker's Redis, used for locks when no ``url``/``urls`` is configured anywhere.
    ``task_name``: the task it is for, or None for celery beat's leader election (errors then
    say where beat's store is set)."""
    subject = "celery beat" if task_name is None else f"task {task_name}"
    raw = app.conf.broker_url
    if isinstance(raw, str):
        urls = [u.strip() for u in raw.split(";") if u.strip()]
    elif isinstance(raw, list | tuple):
        urls = [u.strip() for u in raw if isinstance(u, str) and u.strip()]
    else:
        urls = []
    # One text naming every place a URL can be set.
    where = WHERE_TO_SET_URL if task_name is not None else BEAT_WHERE
    if not urls:
        raise ConfigurationError(
            f"no Redis configured for tasklock ({subject}) and Celery's broker_url is not "
            f"set: {where}"
        )
    if len(set(urls)) > 1:
        raise ConfigurationError(
            f"{subject}: broker_url lists several brokers for failover "
            f"({', '.join(maybe_sanitize_url(u) for u in urls)}); every worker must lock on the "
            f"same Redis, so choose it explicitly: {where}"
        )
    url = urls[0]
    if urlsplit(url).scheme not in ("redis", "rediss"):
        raise ConfigurationError(
            f"{subject}: no Redis configured for tasklock, and the broker "
            f"{maybe_sanitize_url(url)} is not a redis:// or rediss:// URL that could serve: "
            f"{where}"
        )
    return client_for_url(validate_url(url, "broker_url"))  # a bad one is named broker_url


def seconds_until_due(options: Mapping[str, Any], app: Celery) -> float:
    """How far ahead a ``countdown``/``eta`` schedules the call (0 for now), read as Celery does.

    Celery turns a truthy ``countdown`` into the eta (so ``countdown=0`` leaves ``eta`` in
    charge), sends an ``eta`` datetime or ISO-8601 string as it is, and the worker reads it with
    ``maybe_make_aware(maybe_iso8601(eta), app.conf.timezone)``: a naive eta is UTC, whatever the
    host's local time zone. The same functions here, so the marker cannot expire before the call
    is due (nor linger hours after it). What the worker could not read either counts as now.
    """
    countdown, eta = options.get("countdown"), options.get("eta")
    try:
        if countdown:
            return max(0.0, float(countdown))
        due = maybe_iso8601(eta)
        if due is None:
            return 0.0
        due = maybe_make_aware(due, app.conf.timezone)
        return max(0.0, due.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return 0.0


def near_miss(name: str) -> str | None:
    """What is wrong with an option ``name`` that looks like tasklock's but is none, else None.

    Near-miss typos (``on_duplicat``) and ``tasklock_<option>`` (the Celery setting's name, not
    the task option's). One wording for ``@singleton_task``, ``@app.task(base=...)`` and class
    attributes, so a typo reads the same wherever it was made.
    """
    listing = f"tasklock options: {', '.join(OPTION_NAMES)}"
    lowered = name.lower()
    if lowered.startswith("tasklock_"):
        bare = lowered.removeprefix("tasklock_")
        close = [bare] if bare in OPTION_NAMES else difflib.get_close_matches(bare, OPTION_NAMES, 1)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        return (
            f"unknown option {name!r}{guess} (tasklock_<option> is the name of a Celery setting; "
            f"on a task, give the option's own name; {listing})"
        )
    close = difflib.get_close_matches(name, OPTION_NAMES, n=1, cutoff=0.8)
    if close:
        return f"unknown option {name!r}; did you mean {close[0]!r}? ({listing})"
    return None


def split_options(options: dict[str, Any], name: str) -> dict[str, Any]:
    """Take tasklock's options out of ``options`` (the rest is Celery's); catch near-miss typos,
    which Celery would otherwise keep silently as a custom task attribute."""
    ours = {k: options.pop(k) for k in OPTION_NAMES if k in options}
    for key in options:
        if hasattr(Task, key):
            continue
        problem = near_miss(key)
        if problem:
            raise ConfigurationError(f"singleton_task {name}: {problem}")
    return ours
