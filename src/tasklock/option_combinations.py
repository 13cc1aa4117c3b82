"""Options that are each fine but not together: what ``dedupe_enqueue="until_start"`` needs of
the duplicate policies, why ``limit`` > 1 and ``rate`` are refused with Redlock, and the options
a task sets that nothing of it would use. The texts are shared by the per-layer checks and the
merged check of :mod:`tasklock.config`; nothing here imports anything of tasklock's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "REDLOCK_LIMIT_HINT",
    "REDLOCK_LIMIT_PROBLEM",
    "REDLOCK_RATE_HINT",
    "REDLOCK_RATE_PROBLEM",
    "UNTIL_START_ON_DUPLICATE",
    "until_start_problem",
    "unused_task_options",
]


#: The ``on_duplicate`` policies that keep a queued run of ``dedupe_enqueue="until_start"``: it
#: meets the running one's lock by design, and must run after it, not be dropped.
UNTIL_START_ON_DUPLICATE = ("wait", "retry")


def until_start_problem(
    on_duplicate: Any, wait_timeout: Any, on_wait_timeout: Any
) -> tuple[str, str] | None:
    """Why ``dedupe_enqueue="until_start"`` cannot work with these policies, with a hint; None
    when it can.

    "until_start" promises that a submission made while a run is in progress is not lost: it is
    queued (or returns the queued twin's handle) and runs after the running one. That queued run
    meets the running one's lock by design, so a policy that ends it there drops every trigger
    it stands for: ``skip`` (silently) and ``raise`` (as a failure), and ``wait`` whose timeout
    ends in ``skip`` or ``raise``.
    """
    if on_duplicate not in UNTIL_START_ON_DUPLICATE:
        return (
            f"dedupe_enqueue='until_start' needs on_duplicate='wait' or 'retry', got "
            f"{on_duplicate!r}: the queued run meets the running one's lock by design, and "
            f"{on_duplicate!r} would drop it (and every submission that returned its handle) "
            "instead of running it after the running one",
            "use on_duplicate='retry' (re-sent until the lock is free) or 'wait' (blocks a "
            "worker slot until the release), or dedupe_enqueue=True to drop late submissions",
        )
    if on_duplicate == "wait" and wait_timeout is not None and on_wait_timeout != "retry":
        return (
            f"dedupe_enqueue='until_start' with on_duplicate='wait' and "
            f"on_wait_timeout={on_wait_timeout!r}: a run in progress longer than "
            f"wait_timeout={wait_timeout!r} s would make the queued run "
            f"{'fail' if on_wait_timeout == 'raise' else 'be skipped'}, dropping every "
            "submission that returned its handle",
            "set on_wait_timeout='retry' (wait again later) or wait_timeout=None (wait as long "
            "as it takes), or use on_duplicate='retry'",
        )
    return None


#: Why ``limit`` > 1 is refused with ``urls`` (Redlock).
REDLOCK_LIMIT_PROBLEM = (
    "limit={limit} with urls (Redlock) is refused: permits counted on a quorum of independent "
    "masters are no limit, since each holder takes a permit on a majority of the masters only, "
    "and holders that each see a different majority can be up to 2 x limit - 1 at once"
)
REDLOCK_LIMIT_HINT = (
    "use url= (one Redis, or a Redis Cluster or Sentinel URL) for a task with limit > 1, or "
    "keep limit=1 with urls"
)

#: Why ``rate`` is refused with ``urls`` (Redlock).
REDLOCK_RATE_PROBLEM = (
    "rate with urls (Redlock) is refused: a rate counted on a quorum of independent masters is "
    "no limit (each call is counted on a majority only, so calls that each see a different "
    "majority pass a limit that one server would hold), and one master alone would make the "
    "rate depend on that master"
)
REDLOCK_RATE_HINT = (
    "give the rate-limited task url= (one Redis, or a Redis Cluster or Sentinel URL), or keep "
    "urls for a task without rate"
)


def unused_task_options(
    merged: Mapping[str, Any], sources: Mapping[str, str]
) -> list[tuple[tuple[str, ...], str, str]]:
    """Options a task sets that nothing of its would use: accepted, they did nothing. Only the
    task's own options (its decorator, its class and base classes) are held to this; the same
    in project-wide settings (environment, Celery app.conf, Django) is a default for the tasks
    that do have a rate or a lock, and fine."""
    found: list[tuple[tuple[str, ...], str, str]] = []
    if merged.get("rate") is None:
        for name in ("on_rate_limit", "burst", "rate_key"):
            if sources.get(name) == "task options":
                found.append(
                    (
                        (name, "rate"),
                        f"{name}={merged.get(name)!r} applies to a rate limit, and this task has "
                        "none",
                        f"add rate=..., e.g. rate='20/m', or leave {name} out",
                    )
                )
    if (
        merged.get("limit", 1) is None
        and merged.get("on_duplicate") == "wait"
        and sources.get("on_duplicate") == "task options"
    ):
        found.append(
            (
                ("on_duplicate", "limit"),
                "on_duplicate='wait' waits for the execution lock, which limit=None turns off",
                "keep a limit to wait for a turn, or use rate= with on_rate_limit='retry' to space "
                "the calls out",
            )
        )
    return found
