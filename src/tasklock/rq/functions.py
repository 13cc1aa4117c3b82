"""RQ: what ``@singleton_job`` accepts, and how it finds an rq/django-rq ``@job`` beneath it.

Kept apart from :mod:`tasklock.rq` (the job's run and enqueue) so that each file has one job.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rq.decorators import job as rq_job_decorator

from tasklock.errors import ConfigurationError

__all__ = ["check_job_function", "rq_decorator_of"]


def rq_decorator_of(delay: Callable[..., Any]) -> Any:
    """The ``rq.decorators.job`` instance behind an rq/django-rq ``delay`` function, or None.

    RQ's decorator keeps its queue and connection only in the closure of ``delay``; reading it
    there is how ``settle.delay(...)`` can deduplicate against the right Redis.
    """
    code = getattr(delay, "__code__", None)
    for name, cell in zip(
        getattr(code, "co_freevars", ()), getattr(delay, "__closure__", None) or (), strict=False
    ):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if name == "self" and isinstance(value, rq_job_decorator):
            return value
    return None


def check_job_function(func: Any) -> None:
    """Refuse what RQ could not run as a job: not a function, not importable by
    its dotted path in the worker (nested, lambda, method), or a coroutine function."""
    if not inspect.isfunction(func):
        raise ConfigurationError(
            f"singleton_job decorates functions, got {func!r}; options go as keywords: "
            "@singleton_job(ttl=30, ...)"
        )
    if "<" in func.__qualname__ or "." in func.__qualname__:
        raise ConfigurationError(
            f"singleton_job needs a module-level function, got {func.__module__}."
            f"{func.__qualname__}: RQ imports a job's function by its dotted path in the worker, "
            "so nested functions, lambdas and methods cannot be found there"
        )
    if inspect.iscoroutinefunction(func):
        raise ConfigurationError(
            f"singleton_job does not support async def jobs ({func.__qualname__}); wrap the "
            "coroutine in a plain function that runs it"
        )
