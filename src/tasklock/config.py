"""Task options: their names, defaults, validation, and where their values come from.

The same option names work in every adapter (Celery, RQ, Django's ``TASKLOCK`` in upper case).
Precedence, highest first::

    options given on the task  >  Django TASKLOCK  >  Celery app.conf (tasklock_*)  >  environment
    (TASKLOCK_URL, TASKLOCK_URLS, TASKLOCK_KEY_PREFIX)  >  defaults

Options on the task are validated when the task is decorated, so a typo fails at import time, not
at 3 a.m. in a worker. The other sources are read lazily on first use (and again after Django's
``override_settings``), because a worker may import task modules before settings are ready.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tasklock.backends import cluster_url, is_redlock, option_problems, url_problems
from tasklock.core.base import MAX_TTL
from tasklock.core.rates import RatePlan
from tasklock.errors import ConfigurationError
from tasklock.option_combinations import (
    REDLOCK_LIMIT_HINT,
    REDLOCK_LIMIT_PROBLEM,
    REDLOCK_RATE_HINT,
    REDLOCK_RATE_PROBLEM,
    until_start_problem,
    unused_task_options,
)
from tasklock.settings_sources import celery_conf_options, django_setting, environment

__all__ = [
    "DEFAULTS",
    "OPTION_NAMES",
    "TASK_ONLY_OPTIONS",
    "WHERE_TO_SET_URL",
    "Problem",
    "TaskOptions",
    "check_options",
    "resolve_options",
    "validate_options",
]

ON_DUPLICATE = ("skip", "raise", "retry", "wait")
ON_WAIT_TIMEOUT = ("skip", "raise", "retry")
ON_BACKEND_ERROR = ("raise", "run")
ON_RATE_LIMIT = ("retry", "wait", "skip", "raise")
DEFAULT_FENCE_KEYWORD = "fence_token"
#: The shortest ``ttl`` / ``pending_ttl``: the lock core's floor for a TTL (one millisecond, the
#: unit Redis expires keys in).
MIN_TTL = 0.001

DEFAULTS: dict[str, Any] = {
    "ttl": 30.0,
    "key": None,
    "on_duplicate": "skip",
    "wait_timeout": 30.0,
    "on_wait_timeout": "raise",
    "fencing": False,
    "dedupe_enqueue": False,
    "limit": 1,
    "rate": None,
    "burst": 1,
    "rate_key": None,
    "rate_group": None,
    "on_rate_limit": "retry",
    "pending_ttl": 3600.0,
    "watchdog": True,
    "on_backend_error": "raise",
    "url": None,
    "urls": None,
    "key_prefix": "tasklock",
}
OPTION_NAMES: tuple[str, ...] = tuple(sorted(DEFAULTS))
#: Options that describe one task's signature; they make no sense as project-wide settings.
TASK_ONLY_OPTIONS = ("fencing", "key", "rate_key")
#: Every place a lock URL can be set, for the "no Redis configured" errors of the guard and the
#: adapters, so that each names all of them (a Django project reading one that leaves out
#: TASKLOCK["URL"] would go looking for a Celery setting instead).
WHERE_TO_SET_URL = (
    "pass url='redis://...' to the task, or set Django's TASKLOCK['URL'], Celery's "
    "tasklock_url (Django: CELERY_TASKLOCK_URL) or the TASKLOCK_URL environment variable"
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a set of options; Django checks turn these into E/W messages."""

    option: str
    message: str
    hint: str
    code: str  # stable id suffix, e.g. "E003"
    warning: bool = False


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_limit(value: Any) -> bool:
    # None: no execution lock (a task that only needs a rate).
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)


def _is_dedupe_enqueue(value: Any) -> bool:
    # Compared by identity and type: 0 == False and 1 == True, but neither is a valid value.
    return value is True or value is False or (isinstance(value, str) and value == "until_start")


def check_options(
    options: Mapping[str, Any], source: str = "options", *, project_wide: bool = False
) -> list[Problem]:
    """Every problem in ``options`` (lower-case option names), without raising.

    ``project_wide``: the options come from settings that apply to every task (Django, Celery
    app.conf, environment), where the per-task ``key`` and ``fencing`` are errors.
    """
    found = _Found(source)
    _scope_problems(options, found, project_wide)
    _duration_problems(options, found)
    _policy_problems(options, found)
    _limit_problems(options, found)
    found.extend(_rate_problems(options, source))
    found.extend(
        Problem(option, f"{source}: {message}", hint, code)
        for option, message, hint, code in option_problems(options)
    )
    _watchdog_off_warning(options, found)
    _argument_problems(options, found)
    _connection_problems(options, found)
    return list(found)


class _Found(list[Problem]):
    """The problems found in one layer of options, each message prefixed with its source."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def bad(self, option: str, message: str, hint: str, code: str, warning: bool = False) -> None:
        self.append(Problem(option, f"{self.source}: {message}", hint, code, warning))


def _scope_problems(options: Mapping[str, Any], found: _Found, project_wide: bool) -> None:
    """Options that do not belong in this layer: a task's own (``key``, ``fencing``,
    ``rate_key``) in project-wide settings, and names that are no option at all."""
    if project_wide:
        for name in TASK_ONLY_OPTIONS:
            if name in options:
                found.bad(
                    name,
                    f"{name!r} describes one task's arguments and cannot be a project-wide setting",
                    f"pass {name}=... on the task decorator",
                    "E008",
                )

    for name in options:
        if name not in DEFAULTS:
            found.bad(
                name,
                f"unknown option {name!r}",
                f"valid options: {', '.join(OPTION_NAMES)}",
                "E001",
            )


def _duration_problems(options: Mapping[str, Any], found: _Found) -> None:
    """The TTLs and the wait: numbers of seconds, in range."""
    get: Callable[[str], Any] = options.get
    for name in ("ttl", "pending_ttl"):
        if name in options and (not _is_number(get(name)) or get(name) <= 0):
            found.bad(
                name,
                f"{name} must be a number of seconds > 0, got {get(name)!r}",
                "e.g. 30",
                "E002",
            )
        elif name in options and get(name) * 1000 < 1:
            # The floor the lock core enforces (it sets expiries in whole milliseconds, and 0 ms
            # is no expiry Redis takes): below it every call of the task would fail, so it is an
            # error here, where the option is given, not a warning.
            found.bad(
                name,
                f"{name} must be at least {MIN_TTL} seconds, got {get(name)!r}",
                "Redis expires keys in whole milliseconds; a TTL is the backstop for a crashed "
                "worker, so give seconds, e.g. 30",
                "E002",
            )
        elif name in options and get(name) > MAX_TTL:
            found.bad(
                name,
                f"{name} must be at most {MAX_TTL:.0f} seconds (a year), got {get(name)!r}",
                "a TTL is the backstop for a crashed worker; the watchdog renews a short one for "
                "as long as the task runs",
                "E002",
            )
    if "ttl" in options and _is_number(get("ttl")) and MIN_TTL <= get("ttl") < 1:
        # Legal, but the watchdog then renews several times a second and a GC pause or a slow
        # round trip loses the lock.
        found.bad(
            "ttl", f"ttl={get('ttl')!r} s is very short", "keep ttl >= 1 s", "W001", warning=True
        )
    if "wait_timeout" in options and get("wait_timeout") is not None:
        value = get("wait_timeout")
        if not _is_number(value) or value < 0:
            found.bad(
                "wait_timeout", f"wait_timeout must be seconds >= 0, got {value!r}", "", "E002"
            )


def _policy_problems(options: Mapping[str, Any], found: _Found) -> None:
    """The ``on_*`` policies, the watchdog flag and ``dedupe_enqueue`` (with what
    ``"until_start"`` needs of the policies)."""
    get: Callable[[str], Any] = options.get
    for name, choices in (
        ("on_duplicate", ON_DUPLICATE),
        ("on_wait_timeout", ON_WAIT_TIMEOUT),
        ("on_backend_error", ON_BACKEND_ERROR),
        ("on_rate_limit", ON_RATE_LIMIT),
    ):
        if name in options and get(name) not in choices:
            found.bad(
                name,
                f"{name} must be one of {', '.join(map(repr, choices))}, got {get(name)!r}",
                f"use one of {', '.join(choices)}",
                "E003",
            )
    if get("on_backend_error") == "run":
        found.bad(
            "on_backend_error",
            "on_backend_error='run' runs tasks unlocked while Redis is unreachable",
            "use it only for work that is safe to run twice",
            "W002",
            warning=True,
        )
    if "watchdog" in options and not isinstance(get("watchdog"), bool):
        found.bad(
            "watchdog", f"watchdog must be True or False, got {get('watchdog')!r}", "", "E004"
        )
    if "dedupe_enqueue" in options and not _is_dedupe_enqueue(get("dedupe_enqueue")):
        found.bad(
            "dedupe_enqueue",
            f"dedupe_enqueue must be False, True or 'until_start', got {get('dedupe_enqueue')!r}",
            "True keeps the enqueue marker until the run ends, 'until_start' until it starts",
            "E004",
        )
    elif get("dedupe_enqueue") == "until_start":
        # Policies this layer leaves out are the defaults here: a task (or a TASKLOCK) that asks
        # for "until_start" must say how its queued run meets the running one.
        problem = until_start_problem(
            options.get("on_duplicate", DEFAULTS["on_duplicate"]),
            options.get("wait_timeout", DEFAULTS["wait_timeout"]),
            options.get("on_wait_timeout", DEFAULTS["on_wait_timeout"]),
        )
        if problem is not None:
            found.bad("dedupe_enqueue", problem[0], problem[1], "E010")


def _limit_problems(options: Mapping[str, Any], found: _Found) -> None:
    """``limit``: a count or None, never above 1 with Redlock, never None with fencing."""
    get: Callable[[str], Any] = options.get
    if "limit" in options and not _is_limit(get("limit")):
        found.bad(
            "limit",
            f"limit must be a whole number >= 1 (bodies at once per key) or None (no execution "
            f"lock), got {get('limit')!r}",
            "e.g. limit=3; limit=1 (the default) is one at a time",
            "E011",
        )
    elif _is_limit(get("limit")) and (get("limit") or 1) > 1 and is_redlock(get("urls")):
        found.bad(
            "limit", REDLOCK_LIMIT_PROBLEM.format(limit=get("limit")), REDLOCK_LIMIT_HINT, "E012"
        )
    if "limit" in options and get("limit") is None and get("fencing"):
        found.bad(
            "fencing",
            "fencing with limit=None: fence tokens come with the execution lock, which "
            "limit=None turns off",
            "keep limit=1 (the default) for a fenced task",
            "E014",
        )


def _watchdog_off_warning(options: Mapping[str, Any], found: _Found) -> None:
    """A task without the watchdog loses its lock when it runs longer than ``ttl``."""
    get: Callable[[str], Any] = options.get
    if get("watchdog") is False:
        found.bad(
            "watchdog",
            "watchdog=False: a task that runs longer than ttl loses its lock",
            "keep the watchdog on, or set ttl above the longest run",
            "W003",
            warning=True,
        )


def _argument_problems(options: Mapping[str, Any], found: _Found) -> None:
    """What names the task's arguments or keys: ``fencing``, ``key``, ``rate_key``,
    ``key_prefix``."""
    get: Callable[[str], Any] = options.get
    if "fencing" in options:
        fencing = get("fencing")
        if not isinstance(fencing, bool) and not (
            isinstance(fencing, str) and fencing.isidentifier()
        ):
            found.bad(
                "fencing",
                f"fencing must be True, False or a keyword name, got {fencing!r}",
                "",
                "E004",
            )
    for name in ("key", "rate_key"):
        key = get(name)
        if key is not None and not callable(key):
            if isinstance(key, str) or not isinstance(key, Sequence):
                found.bad(
                    name,
                    f"{name} must be None, a list of argument names or a callable, got {key!r}",
                    f"e.g. {name}=['account_id']",
                    "E005",
                )
            elif not all(isinstance(k, str) and k for k in key):
                found.bad(
                    name, f"{name} must list argument names (strings), got {key!r}", "", "E005"
                )
    if "key_prefix" in options and (
        not isinstance(get("key_prefix"), str) or not get("key_prefix")
    ):
        found.bad(
            "key_prefix",
            f"key_prefix must be a non-empty string, got {get('key_prefix')!r}",
            "",
            "E004",
        )


def _connection_problems(options: Mapping[str, Any], found: _Found) -> None:
    """``url`` and ``urls``: each URL part by part, and not both."""
    get: Callable[[str], Any] = options.get
    for option, message, hint, code in url_problems(get("url"), get("urls")):
        found.bad(option, message, hint, code)
    if get("url") is not None and get("urls") is not None:
        found.bad(
            "url", "url and urls are both set", "set url for one Redis or urls for Redlock", "E007"
        )


def _rate_problems(options: Mapping[str, Any], source: str) -> list[Problem]:
    """What is wrong with ``rate``, ``burst`` and ``rate_group`` in one layer of options."""
    problems: list[Problem] = []
    rate = options.get("rate")
    burst = options.get("burst", DEFAULTS["burst"])
    if rate is not None:
        try:
            RatePlan.of(rate, burst)
        except ConfigurationError as exc:
            option = "burst" if str(exc).startswith("burst") else "rate"
            problems.append(
                Problem(option, f"{source}: {exc}", "e.g. rate='20/m', burst=1", "E013")
            )
        if is_redlock(options.get("urls")):
            problems.append(
                Problem("rate", f"{source}: {REDLOCK_RATE_PROBLEM}", REDLOCK_RATE_HINT, "E015")
            )
    elif "burst" in options:
        try:
            RatePlan.of("1/s", burst if not isinstance(burst, list | tuple) else burst[:1])
        except ConfigurationError as exc:
            problems.append(Problem("burst", f"{source}: {exc}", "e.g. burst=10", "E013"))
    group = options.get("rate_group")
    if group is not None and (not isinstance(group, str) or not group):
        problems.append(
            Problem(
                "rate_group",
                f"{source}: rate_group must be a non-empty string (tasks that name the same group "
                f"share one limit), got {group!r}",
                "e.g. rate_group='stripe'",
                "E004",
            )
        )
    return problems


def validate_options(
    options: Mapping[str, Any], source: str = "options", *, project_wide: bool = False
) -> dict[str, Any]:
    """Raise ConfigurationError for the first error in ``options``; return them as a dict."""
    for problem in check_options(options, source, project_wide=project_wide):
        if not problem.warning:
            hint = f" ({problem.hint})" if problem.hint else ""
            raise ConfigurationError(problem.message + hint)
    return dict(options)


@dataclass(frozen=True)
class TaskOptions:
    """Resolved options of one task (every source merged)."""

    ttl: float = 30.0
    key: Any = None
    on_duplicate: str = "skip"
    wait_timeout: float | None = 30.0
    on_wait_timeout: str = "raise"
    fencing: bool | str = False
    dedupe_enqueue: bool | str = False
    limit: int | None = 1
    rate: Any = None
    burst: Any = 1
    rate_key: Any = None
    rate_group: str | None = None
    on_rate_limit: str = "retry"
    pending_ttl: float = 3600.0
    watchdog: bool = True
    on_backend_error: str = "raise"
    url: str | None = None
    urls: tuple[str, ...] | None = None
    key_prefix: str = "tasklock"
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def fence_keyword(self) -> str | None:
        """The keyword the fence token is passed as, or None when fencing is off."""
        if self.fencing is True:
            return DEFAULT_FENCE_KEYWORD
        return self.fencing or None


def _check_merged(merged: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Options that are fine in each layer but not together (a project's
    ``DEDUPE_ENQUEUE="until_start"`` and a task's ``on_duplicate="skip"``, a task's ``limit=3``
    and a project's ``URLS``): a ConfigurationError naming where each value came from."""

    def named(*names: str) -> str:
        return ", ".join(
            f"{name}={merged.get(name)!r} ({sources.get(name, 'defaults')})" for name in names
        )

    if merged.get("dedupe_enqueue") == "until_start":
        problem = until_start_problem(
            merged.get("on_duplicate"), merged.get("wait_timeout"), merged.get("on_wait_timeout")
        )
        if problem is not None:
            where = named("dedupe_enqueue", "on_duplicate", "wait_timeout", "on_wait_timeout")
            raise ConfigurationError(f"{problem[0]} [{where}] ({problem[1]})")
    limit = merged.get("limit", 1)
    if limit is not None and limit > 1 and merged.get("urls") is not None:
        raise ConfigurationError(
            f"{REDLOCK_LIMIT_PROBLEM.format(limit=limit)} [{named('limit', 'urls')}] "
            f"({REDLOCK_LIMIT_HINT})"
        )
    for names, message, hint in unused_task_options(merged, sources):
        raise ConfigurationError(f"{message} [{named(*names)}] ({hint})")
    if limit is None and merged.get("fencing"):
        raise ConfigurationError(
            "fencing with limit=None: fence tokens come with the execution lock, which limit=None "
            f"turns off [{named('limit', 'fencing')}] (keep limit=1 for a fenced task)"
        )
    for option, message, hint, _ in option_problems(merged):
        raise ConfigurationError(f"{message} [{named(option, 'url')}] ({hint})")
    if merged.get("rate") is not None:
        if merged.get("urls") is not None:
            raise ConfigurationError(
                f"{REDLOCK_RATE_PROBLEM} [{named('rate', 'urls')}] ({REDLOCK_RATE_HINT})"
            )
        try:
            RatePlan.of(merged["rate"], merged.get("burst", 1))
        except ConfigurationError as exc:
            raise ConfigurationError(f"{exc} [{named('rate', 'burst')}]") from None


def resolve_options(
    explicit: Mapping[str, Any], celery_conf: Mapping[str, Any] | None = None
) -> TaskOptions:
    """Merge every source for one task; each layer is validated, naming where it came from."""
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    layers = (
        ("defaults", DEFAULTS),
        ("environment", validate_options(environment(), "environment", project_wide=True)),
        (
            "Celery app.conf",
            validate_options(
                celery_conf_options(celery_conf, OPTION_NAMES), "Celery app.conf", project_wide=True
            ),
        ),
        ("Django TASKLOCK", django_setting()),
        ("task options", explicit),
    )
    for source, layer in layers:
        for name, value in layer.items():
            if value is None and name not in ("key", "wait_timeout", "limit", "rate", "rate_key"):
                continue
            if name in ("url", "urls") and source != "defaults":
                # A layer that names a connection replaces the other kind from lower layers.
                merged.pop("urls" if name == "url" else "url", None)
            merged[name] = value
            sources[name] = source
    cluster = cluster_url(merged.get("urls"))
    if cluster is not None:
        # The members of one cluster (etcd, ZooKeeper), listed: the same as one url naming them.
        merged["url"], sources["url"] = cluster, sources.pop("urls", "defaults")
        del merged["urls"]
    _check_merged(merged, sources)
    urls = merged.get("urls")
    return TaskOptions(
        ttl=float(merged["ttl"]),
        key=merged.get("key"),
        on_duplicate=merged["on_duplicate"],
        wait_timeout=None if merged.get("wait_timeout") is None else float(merged["wait_timeout"]),
        on_wait_timeout=merged["on_wait_timeout"],
        fencing=merged["fencing"],
        dedupe_enqueue=merged["dedupe_enqueue"],
        limit=None if merged["limit"] is None else int(merged["limit"]),
        rate=merged.get("rate"),
        burst=merged.get("burst", 1),
        rate_key=merged.get("rate_key"),
        rate_group=merged.get("rate_group"),
        on_rate_limit=merged["on_rate_limit"],
        pending_ttl=float(merged["pending_ttl"]),
        watchdog=merged["watchdog"],
        on_backend_error=merged["on_backend_error"],
        url=merged.get("url"),
        urls=tuple(urls) if urls else None,
        key_prefix=merged["key_prefix"],
        sources=sources,
    )
