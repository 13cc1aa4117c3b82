"""What the demo submits, how it learns each submission's fate, and what it checks.

A submission either ran (its body recorded a run with a fence token in the ledger) or was skipped
as a duplicate (tasklock put the holder in the task state / job meta). The checks are the promise
of the library, verified on what really happened: every submission accounted for, no two runs of
one call overlapping, fence tokens unique and increasing per call, every fenced write accepted.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rq.job import JobStatus

from tasklock.celery import DUPLICATE
from tasklock.demo.processes import DemoError
from tasklock.rq import META_KEY

__all__ = [
    "Verdict",
    "at_once",
    "celery_verdict",
    "check_limited_runs",
    "check_rate_runs",
    "check_runs",
    "most_in_a_second",
    "peak",
    "rq_verdict",
]


#: How much longer than ``(n - 1) / rate`` the starts of n rate-limited calls may spread: a call
#: that comes back late (its worker busy, RQ's scheduler in whole seconds) starts at the next
#: start the limit admits, a little later than its slot (never earlier).
RATE_SPREAD_SLACK = 1.5
#: How far before its slot a run may be seen to start (the slot is read from another clock
#: reading: the eta Celery computed when it re-sent the call).
RATE_EARLY = 0.05


@dataclass(frozen=True)
class Verdict:
    """The fate of one submission."""

    ran: bool
    fence: int | None = None
    holder: str | None = None  # skipped: who held the lock
    state: str = ""  # skipped: the task state / where it is recorded


def celery_verdict(result: Any, call: str) -> Verdict | None:
    """None while the task is pending or running."""
    state = result.state
    if state == "SUCCESS":
        return Verdict(ran=True, fence=result.result["fence"])
    if state == DUPLICATE:  # skipped: tasklock stored the duplicate's details as the state meta
        return Verdict(ran=False, holder=str(result.info.get("holder")), state=f"state {state}")
    if state in ("FAILURE", "REVOKED"):
        raise DemoError(f"Celery task {call} ended in {state}: {result.result!r}")
    return None


def rq_verdict(job: Any, call: str) -> Verdict | None:
    """None while the job is queued or running."""
    status = job.get_status(refresh=False)
    if status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
        error = (job.exc_info or "").strip().splitlines()
        raise DemoError(f"RQ job {call} ended {status.value}: {error[-1] if error else '?'}")
    if status != JobStatus.FINISHED:
        return None
    record = job.meta.get(META_KEY, {})  # tasklock's record of what it decided
    if record.get("outcome") == "skipped":
        holder = str(record["duplicate"].get("holder"))
        return Verdict(ran=False, holder=holder, state=f'job.meta["{META_KEY}"]')
    return Verdict(ran=True, fence=record.get("fence"))


def at_once(submit: Callable[[], Any], times: int) -> list[Any]:
    """Call ``submit`` from ``times`` threads released together by a barrier."""
    barrier = threading.Barrier(times)

    def call() -> Any:
        barrier.wait(10)
        return submit()

    with ThreadPoolExecutor(times) as pool:
        futures = [pool.submit(call) for _ in range(times)]
        return [future.result() for future in futures]


def check_runs(
    label: str, runs: Sequence[dict[str, Any]], verdicts: Sequence[Verdict]
) -> list[int]:
    """DemoError on any broken promise; the fence tokens in the order they were handed out."""
    ran = sum(1 for verdict in verdicts if verdict.ran)
    if ran != len(runs):
        raise DemoError(
            f"{label}: {ran} submissions say they ran but {len(runs)} runs were recorded"
        )
    if not runs:
        raise DemoError(f"{label}: nothing ran at all")
    fences = [run["fence"] for run in runs]
    if None in fences or len(set(fences)) != len(fences):
        raise DemoError(f"{label}: fence tokens are missing or repeated: {fences}")
    by_item: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        by_item[run["item"]].append(run)
    for item, item_runs in by_item.items():
        item_runs.sort(key=lambda run: run["start"])
        for before, after in itertools.pairwise(item_runs):
            if after["start"] < before["end"]:
                raise DemoError(
                    f"{label}({item}): two runs overlapped "
                    f"(fence {before['fence']} and fence {after['fence']})"
                )
            if after["fence"] <= before["fence"]:
                raise DemoError(
                    f"{label}({item}): fence {after['fence']} ran after fence "
                    f"{before['fence']}: tokens must increase"
                )
    rejected = [run["fence"] for run in runs if not run["accepted"]]
    if rejected:
        raise DemoError(f"{label}: fenced writes with tokens {rejected} were rejected as stale")
    return sorted(fences)


def peak(runs: Sequence[dict[str, Any]]) -> int:
    """The most runs that were going at one instant (one ending as another begins: not both)."""
    events = sorted([(run["start"], 1) for run in runs] + [(run["end"], -1) for run in runs])
    going = most = 0
    for _, step in events:
        going += step
        most = max(most, going)
    return most


def check_limited_runs(
    label: str, runs: Sequence[dict[str, Any]], verdicts: Sequence[Verdict], limit: int
) -> int:
    """DemoError unless every submission ran and never more than ``limit`` at once; the most
    that ran at once."""
    if not all(verdict.ran for verdict in verdicts) or len(runs) != len(verdicts):
        raise DemoError(
            f"{label}: {len(verdicts)} submissions, {len(runs)} runs: with on_duplicate='wait' "
            "every one must run"
        )
    most = peak(runs)
    if most > limit:
        raise DemoError(f"{label}: {most} runs at once, but limit={limit}")
    return most


def most_in_a_second(starts: Sequence[float]) -> int:
    """The most ``starts`` in any rolling second ``[t, t + 1)``."""
    ordered = sorted(starts)
    return max(
        (bisect.bisect_left(ordered, start + 1.0) - i for i, start in enumerate(ordered)),
        default=0,
    )


def check_rate_runs(
    label: str,
    runs: Sequence[dict[str, Any]],
    verdicts: dict[str, Verdict],
    per_second: int,
) -> int:
    """DemoError unless every submission (``verdicts`` by task/job id) ran exactly once, the runs
    started never more than ``per_second`` in any rolling second (one more is the window's edge:
    starts ``1 / per_second`` apart, a window can hold both ends), over about
    ``(n - 1) / per_second`` s (each call waited for its own slot: not all at once, and no backoff
    tail), and no re-sent run started before its slot (``run["slot"]``, where known). Returns the
    most starts in a rolling second."""
    times = Counter(run.get("call") for run in runs)
    wrong = {call: times[call] for call in set(verdicts) | set(times) if times[call] != 1}
    if wrong or not all(verdict.ran for verdict in verdicts.values()):
        runs_of = ", ".join(f"{str(call)[:8]} ran {count}x" for call, count in wrong.items())
        raise DemoError(
            f"{label}: {len(verdicts)} submissions, {len(runs)} runs; each must run exactly once"
            + (f" ({runs_of})" if runs_of else "")
        )
    starts = sorted(run["start"] for run in runs)
    most = most_in_a_second(starts)
    if most > per_second + 1:
        raise DemoError(f"{label}: {most} runs started within one second, but rate={per_second}/s")
    spread, expected = starts[-1] - starts[0], (len(starts) - 1) / per_second
    if not expected * 0.9 <= spread <= expected + RATE_SPREAD_SLACK:
        raise DemoError(
            f"{label}: {len(starts)} runs started over {spread:.2f} s; at {per_second}/s, each "
            f"call waiting for its own slot, they take about {expected:.2f} s"
        )
    early = max((run["slot"] - run["start"] for run in runs if run.get("slot")), default=0.0)
    if early > RATE_EARLY:
        raise DemoError(f"{label}: a run started {early:.2f} s before its slot")
    return most
