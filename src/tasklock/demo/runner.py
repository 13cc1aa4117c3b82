"""``tasklock demo``: real workers, bursts of duplicate work, and what tasklock made of them.

Steps: a Redis (an embedded redis-server unless ``--url``), a Celery worker with a prefork pool
and forking RQ workers as subprocesses (the first also runs RQ's scheduler), then the scenes:

1. Celery: bursts of duplicate ``settle`` calls, skipped while their twin runs; fence tokens;
2. RQ: the same with RQ jobs;
3. ``dedupe_enqueue``: ten concurrent submissions of one call give one task / job id;
4. ``limit=2`` (exports two at a time) and ``dedupe_enqueue="until_start"``;
5. ``rate="5/s"`` with ``limit=None``: ten notifications submitted at once get slots 0.2 s apart
   and start at them (Celery re-sends a call for its slot; an RQ work horse sleeps until a slot
   under 1 s away, and a job with a slot further away is rescheduled, for RQ's scheduler).

Each outcome is printed and checked; a broken promise is a one-line error and exit status 1.
Everything the demo started is stopped and its temp dir removed, on success, failure or Ctrl-C;
with ``--url``, the keys it wrote are deleted (they all carry the run's namespace).

Each burst has one worker more than accounts: a duplicate is skipped only when a free worker picks
it up while its twin runs. With every worker busy on a first run, duplicates would wait in the
queue and run afterwards, one at a time - correct, but not what the demo wants to show.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import redis

from tasklock.demo import ledger, workers
from tasklock.demo.processes import DemoError, Process, stop_all
from tasklock.demo.scenario import (
    Verdict,
    at_once,
    celery_verdict,
    check_limited_runs,
    check_rate_runs,
    check_runs,
    rq_verdict,
)
from tasklock.demo.server import EmbeddedRedis
from tasklock.ops.doctor import redact_url

__all__ = ["main", "run"]

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


def main(args: Any) -> int:
    """Entry point for ``tasklock demo``; ``args.url`` is None unless ``--url`` was given."""
    try:
        with _signals_interrupt():
            run(getattr(args, "url", None), sys.stdout)
    except DemoError as exc:
        _error(str(exc))
        return 1
    except KeyboardInterrupt:
        _error("interrupted: stopped everything the demo started")
        return 130
    except BrokenPipeError:
        raise  # the reader went away (`| head`): tasklock.cli ends quietly
    except Exception as exc:
        _error(f"demo failed: {type(exc).__name__}: {exc}")
        return 1
    return 0


def _error(message: str) -> None:
    print(f"tasklock: error: {' '.join(message.split())}", file=sys.stderr, flush=True)


def run(url: str | None, out: TextIO) -> None:
    """Run the demo, printing to ``out``; DemoError when a step fails or a check does not hold."""
    cleanup = ExitStack()
    try:
        Demo(url, out, cleanup).run()
    finally:
        with _interrupts_ignored():  # a second Ctrl-C must not leave processes behind
            cleanup.close()
    stopped = "the workers and the demo's Redis" if url is None else "the workers, deleted the keys"
    print(f"Stopped {stopped}, removed the temp files.", file=out)


# --- signals ------------------------------------------------------------------------------------


#: Set by any interrupting signal. Python swallows an exception raised inside ``__del__`` (a
#: Ctrl-C that lands while Celery's AsyncResult is being collected, say), so the demo also checks
#: this flag at every step and every poll.
_interrupted = threading.Event()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    _interrupted.set()
    raise KeyboardInterrupt


def check_interrupted() -> None:
    """Raise KeyboardInterrupt if a signal came in, even one whose exception was swallowed."""
    if _interrupted.is_set():
        raise KeyboardInterrupt


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stop_signals_handled_by(handler: Any) -> Iterator[None]:
    """Install ``handler`` for SIGINT, SIGTERM and SIGHUP for the block; restore them after."""
    previous: dict[signal.Signals, Any] = {}
    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        for signum in _STOP_SIGNALS:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _quiet_swallowed_interrupts(unraisable: Any) -> None:
    """``sys.unraisablehook`` while the demo runs: an interrupt raised inside a ``__del__`` is
    remembered in ``_interrupted`` and acted on, so Python's "Exception ignored in ..." traceback
    for it is noise on the user's terminal; anything else is reported as usual."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(unraisable)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP interrupt (and are remembered), so that cleanup runs."""
    _interrupted.clear()
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _quiet_swallowed_interrupts
    try:
        with _stop_signals_handled_by(_interrupt):
            yield
    finally:
        sys.unraisablehook = previous_hook


def _interrupts_ignored() -> contextlib.AbstractContextManager[None]:
    """During cleanup: a second Ctrl-C must not leave processes behind."""
    return _stop_signals_handled_by(signal.SIG_IGN)


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """This process sees the workers' environment while the demo runs (tasklock reads it)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# --- the demo -----------------------------------------------------------------------------------


class Demo:
    """One run: what it started is registered on ``cleanup`` as soon as it exists."""

    def __init__(self, url: str | None, out: TextIO, cleanup: ExitStack) -> None:
        self.given_url = url
        self.out = out
        self.cleanup = cleanup
        self.namespace = f"tasklock-demo-{secrets.token_hex(3)}"
        self.rq_job_ids: list[str] = []
        self.rq_locks_before: set[bytes] = set()

    def say(self, text: str = "") -> None:
        check_interrupted()
        print(text, file=self.out, flush=True)

    # -- setup ----------------------------------------------------------------------------------
    def run(self) -> None:
        began = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix="tasklock-demo-"))
        self.cleanup.callback(shutil.rmtree, tmp, ignore_errors=True)
        url, where = self._redis(tmp)
        env = workers.demo_environ(url, self.namespace, os.environ)
        started = [
            workers.start_celery_worker(self.namespace, env, tmp),
            *workers.start_rq_workers(url, self.namespace, env, tmp),
        ]
        self.cleanup.callback(stop_all, started, 10.0)
        self.cleanup.enter_context(_environ(env))
        self.processes: list[Process] = started

        # Imported only now: they read TASKLOCK_URL / TASKLOCK_KEY_PREFIX at import, like workers.
        from rq import Queue

        from tasklock.demo import celery_tasks, rq_jobs

        self.celery_tasks: Any = celery_tasks
        self.rq_jobs: Any = rq_jobs
        self.redis = redis.Redis.from_url(url)
        self.cleanup.callback(self.redis.close)
        self.queue = Queue(self.namespace, connection=self.redis)
        workers.wait_until(
            workers.celery_ready(celery_tasks.app, self.namespace), started, "the Celery worker"
        )
        workers.wait_until(workers.rq_ready(self.queue), started, "the RQ workers")

        self.say("tasklock demo")
        self.say(f"  Redis    {where}")
        self.say(
            f"  Workers  1 Celery worker (prefork, {workers.CELERY_CONCURRENCY} processes), "
            f"{workers.RQ_WORKERS} RQ workers (forking); ready in {time.monotonic() - began:.1f} s"
        )
        celery_fences = self.celery_burst()
        rq_fences = self.rq_burst()
        self.dedupe_bursts()
        self.limits_scene()
        self.rate_scene()
        self.say()
        self.say(
            "Checked: every submission ran or was skipped (none lost); no two runs of one call "
            f"overlapped\n(exports: never more than {EXPORT_LIMIT}; notifications: each ran once, "
            f"not before its slot, at most {NOTIFY_RATE} starts\na second, +1 at a window's edge); "
            "every fenced write was accepted; fence tokens only went up:\n"
            f"   Celery settle {_chain(celery_fences)}\n   RQ     settle {_chain(rq_fences)}"
        )
        self.say(f"Done in {time.monotonic() - began:.1f} s.")

    def _redis(self, tmp: Path) -> tuple[str, str]:
        if self.given_url is None:
            server = EmbeddedRedis(tmp)
            self.cleanup.callback(server.stop)
            server.start()
            where = (
                f"redis-server {server.version} ({server.origin}) on 127.0.0.1:{server.port}, "
                "started for this demo"
            )
            return server.url, where
        url = self.given_url
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        try:
            client.ping()
        except redis.exceptions.RedisError as exc:
            raise DemoError(f"cannot use --url {redact_url(url)}: {exc}") from exc
        # RQ's workers take global maintenance locks (rq:clean_*, with a TTL); delete at the end
        # only those that did not exist before this run.
        self.rq_locks_before = set(client.scan_iter(match="rq:clean_*", count=500))
        self.cleanup.callback(self._delete_keys, client)
        return url, f"{redact_url(url)} (--url); keys under {self.namespace!r}, deleted at the end"

    def _delete_keys(self, client: redis.Redis) -> None:
        """With --url: remove what this run wrote (its namespace, its RQ queue, jobs, workers)."""
        doomed = list(client.scan_iter(match=f"{self.namespace}*", count=500))
        ours = (self.namespace, *self.rq_job_ids)
        for key in client.scan_iter(match="rq:*", count=500):
            names_ours = any(mark in key.decode(errors="replace") for mark in ours)
            new_lock = key.startswith(b"rq:clean_") and key not in self.rq_locks_before
            if names_ours or new_lock:
                doomed.append(key)
        for start in range(0, len(doomed), 500):
            client.delete(*doomed[start : start + 500])
        for registry in ("rq:queues", "rq:workers"):
            members = [m for m in client.smembers(registry) if self.namespace.encode() in m]
            if members:
                client.srem(registry, *members)
        client.close()

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


def _chain(fences: Sequence[int]) -> str:
    return " < ".join(map(str, fences))
