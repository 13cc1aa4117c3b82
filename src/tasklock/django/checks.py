"""The Django system check for ``settings.TASKLOCK``: one message per wrong setting.

Ids are stable (users silence warnings with ``SILENCED_SYSTEM_CHECKS``); :data:`CHECK_IDS` is the
table the README shows. Errors (``E``) stop ``manage.py check`` / ``runserver`` / ``migrate``;
warnings (``W``) are legal settings that weaken the guarantees.

The check reads the setting the same way tasks do (``tasklock.django.settings``), so what passes
here is what workers accept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core import checks

from tasklock.config import Problem
from tasklock.django.settings import inspect_setting

__all__ = ["CHECK_IDS", "check_tasklock_setting", "to_message"]

#: id -> what it means. E001-E008, E010-E017 and W001-W003 come from
#: ``tasklock.config.check_options`` (the same codes name the same mistakes in task options);
#: E009 is Django's own. A TTL the lock core would refuse (under 0.001 s) is E002, an error: as a
#: warning it let every task fail at run time; W001 is left for a TTL that works but is shorter
#: than a second.
CHECK_IDS: dict[str, str] = {
    "tasklock.E001": "unknown TASKLOCK key (typo, or a lower-case key)",
    "tasklock.E002": "TTL, PENDING_TTL or WAIT_TIMEOUT is not a number of seconds in range "
    "(TTL and PENDING_TTL from 0.001 to a year, WAIT_TIMEOUT >= 0)",
    "tasklock.E003": "ON_DUPLICATE, ON_WAIT_TIMEOUT, ON_BACKEND_ERROR or ON_RATE_LIMIT is not "
    "one of its policies",
    "tasklock.E004": "DEDUPE_ENQUEUE is not True, False or 'until_start', WATCHDOG is not a bool, "
    "or KEY_PREFIX or RATE_GROUP is not a non-empty string",
    "tasklock.E005": "KEY or RATE_KEY is not None, a list of argument names or a callable",
    "tasklock.E006": "URL or URLS is malformed (URL not redis://, rediss://, unix://, "
    "redis+cluster://, redis+sentinel:// or etcd://; URLS not Redis masters, empty, repeated, "
    "or exactly two)",
    "tasklock.E007": "URL and URLS are both set",
    "tasklock.E008": "KEY, FENCING or RATE_KEY set project-wide (they belong on the task "
    "decorator)",
    "tasklock.E009": "TASKLOCK is not a dict",
    "tasklock.E010": "DEDUPE_ENQUEUE='until_start' with an ON_DUPLICATE (or, with 'wait', an "
    "ON_WAIT_TIMEOUT) that would drop the queued run",
    "tasklock.E011": "LIMIT is not a whole number >= 1 or None",
    "tasklock.E012": "LIMIT > 1 with URLS (Redlock): a semaphore by quorum is no limit",
    "tasklock.E013": "RATE is not a rate ('10/s', '20/m', '30/5m', or a list of them), or BURST "
    "is not a whole number >= 1 (or a list that matches RATE)",
    "tasklock.E014": "FENCING with LIMIT=None: fence tokens come with the execution lock",
    "tasklock.E015": "RATE with URLS (Redlock): a rate counted by quorum is no limit",
    "tasklock.E016": "RATE with an etcd URL: rate limits are a Redis script",
    "tasklock.E017": "TTL under 1 second with an etcd URL: etcd leases are whole seconds",
    "tasklock.W001": "TTL from 0.001 up to 1 second: legal, but easily lost to a pause "
    "(under 0.001 s is E002)",
    "tasklock.W002": "ON_BACKEND_ERROR='run': tasks run unlocked while Redis is unreachable",
    "tasklock.W003": "WATCHDOG=False: a task running longer than TTL loses its lock",
}


def to_message(problem: Problem) -> checks.CheckMessage:
    """The Django check message of one problem (``tasklock.<code>``, hint included)."""
    kind = checks.Warning if problem.warning else checks.Error
    return kind(problem.message, hint=problem.hint or None, id=f"tasklock.{problem.code}")


def check_tasklock_setting(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Every error and warning in ``settings.TASKLOCK`` (nothing when it is absent).

    ``app_configs`` is ignored: the setting is project-wide, like Django's own settings checks.
    """
    _, problems = inspect_setting()
    return [to_message(problem) for problem in problems]
