"""Reading Django's ``TASKLOCK`` setting into tasklock's option names, validated.

``tasklock.config`` calls :func:`read_tasklock_setting` each time a task resolves its options
(once per task, and again after ``override_settings``), and only when the process has already
imported Django: this module never configures Django and never caches the setting, so tests
can change it freely.

The same problems feed two places: the system checks (``manage.py check``, see
``tasklock.django.checks``) and :func:`read_tasklock_setting`, which raises
``ImproperlyConfigured`` because checks do not run under ``celery worker`` or ``rq worker``.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from django.conf import ENVIRONMENT_VARIABLE, settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from tasklock.config import OPTION_NAMES, Problem, check_options
from tasklock.errors import ConfigurationError
from tasklock.settings_sources import settings_changed, use_django_reader

__all__ = [
    "SETTING",
    "SETTING_KEYS",
    "TaskLockImproperlyConfigured",
    "connect_signals",
    "inspect_setting",
    "read_tasklock_setting",
]

log = logging.getLogger("tasklock")

SETTING = "TASKLOCK"
#: TASKLOCK key -> option name: every option in upper case. KEY and FENCING are mapped too, so
#: that they get their own error ("belongs on the task") instead of "unknown key".
SETTING_KEYS: dict[str, str] = {name.upper(): name for name in OPTION_NAMES}

EXAMPLE = '{"URL": "redis://localhost:6379/0", "TTL": 30}'

# Hints for problems that tasklock.config reports without one: every check message has a hint.
_FALLBACK_HINTS = {
    "wait_timeout": "seconds to wait for the running twin, e.g. 30",
    "dedupe_enqueue": "use True, False or 'until_start'",
    "watchdog": "use True or False",
    "key_prefix": "a short name for the project, e.g. 'myproject'",
    "urls": "three or five independent masters, e.g. "
    "['redis://node-1:6379/0', 'redis://node-2:6379/0', 'redis://node-3:6379/0']",
}


class TaskLockImproperlyConfigured(ImproperlyConfigured, ConfigurationError):
    """``settings.TASKLOCK`` is wrong. Django code catches it as ``ImproperlyConfigured``,
    tasklock code as ``tasklock.ConfigurationError``."""


def _django_settings_available() -> bool:
    # Touching an unconfigured LazySettings without DJANGO_SETTINGS_MODULE raises; a process that
    # merely imported django (a library, a plain Celery worker) has no TASKLOCK to read.
    return settings.configured or bool(os.environ.get(ENVIRONMENT_VARIABLE))


def _key_name(key: Any) -> str:
    return f"{SETTING}[{key!r}]"


def _unknown_key(key: Any) -> Problem:
    if isinstance(key, str) and key.upper() in SETTING_KEYS:
        message = f"{_key_name(key)}: keys are upper case, {key!r} should be {key.upper()!r}"
        hint = f"rename {key!r} to {key.upper()!r}"
    else:
        message = f"{_key_name(key)}: unknown key {key!r}"
        close = difflib.get_close_matches(str(key).upper(), SETTING_KEYS, n=1)
        valid = ", ".join(sorted(SETTING_KEYS))
        hint = f"did you mean {close[0]!r}? " if close else ""
        hint += f"valid keys: {valid}"
    return Problem(str(key), message, hint, "E001")


#: Problems about how several options combine: every option they name is a TASKLOCK key.
_COMBINATIONS = frozenset({"E010", "E012"})
_OPTION_WORD = re.compile(r"\b(" + "|".join(sorted(OPTION_NAMES, key=len, reverse=True)) + r")\b")


def _upper(match: re.Match[str]) -> str:
    return match.group(0).upper()


def _in_setting_terms(problem: Problem, prefix: str) -> Problem:
    """Name the TASKLOCK key the user wrote ("TASKLOCK['TTL']: TTL must be ...")."""
    body = problem.message.removeprefix(prefix)
    option, key = problem.option, problem.option.upper()
    hint = problem.hint or _FALLBACK_HINTS.get(
        option, "see the options table in docs/reference/options.md"
    )
    if problem.code == "E007":
        body, hint = "URL and URLS are both set", "keep URL for one Redis or URLS for Redlock"
    elif problem.code in _COMBINATIONS:  # about several keys: name each as the setting does
        body, hint = _OPTION_WORD.sub(_upper, body), _OPTION_WORD.sub(_upper, hint)
    elif body.startswith(option):  # "ttl must be ..." -> "TTL must be ..."
        body = key + body[len(option) :]
    elif body.startswith(repr(option)):  # "'key' describes ..." -> "KEY describes ..."
        body = key + body[len(repr(option)) :]
    return replace(problem, option=key, message=f"{_key_name(key)}: {body}", hint=hint)


def inspect_setting() -> tuple[dict[str, Any], list[Problem]]:
    """``(options, problems)`` of the current ``settings.TASKLOCK``; never raises.

    ``options`` uses tasklock's lower-case option names; ``problems`` holds every error and
    warning, each naming the TASKLOCK key (``Problem.option`` is the key as written).
    """
    if not _django_settings_available():
        return {}, []
    raw = getattr(settings, SETTING, None)
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [
            Problem(
                SETTING,
                f"{SETTING} must be a dict of options, got {type(raw).__name__}: {raw!r}",
                f"e.g. {SETTING} = {EXAMPLE}",
                "E009",
            )
        ]
    options: dict[str, Any] = {}
    problems: list[Problem] = []
    for key, value in raw.items():
        name = SETTING_KEYS.get(key) if isinstance(key, str) else None
        if name is None:
            problems.append(_unknown_key(key))
        else:
            options[name] = value
    source = f"settings.{SETTING}"
    problems.extend(
        _in_setting_terms(problem, f"{source}: ")
        for problem in check_options(options, source, project_wide=True)
    )
    return options, problems


def describe(problem: Problem) -> str:
    """One line: message, id and hint."""
    hint = f" HINT: {problem.hint}" if problem.hint else ""
    return f"{problem.message} [tasklock.{problem.code}]{hint}"


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(problem: Problem) -> None:
    # Workers do not run system checks: log each risky setting once instead.
    line = describe(problem)
    with _warned_lock:
        if line in _warned:
            return
        _warned.add(line)
    log.warning("%s", line)


def read_tasklock_setting() -> dict[str, Any]:
    """The options in ``settings.TASKLOCK`` (lower-case names), read now, not cached.

    Returns ``{}`` when Django is not configured or ``TASKLOCK`` is absent. Raises
    :class:`TaskLockImproperlyConfigured` (an ``ImproperlyConfigured``) listing every error;
    warnings are logged once (per process and value of the setting).
    """
    connect_signals()
    options, problems = inspect_setting()
    errors = [problem for problem in problems if not problem.warning]
    if errors:
        raise TaskLockImproperlyConfigured(
            f"settings.{SETTING} is invalid (`manage.py check` lists the same): "
            + "; ".join(describe(problem) for problem in errors)
        )
    for problem in problems:
        _warn_once(problem)
    return options


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING:
        with _warned_lock:
            _warned.clear()  # a new value deserves its warnings again
        settings_changed()  # every task re-resolves its options (the guards listen there)


_connected = False


def connect_signals() -> None:
    """Make ``override_settings(TASKLOCK=...)`` reset every task's resolved options.

    Called by the AppConfig and on first read (so it works even without the app installed);
    connecting twice is harmless (``dispatch_uid``).
    """
    global _connected
    if not _connected:
        setting_changed.connect(_on_setting_changed, dispatch_uid="tasklock.django.settings")
        _connected = True


use_django_reader(read_tasklock_setting)  # tasks read TASKLOCK through this module
