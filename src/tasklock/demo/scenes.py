"""The scenes of ``tasklock demo``: what is submitted, what is waited for, what is printed and
checked. Each scene runs against workers and a Redis that :mod:`tasklock.demo.runner` started.

Each burst has one worker more than accounts: a duplicate is skipped only when a free worker picks
it up while its twin runs. With every worker busy on a first run, duplicates would wait in the
queue and run afterwards, one at a time - correct, but not what the demo wants to show.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

import redis

from tasklock.demo import ledger, workers
from tasklock.demo.processes import DemoError, Process
from tasklock.demo.scenario import (
    Verdict,
    at_once,
    celery_verdict,
    check_limited_runs,
    check_rate_runs,
    check_runs,
    rq_verdict,
)
from tasklock.demo.signals import check_interrupted

__all__ = ["EXPORT_LIMIT", "NOTIFY_RATE", "Scenes", "chain"]

ACCOUNTS = (101, 102, 103)
REPEATS = 10
REPORT_ID = 7
RESULT_DEADLINE = 30.0
#: The fourth scene: exports of one tenant, two at a time; refreshes of one report.
TENANT_ID = 9
EXPORTS = 4
EXPORT_LIMIT = 2
REFRESH_ID = 8
#: The fifth scene: notifications of one tenant (rate=ledger.NOTIFY_PER_SECOND), all at once.
NOTIFY_RATE = ledger.NOTIFY_PER_SECOND
NOTIFIES = 10


class Scenes:
    """The scenes of one run, over its Redis, queue and workers. ``rq_job_ids`` is the run's own
    list: every RQ job id a scene makes is added to it, for the cleanup to delete with --url."""

    def __init__(
        self,
        out: TextIO,
        namespace: str,
        client: redis.Redis,
        queue: Any,
        processes: list[Process],
        frameworks: tuple[Any, Any],
        rq_job_ids: list[str],
    ) -> None:
        self.out = out
        self.namespace = namespace
        self.redis = client
        self.queue = queue
        self.processes = processes
        self.celery_tasks, self.rq_jobs = frameworks
        self.rq_job_ids = rq_job_ids

    def say(self, text: str = "") -> None:
        check_interrupted()
        print(text, file=self.out, flush=True)

    # -- waiting --------------------------------------------------------------------------------
    def _wait(
        self,
        handles: Iterable[str],
        verdicts_of: Callable[[list[str]], dict[str, Verdict]],
        what: str,
    ) -> dict[str, Verdict]:
        """Poll until every submission has a verdict; ``verdicts_of`` judges the pending ones."""
        pending = list(handles)
        verdicts: dict[str, Verdict] = {}

        def all_done() -> bool:
            check_interrupted()
            verdicts.update(verdicts_of([h for h in pending if h not in verdicts]))
            return len(verdicts) == len(pending)

        workers.wait_until(all_done, self.processes, what, RESULT_DEADLINE)
        return verdicts

    def _celery_verdicts(self, call: str) -> Callable[[list[str]], dict[str, Verdict]]:
        from celery.result import AsyncResult

        app = self.celery_tasks.app

        def judge(task_ids: list[str]) -> dict[str, Verdict]:
            found = {i: celery_verdict(AsyncResult(i, app=app), call) for i in task_ids}
            return {i: verdict for i, verdict in found.items() if verdict is not None}

        return judge

    def _rq_verdicts(self, call: str) -> Callable[[list[str]], dict[str, Verdict]]:
        from rq.job import Job

        def judge(job_ids: list[str]) -> dict[str, Verdict]:
            jobs = Job.fetch_many(job_ids, connection=self.redis)  # one round trip
            found = {job.id: rq_verdict(job, call) for job in jobs if job is not None}
            return {i: verdict for i, verdict in found.items() if verdict is not None}

        return judge

    def _runs(self, runner: str, task: str) -> list[dict[str, Any]]:
        return [
            run
            for run in ledger.read_runs(self.redis, self.namespace)
            if run["runner"] == runner and run["task"] == task
        ]

    # -- bursts ---------------------------------------------------------------------------------
    def celery_burst(self) -> list[int]:
        settle = self.celery_tasks.settle
        self.say()
        self.say(
            f"1. Celery: settle.delay(account_id), {REPEATS} times for each of accounts "
            f"{_accounts()}, at once"
        )
        t0 = time.time()
        sent = [(settle.delay(account), account) for _ in range(REPEATS) for account in ACCOUNTS]
        accounts = {result.id: account for result, account in sent}
        verdicts = self._wait(accounts, self._celery_verdicts("settle"), "the Celery tasks")
        runs = self._runs("celery", "settle")
        self._report(runs, verdicts, accounts, t0)
        return check_runs("Celery settle", runs, list(verdicts.values()))

    def rq_burst(self) -> list[int]:
        settle = self.rq_jobs.settle
        self.say()
        self.say(
            f"2. RQ: queue.enqueue(settle, account_id), {REPEATS} times for each of accounts "
            f"{_accounts()}, at once"
        )
        t0 = time.time()
        jobs = [self.queue.enqueue(settle, account) for _ in range(REPEATS) for account in ACCOUNTS]
        self.rq_job_ids += [job.id for job in jobs]
        accounts = {job.id: job.args[0] for job in jobs}
        verdicts = self._wait(accounts, self._rq_verdicts("settle"), "the RQ jobs")
        runs = self._runs("rq", "settle")
        self._report(runs, verdicts, accounts, t0)
        return check_runs("RQ settle", runs, list(verdicts.values()))

    def _report(
        self,
        runs: Sequence[dict[str, Any]],
        verdicts: dict[str, Verdict],
        accounts: dict[str, int],
        t0: float,
    ) -> None:
        for run in sorted(runs, key=lambda run: run["fence"]):
            self.say(
                f"   ran      settle({run['item']})  fence {run['fence']}  "
                f"pid {run['pid']:<6} {run['start'] - t0:4.2f}-{run['end'] - t0:.2f} s  "
                f"write {'accepted' if run['accepted'] else 'REJECTED'}"
            )
        skipped = [(h, v) for h, v in verdicts.items() if not v.ran]
        if skipped:
            handle, example = skipped[0]
            self.say(
                f"   skipped  {len(skipped)} duplicates ({example.state}), e.g. "
                f"settle({accounts[handle]}): held by {_holder(example.holder)}"
            )
        ran = Counter(accounts[h] for h, v in verdicts.items() if v.ran)
        skips = Counter(accounts[h] for h, v in verdicts.items() if not v.ran)
        self.say(
            "   per account: "
            + " | ".join(f"{a} ran {ran[a]}, skipped {skips[a]}" for a in ACCOUNTS)
        )
        if any(count > 1 for count in ran.values()):
            self.say(
                "   (a duplicate that reached a worker after its twin had finished ran again, "
                "one at a time:\n    skip drops only the calls that overlap a running one)"
            )

    def dedupe_bursts(self) -> None:
        celery_task = self.celery_tasks.rebuild_report
        rq_job = self.rq_jobs.rebuild_report
        self.say()
        self.say(
            f"3. dedupe_enqueue: rebuild_report({REPORT_ID}) submitted from 10 threads at once"
        )
        first = {
            "celery": {r.id for r in at_once(lambda: celery_task.delay(REPORT_ID), 10)},
            "rq": {j.id for j in at_once(lambda: rq_job.enqueue(self.queue, REPORT_ID), 10)},
        }
        self.rq_job_ids += first["rq"]
        for runner, ids in first.items():
            if len(ids) != 1:
                raise DemoError(f"{runner}: 10 duplicate submissions gave {len(ids)} ids, not 1")
        verdicts = self._wait_rebuild(first)
        # It finished, so its marker is gone: the next submission is new work with a new id.
        again = {
            "celery": {celery_task.delay(REPORT_ID).id},
            "rq": {rq_job.enqueue(self.queue, REPORT_ID).id},
        }
        self.rq_job_ids += again["rq"]
        for runner, more in self._wait_rebuild(again).items():
            verdicts[runner] += more
        fences = {}
        for runner in ("celery", "rq"):
            if again[runner] & first[runner]:
                raise DemoError(f"{runner}: a submission after the first finished got its old id")
            runs = self._runs(runner, "rebuild_report")
            label = f"{'Celery' if runner == 'celery' else 'RQ'} rebuild_report"
            fences[runner] = check_runs(label, runs, verdicts[runner])
            if len(runs) != 2:
                raise DemoError(f"{label} ran {len(runs)} times, expected 2")
        for runner, call, kind in (
            ("celery", f".delay({REPORT_ID})", "task"),
            ("rq", f".enqueue(queue, {REPORT_ID})", "job"),
        ):
            name = "Celery" if runner == "celery" else "RQ"
            self.say(
                f"   {name:<7} 10 x {call:<20} -> 1 {kind} id {_short(*first[runner])}, ran once "
                f"(fence {fences[runner][0]})"
            )
        celery_again, rq_again = _short(*again["celery"]), _short(*again["rq"])
        self.say(
            f"   Submitted again after it finished: a new task ({celery_again}, fence "
            f"{fences['celery'][1]}) and a new job ({rq_again}, fence {fences['rq'][1]})"
        )

    def limits_scene(self) -> None:
        """``limit=2``: four exports of one tenant, two at a time. ``dedupe_enqueue=
        "until_start"``: ten submissions while a refresh runs queue exactly one more run."""
        self.say()
        self.say(f'4. limit={EXPORT_LIMIT} and dedupe_enqueue="until_start"')
        celery_export, rq_export = self.celery_tasks.export, self.rq_jobs.export
        exports = {
            "celery": [celery_export.delay(TENANT_ID).id for _ in range(EXPORTS)],
            "rq": [self.queue.enqueue(rq_export, TENANT_ID).id for _ in range(EXPORTS)],
        }
        self.rq_job_ids += exports["rq"]
        call = f"export({TENANT_ID})"
        waited = {
            "celery": self._wait(exports["celery"], self._celery_verdicts(call), call),
            "rq": self._wait(exports["rq"], self._rq_verdicts(call), call),
        }
        for runner in ("celery", "rq"):
            name = "Celery" if runner == "celery" else "RQ"
            runs = sorted(self._runs(runner, "export"), key=lambda run: run["start"])
            most = check_limited_runs(
                f"{name} {call}", runs, list(waited[runner].values()), EXPORT_LIMIT
            )
            t0 = runs[0]["start"]
            spans = ", ".join(f"{r['start'] - t0:.2f}-{r['end'] - t0:.2f}" for r in runs)
            self.say(
                f"   {name:<7} {EXPORTS} x {call}, limit={EXPORT_LIMIT:<8} -> {len(runs)} ran, "
                f"at most {most} at once: {spans} s"
            )
        self.coalescing()

    def coalescing(self) -> None:
        celery_refresh, rq_refresh = self.celery_tasks.refresh, self.rq_jobs.refresh
        first = {
            "celery": celery_refresh.delay(REFRESH_ID).id,
            "rq": rq_refresh.enqueue(self.queue, REFRESH_ID).id,
        }
        self.rq_job_ids.append(first["rq"])

        def both_running() -> bool:
            check_interrupted()
            began = {
                s["runner"]
                for s in ledger.read_starts(self.redis, self.namespace)
                if s["task"] == "refresh"
            }
            return began == {"celery", "rq"}

        workers.wait_until(both_running, self.processes, "the first refreshes", RESULT_DEADLINE)
        burst = {
            "celery": [r.id for r in at_once(lambda: celery_refresh.delay(REFRESH_ID), 10)],
            "rq": [j.id for j in at_once(lambda: rq_refresh.enqueue(self.queue, REFRESH_ID), 10)],
        }
        self.rq_job_ids += burst["rq"]
        call = f"refresh({REFRESH_ID})"
        for runner, ids in burst.items():
            if len(set(ids)) != 1 or first[runner] in ids:
                raise DemoError(
                    f"{runner}: 10 submissions during a run of {call} gave {len(set(ids))} new "
                    "ids, not 1"
                )
        for runner, call_text, kind in (
            ("celery", f".delay({REFRESH_ID})", "task"),
            ("rq", f".enqueue(queue, {REFRESH_ID})", "job"),
        ):
            name = "Celery" if runner == "celery" else "RQ"
            judge = self._celery_verdicts(call) if runner == "celery" else self._rq_verdicts(call)
            verdicts = self._wait([first[runner], burst[runner][0]], judge, call)
            runs = sorted(self._runs(runner, "refresh"), key=lambda run: run["start"])
            check_runs(f"{name} {call}", runs, list(verdicts.values()))
            if len(runs) != 2:
                raise DemoError(f"{name} {call} ran {len(runs)} times, expected 2")
            t0 = runs[0]["start"]
            self.say(
                f"   {name:<7} 10 x {call_text:<20} while {call} runs -> 1 more {kind} "
                f"({_short(burst[runner][0])}), the other 9 got its handle; it ran after the "
                f"first: {runs[0]['start'] - t0:.2f}-{runs[0]['end'] - t0:.2f} s, then "
                f"{runs[1]['start'] - t0:.2f}-{runs[1]['end'] - t0:.2f} s"
            )

    def rate_scene(self) -> None:
        """``rate="5/s"`` with ``limit=None``: ten notifications of one tenant, submitted at
        once, start at their slots 0.2 s apart. Celery re-sends each call to arrive at its slot;
        an RQ job whose slot is under 1 s away sleeps for it in the work horse (further away, it
        is rescheduled, which takes RQ's scheduler)."""
        self.say()
        call = f"notify({TENANT_ID})"
        self.say(
            f'5. rate="{NOTIFY_RATE}/s" per tenant, limit=None: {call} submitted {NOTIFIES} '
            'times at once (on_rate_limit="retry")'
        )
        celery_notify, rq_notify = self.celery_tasks.notify, self.rq_jobs.notify
        sent = {
            "celery": [celery_notify.delay(TENANT_ID).id for _ in range(NOTIFIES)],
            "rq": [self.queue.enqueue(rq_notify, TENANT_ID).id for _ in range(NOTIFIES)],
        }
        self.rq_job_ids += sent["rq"]
        waited = {
            "celery": self._wait(sent["celery"], self._celery_verdicts(call), call),
            "rq": self._wait(sent["rq"], self._rq_verdicts(call), call),
        }
        for runner, call_text in (
            ("celery", f".delay({TENANT_ID})"),
            ("rq", f".enqueue(queue, {TENANT_ID})"),
        ):
            name = "Celery" if runner == "celery" else "RQ"
            runs = sorted(self._runs(runner, "notify"), key=lambda run: run["start"])
            most = check_rate_runs(f"{name} {call}", runs, waited[runner], NOTIFY_RATE)
            t0 = runs[0]["start"]
            starts = " ".join(f"{run['start'] - t0:.2f}" for run in runs)
            self.say(
                f"   {name:<7} {NOTIFIES} x {call_text:<20} -> {len(runs)} ran, each once, "
                f"starting at {starts} s"
            )
            resent = sum(1 for run in runs if run["resent"])
            were = "was" if resent == 1 else "were"
            if runner == "celery":
                how = (
                    f"{resent} {were} re-sent to arrive at their slot, holding no worker meanwhile"
                )
            elif resent:
                how = f"{resent} {were} rescheduled (slot over 1 s away), the rest slept in a horse"
            else:
                how = "every slot was under 1 s away, so the work horse slept until it"
            self.say(f"{'':<11}{how}; at most {most} started in any one second")

    def _wait_rebuild(self, ids: dict[str, set[str]]) -> dict[str, list[Verdict]]:
        call = f"rebuild_report({REPORT_ID})"
        return {
            "celery": list(self._wait(ids["celery"], self._celery_verdicts(call), call).values()),
            "rq": list(self._wait(ids["rq"], self._rq_verdicts(call), call).values()),
        }


def _accounts() -> str:
    return ", ".join(map(str, ACCOUNTS))


def _short(task_id: str) -> str:
    return task_id[:8]


def _holder(holder: str | None) -> str:
    """``pid 123 (fence 4)`` from tasklock's ``host=... pid=123 task=... fence=4`` holder text."""
    fields = dict(part.split("=", 1) for part in (holder or "").split() if "=" in part)
    if "pid" not in fields:
        return holder or "unknown"
    fence = f" (fence {fields['fence']})" if "fence" in fields else ""
    return f"pid {fields['pid']}{fence}"


def chain(fences: Sequence[int]) -> str:
    return " < ".join(map(str, fences))
