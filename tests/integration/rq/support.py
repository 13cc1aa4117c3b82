"""Real RQ workers for the tests: an in-process SimpleWorker, and `rq worker` subprocesses.

Subprocess workers start in their own session: a work horse calls ``setpgrp()`` (its own process
group) but stays in the session, and so does the scheduler process, so killing the session's
processes tears down everything a worker started and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from rq import Queue, SimpleWorker
from rq.job import Job, JobStatus
from rq.scheduler import RQScheduler
from rq.timeouts import TimerDeathPenalty
from rq.worker import Worker

import tasklock
from tests.support.polling import eventually

ROOT = Path(__file__).resolve().parents[3]
RQ_CLI = str(Path(sys.executable).with_name("rq"))
QUEUE = "tasklock-test"
READY_DEADLINE = 20.0


class InProcessWorker(SimpleWorker):
    """RQ's SimpleWorker, running jobs exactly as it does, with two test-process adjustments:

    * the job timeout is a timer thread, not SIGALRM: pytest-timeout owns SIGALRM in the test
      process (the SIGALRM path is tested in the forking workers);
    * no pub/sub command channel (stop-job / kill-horse commands, unused here): tearing its thread
      down costs a one-second join per burst.
    """

    death_penalty_class = TimerDeathPenalty

    def subscribe(self) -> None:
        pass

    def unsubscribe(self) -> None:
        pass


def drain(queue: Queue, **kwargs: object) -> bool:
    """Run every job in ``queue`` in this process (burst mode)."""
    worker = InProcessWorker([queue], connection=queue.connection)
    return bool(worker.work(burst=True, **kwargs))  # type: ignore[arg-type]


def status(job: Job) -> JobStatus:
    return job.get_status(refresh=True)


def wait_status(job: Job, *statuses: JobStatus, timeout: float = 20.0) -> JobStatus:
    """Poll the job until it reaches one of ``statuses`` (deadline ``timeout``)."""
    return eventually(
        lambda: (s := status(job)) in statuses and s,
        timeout=timeout,
        interval=0.02,
        what=f"job {job.id} ({job.func_name}) reaching {[s.value for s in statuses]}",
    )


@dataclass
class WorkerProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def kill_session(session_id: int) -> None:
    """SIGKILL every process of the session (the worker, its work horse, its scheduler)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if os.getsid(pid) == session_id:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


@contextlib.contextmanager
def rq_workers(
    url: str,
    count: int,
    log_dir: Path,
    *,
    queue: str = QUEUE,
    scheduler: bool = False,
) -> Iterator[list[WorkerProcess]]:
    """``count`` forking `rq worker` processes on ``queue``, ready when they are registered (and,
    with ``scheduler``, when a scheduler holds the queue); all killed afterwards."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    workers: list[WorkerProcess] = []
    client = redis.Redis.from_url(url)
    try:
        for index in range(count):
            name = f"tasklock-{uuid.uuid4().hex[:8]}-{index}"
            log_path = log_dir / f"{name}.log"
            args = [RQ_CLI, "worker", "--url", url, "--name", name, queue]
            if scheduler:
                args.insert(2, "--with-scheduler")
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            workers.append(WorkerProcess(name, process, log_path))

        def ready() -> bool:
            for worker in workers:
                if worker.process.poll() is not None:
                    raise AssertionError(f"rq worker {worker.name} exited:\n{worker.log()}")
            registered = {w.name for w in Worker.all(connection=client)}
            return all(w.name in registered for w in workers)

        eventually(ready, timeout=READY_DEADLINE, interval=0.05, what="rq workers registered")
        if scheduler:
            eventually(
                lambda: client.exists(RQScheduler.get_locking_key(queue)),
                timeout=READY_DEADLINE,
                interval=0.05,
                what=f"an RQ scheduler holding queue {queue!r}",
            )
        yield workers
    finally:
        for worker in workers:
            kill_session(worker.process.pid)
        for worker in workers:
            worker.process.wait(10)
        client.close()


def hold(
    client: redis.Redis,
    func: object,
    *args: object,
    ttl: float = 30,
    task: str | None = None,
    **kwargs: object,
) -> tasklock.Lock:
    """Take ``func``'s lock for this call from the test process, as a running twin would.

    ``task`` names the job the hold stands for (a worker records the job id there), as if that
    job were running; without it the holder is no job at all."""
    guard = func.tasklock.guard  # type: ignore[attr-defined]
    owner: dict[str, str] = {"name": "test-holder"}
    if task is not None:
        owner["task"] = task
    lock = tasklock.Lock(
        client,
        guard.lock_key(args, kwargs),
        timeout=ttl,
        watchdog=True,
        fence_key=guard.fence_key,
        owner_info=owner,
        thread_local=False,  # the test may release it from another thread
    )
    assert lock.acquire(blocking=False), "the lock was already taken"
    return lock
